"""How a training process learns that its node is going away.

Two sources, because either can be missing on a given rank:

* **SIGTERM.** The spotd agent sends it to the job's process group when a
  preemption notice arrives; ``torchrun`` forwards it to its workers (which run in
  sessions of their own, so only the forwarding reaches them). A rank may get it
  alone, late, or not at all. :class:`SignalFlag` records it in a handler that does
  nothing else, so no step is left half done.
* **The notice file** (``SPOTD_NOTICE_FILE``). The agent writes it atomically
  *before* it signals, as JSON ``{"kind": "preemption", "deadline": "<iso UTC>" or
  null, "detail": "..."}``. Its presence alone is a stop request (whatever the
  ``kind``: the agent writes the file only when the node is going away), and its
  deadline tells how long the node has left. :func:`read_notice` parses it.

Neither is enough for a multi-rank job by itself: :class:`spotd.train.Run` turns
the local flag into a decision every rank shares.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from spotd.core.clock import WALL

__all__ = ["Notice", "SignalFlag", "read_notice"]

Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


@dataclass(frozen=True)
class Notice:
    """A preemption notice as the agent wrote it.

    ``deadline`` is the wall-clock UTC instant at which the node will be killed, or
    None when the provider did not say.
    """

    kind: str
    deadline: datetime | None
    detail: str

    def seconds_left(self, now: datetime | None = None) -> float | None:
        """Seconds from ``now`` (default: the wall clock's) to the deadline.

        None when the deadline is unknown; negative once it has passed.
        """
        if self.deadline is None:
            return None
        return (self.deadline - (now or WALL.now())).total_seconds()


def _parse_deadline(value: object) -> datetime | None:
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    # A deadline without an offset is taken as UTC, which is what the contract says.
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def read_notice(path: str | os.PathLike[str] | None) -> Notice | None:
    """Read the notice file at ``path``; None when no path is set or no file exists.

    A file that exists but cannot be parsed still counts as a notice (the agent only
    writes it when the node is going away), with an unknown deadline.
    """
    if path is None or not os.fspath(path):
        return None
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Notice(kind="unknown", deadline=None, detail=f"unreadable notice file: {exc}")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return Notice(kind="unknown", deadline=None, detail=f"unparsable notice file: {exc}")
    if not isinstance(data, dict):
        return Notice(kind="unknown", deadline=None, detail="notice file is not a JSON object")
    return Notice(
        kind=str(data.get("kind") or "unknown"),
        deadline=_parse_deadline(data.get("deadline")),
        detail=str(data.get("detail") or ""),
    )


class SignalFlag:
    """A flag set by SIGTERM (or other signals), with the previous handler kept.

    :meth:`install` only works from the main thread (Python allows signal handlers
    nowhere else); elsewhere it does nothing and returns False, and the notice file
    remains the only source. The previous handler is chained when it is a Python
    function (so a framework's own handler still runs) and put back by
    :meth:`restore`. SIG_DFL is not chained: it would kill the process before the
    emergency checkpoint.
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> None:
        self._signals = signals
        self._previous: dict[signal.Signals, Handler] = {}
        self.received: signal.Signals | None = None

    def install(self) -> bool:
        """Install the handler for every signal; return whether it was installed."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return False
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def restore(self) -> None:
        """Put the previous handlers back, where ours is still the one installed."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only record: the training loop acts on it at the next step boundary.
        sig = signal.Signals(signum)
        self.received = sig
        previous = self._previous.get(sig)
        if callable(previous):
            previous(signum, frame)
