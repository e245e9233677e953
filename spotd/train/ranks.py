"""This rank's own progress file, which the agent's hang watch reads (:mod:`spotd.core.ranks`).

Every rank writes one, beside ``SPOTD_PROGRESS_FILE``, named by its global rank::

    progress-rank-3.json   {"rank": 3, "step": 1200, "pid": 4242, "at": "..."}

The daemon compares the ranks' steps and the agent looks at each ``pid``: a gang
whose steps stop while its processes live is hung, and a rank whose process died
or stopped, or whose step is behind the others', is the suspect. For that the
file must hold the rank's *last* step, not one from a few seconds before: a rank
that blocks in a collective writes nothing more. So :meth:`RankFile.report` writes
at most every ``every_seconds`` and a background thread writes a step it held
back within ``every_seconds`` (the thread runs while the rank waits in a
collective, which releases the GIL). Each write replaces the file atomically
(temp file, rename) without an fsync: the agent reads it live, and a host
that crashes takes the agent along.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from pathlib import Path

from spotd.core.contracts import Clock
from spotd.core.ranks import rank_file_name
from spotd.train.log import RankLog

__all__ = ["RankFile", "rank_file_beside"]


def rank_file_beside(progress_file: str | os.PathLike[str] | None, rank: int) -> Path | None:
    """Where global rank ``rank`` keeps its file: in the folder of ``progress_file``
    (``SPOTD_PROGRESS_FILE``, the agent's run folder); None without one."""
    if progress_file is None or str(progress_file) == "":
        return None
    return Path(progress_file).with_name(rank_file_name(rank))


class RankFile:
    """One rank's progress file, kept up to date cheaply (see the module doc).

    ``path`` None: nothing is written (no agent to read it). Thread-safe; call
    :meth:`close` when the rank is done (it writes the last step and stops the thread).
    """

    def __init__(self, path: Path | None, rank: int, every_seconds: float, clock: Clock,
                 say: RankLog) -> None:  # fmt: skip
        self._path = path
        self._rank = rank
        self._every = every_seconds
        self._clock = clock
        self._say = say
        self._lock = threading.Lock()
        self._step: int | None = None
        self._written_step: int | None = None
        self._written_at: float | None = None
        self._failed = False
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def report(self, step: int) -> None:
        """The rank reached ``step``: written now if the last write is ``every_seconds``
        old, else by the background thread soon."""
        if self._path is None:
            return
        with self._lock:
            self._step = int(step)
            now = self._clock.monotonic()
            due = self._written_at is None or now - self._written_at >= self._every
        if due:
            self.flush()
        self._start_thread()

    def flush(self) -> None:
        """Write the last step reported, if the file does not hold it yet."""
        if self._path is None:
            return
        with self._lock:
            step = self._step
            if step is None or step == self._written_step:
                return
            self._written_step = step
            self._written_at = self._clock.monotonic()
            at = self._clock.now().isoformat(timespec="milliseconds")
            body = {"rank": self._rank, "step": step, "pid": os.getpid(), "at": at}
            self._write(json.dumps(body).encode() + b"\n")

    def close(self) -> None:
        """Write the last step and stop the thread. Idempotent."""
        self._closed.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        self.flush()

    def _start_thread(self) -> None:
        if self._thread is not None or self._closed.is_set():
            return
        self._thread = threading.Thread(target=self._keep_up, name="spotd-train-rank-file",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _keep_up(self) -> None:
        # Event.wait: a real pause between looks, not a reading of the time.
        while not self._closed.wait(self._every):
            self.flush()

    def _write(self, data: bytes) -> None:
        """Replace the file (under the lock): temp file, rename; one complaint at most."""
        assert self._path is not None
        tmp = self._path.with_name(f".{self._path.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            tmp.write_bytes(data)
            tmp.replace(self._path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if not self._failed:
                self._failed = True
                self._say(f"cannot write the rank's progress file {self._path}: {exc}")
