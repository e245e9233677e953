"""What several parts of the mail package share."""

from __future__ import annotations

from spotd.states import TERMINAL, JobStatus

# Not imported from the engine: the engine may call into this module.
ACTIVE = tuple(s for s in JobStatus if s not in TERMINAL)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
