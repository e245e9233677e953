"""The progress file the spotd agent reads (``SPOTD_PROGRESS_FILE``).

The job's global rank 0 writes it as JSON::

    {"step": 120, "total_steps": 600,
     "checkpoint": "s3://bucket/job/step-00000100", "at": "2026-12-01T20:31:05.123+00:00"}

``checkpoint`` is the last *complete* checkpoint (or null) and ``at`` the UTC time
of the write. The file is replaced atomically (temp file in the same folder, fsync,
``os.replace``), so the agent never reads half of it.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from spotd.files import write_atomic

__all__ = ["progress_payload", "write_progress"]


def progress_payload(
    step: int, total_steps: int | None, checkpoint: str | None, at: datetime | None = None
) -> dict[str, object]:
    """The JSON object of one progress report."""
    when = at or datetime.now(UTC)
    return {
        "step": int(step),
        "total_steps": None if total_steps is None else int(total_steps),
        "checkpoint": checkpoint,
        "at": when.astimezone(UTC).isoformat(timespec="milliseconds"),
    }


def write_progress(
    path: str | os.PathLike[str],
    step: int,
    total_steps: int | None,
    checkpoint: str | None,
    at: datetime | None = None,
) -> None:
    """Atomically replace the progress file at ``path`` with one report."""
    data = json.dumps(progress_payload(step, total_steps, checkpoint, at)).encode()
    write_atomic(Path(path), data + b"\n")
