"""Deprecated: moved to :mod:`spotd.core.contracts`; this re-export is kept for one release."""

from spotd.core.contracts import *  # noqa: F403
