"""Deprecated: moved to :mod:`spotd.core.values`; this re-export is kept for one release."""

from spotd.core.values import *  # noqa: F403
