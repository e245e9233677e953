"""Deprecated: moved to :mod:`spotd.core.values` (and :mod:`spotd.core.network`); this
re-export is kept for one release."""

from spotd.core.network import *  # noqa: F403
from spotd.core.values import *  # noqa: F403
