"""Acting on a signal outside its handler (the agent's, the daemon's).

A Python signal handler runs in the main thread, between two of its bytecodes,
possibly while that thread holds the lock of a ``threading.Event`` it waits on
(``Event.wait`` takes the event's own lock, which is not re-entrant). An
``Event.set()`` on that event from the handler would then wait for a lock its own
thread holds, forever: the process hangs after SIGTERM. So a handler only starts
a thread that does the work, and returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["after_handler"]


def after_handler(action: Callable[[], None]) -> None:
    """Run ``action`` on a thread of its own, at once: the signal handler that calls
    this returns, and the main thread goes on (releasing whatever lock it held)."""
    threading.Thread(target=action, name="spotd-agent-signal", daemon=True).start()
