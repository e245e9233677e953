"""Acting on a signal outside its handler (the agent's, the daemon's).

A Python signal handler runs in the main thread, between two of its bytecodes,
possibly while that thread holds the lock of a ``threading.Event`` it waits on
(``Event.wait`` takes the event's own lock, which is not re-entrant). An
``Event.set()`` on that event from the handler would then wait for a lock its own
thread holds, forever: the process hangs after SIGTERM. So a handler only starts
a thread that does the work, and returns.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["STOP_SIGNALS", "after_handler", "on_stop_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""What tells a process to stop: the node or the service manager going, Ctrl-C."""


def after_handler(action: Callable[[], None]) -> None:
    """Run ``action`` on a thread of its own, at once: the signal handler that calls
    this returns, and the main thread goes on (releasing whatever lock it held)."""
    threading.Thread(target=action, name="spotd-signal", daemon=True).start()


@contextmanager
def on_stop_signals(action: Callable[[signal.Signals], None]) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT run ``action`` with the signal, on a thread of its
    own (:func:`after_handler`); the previous handlers come back after. Only the main
    thread may install handlers; elsewhere (tests) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        del frame
        sig = signal.Signals(signum)
        after_handler(lambda: action(sig))

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)
