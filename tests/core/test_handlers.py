"""spotd.core.handlers: a signal handler never waits for a lock its own thread holds."""

from __future__ import annotations

import os
import signal
import threading

from spotd.core.handlers import after_handler, on_stop_signals


def test_setting_an_event_the_interrupted_thread_holds_returns_at_once() -> None:
    # A handler runs where the main thread stands: here, inside the event's own lock,
    # as Event.wait() is for an instant. Setting the event right there would wait for
    # that lock forever; after_handler returns, and the event is set once it is free.
    event = threading.Event()
    lock = event._cond  # type: ignore[attr-defined]  # the lock wait() and set() both take
    with lock:
        after_handler(event.set)  # returns: the set waits for the lock, not this thread
        set_meanwhile = event.is_set()  # reads the flag, takes no lock
    assert not set_meanwhile
    assert event.wait(5.0)  # set once the lock was free


def test_a_stop_signal_runs_the_action_off_the_handler_and_the_old_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    got: list[tuple[signal.Signals, str]] = []
    done = threading.Event()

    def action(sig: signal.Signals) -> None:
        got.append((sig, threading.current_thread().name))
        done.set()

    with on_stop_signals(action):
        os.kill(os.getpid(), signal.SIGTERM)
        assert done.wait(5.0)
    assert got == [(signal.SIGTERM, "spotd-signal")]
    assert signal.getsignal(signal.SIGTERM) is before
