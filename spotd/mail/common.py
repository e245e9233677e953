"""What several parts of the mail package share."""

from __future__ import annotations

# Not imported from the engine: the engine may call into this module.

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
