"""The daemon's API token: a random secret in a file only its owner can read."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def ensure_token(path: Path) -> str:
    """The API token in ``path``, created with mode 0600 on first use."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
    path.chmod(0o600)
    return path.read_text().strip()
