"""The progress file the spotd agent reads (``SPOTD_PROGRESS_FILE``).

The job's global rank 0 writes it as JSON::

    {"step": 120, "total_steps": 600,
     "checkpoint": "s3://bucket/job/step-00000100", "at": "2026-12-01T20:31:05.123+00:00"}

``checkpoint`` is the last *complete* checkpoint (or null) and ``at`` the UTC time
of the write. The file is replaced atomically (temp file in the same folder, fsync,
``os.replace``), so the agent never reads half of it. :class:`ProgressReporter`
decides when :class:`spotd.train.Run` rewrites it.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.files import write_atomic
from spotd.train.log import RankLog

__all__ = ["ProgressReporter", "progress_payload", "write_progress"]


def progress_payload(
    step: int, total_steps: int | None, checkpoint: str | None, at: datetime | None = None
) -> dict[str, object]:
    """The JSON object of one progress report, made ``at`` (default: the wall clock's now)."""
    when = at or WALL.now()
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


class ProgressReporter:
    """How far one run got, and when its progress file is rewritten.

    Only global rank 0 writes (pass ``path=None`` elsewhere); every rank keeps
    count. The file is rewritten at most every ``every_seconds`` by :meth:`report`,
    and at once when a checkpoint completes, at a resume and by :meth:`flush`.
    """

    def __init__(self, path: str | os.PathLike[str] | None, every_seconds: float,
                 clock: Clock, say: RankLog) -> None:  # fmt: skip
        self._path = path
        self._every = every_seconds
        self._clock = clock
        self._say = say
        self._step = 0
        self._total_steps: int | None = None
        self._checkpoint: str | None = None
        self._written_at: float | None = None
        self._written_checkpoint: str | None = None

    def report(self, step: int, total_steps: int | None, *, force: bool) -> None:
        """Training reached ``step`` (of ``total_steps``, when given)."""
        self._step = step
        if total_steps is not None:
            self._total_steps = total_steps
        self._write(force=force)

    def resumed(self, step: int, checkpoint: str | None) -> None:
        """Training starts at ``step``, from ``checkpoint`` (None: a fresh start)."""
        self._step = step
        self._checkpoint = checkpoint
        self._write(force=True)

    def checkpointed(self, step: int, checkpoint: str) -> None:
        """The checkpoint of ``step`` is complete."""
        self._checkpoint = checkpoint
        self._step = max(self._step, step)
        self._write(force=True)

    def flush(self) -> None:
        """Write the file now (at close)."""
        self._write(force=True)

    def _write(self, *, force: bool) -> None:
        if self._path is None:
            return
        now = self._clock.monotonic()
        stale = (
            self._written_at is None
            or now - self._written_at >= self._every
            or self._written_checkpoint != self._checkpoint
        )
        if not (force or stale):
            return
        try:
            write_progress(self._path, self._step, self._total_steps, self._checkpoint,
                           self._clock.now())  # fmt: skip
        except OSError as exc:
            self._say(f"cannot write progress file {self._path}: {exc}")
        self._written_at = now
        self._written_checkpoint = self._checkpoint
