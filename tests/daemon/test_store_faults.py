"""A store fault that fails pass after pass is logged once, and its end once, without a
traceback; any other failed pass keeps its traceback each time."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import fast_settings

from spotd.core.errors import StoreUnavailable
from spotd.daemon.process import Daemon

FULL = "the store is unavailable: database or disk is full"
LOGGER = "spotd.daemon.process"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon built but not started: its passes are run by hand."""
    built = Daemon(fast_settings(tmp_path / "spotd"))
    yield built
    built.coordinator.release()
    built.engine.store.close()


def _passes(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, outcomes: list[Exception | None]
) -> None:
    """Run one pass per outcome: the engine's tick raises it, or passes for None."""
    left = iter(outcomes)

    def tick() -> None:
        failure = next(left)
        if failure is not None:
            raise failure

    monkeypatch.setattr(daemon.engine, "tick", tick)
    for _ in outcomes:
        daemon._reconcile()


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, bool]]:
    return [(r.levelno, r.getMessage(), r.exc_info is not None)
            for r in caplog.records if r.name == LOGGER]  # fmt: skip


def test_a_repeated_store_fault_is_logged_once_and_its_end_once(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    full = [StoreUnavailable(FULL, cause="database or disk is full") for _ in range(5)]
    locked = StoreUnavailable("the store is unavailable: database is locked")
    _passes(daemon, monkeypatch, [*full, locked, locked, None, None, full[0]])
    lines = _lines(caplog)
    assert lines == [
        (logging.ERROR, f"reconcile pass failed: {FULL}; each pass retries, and this is "
                        "logged again when it changes or clears", False),
        (logging.ERROR, "reconcile pass failed: the store is unavailable: database is locked; "
                        "each pass retries, and this is logged again when it changes or clears",
         False),
        (logging.INFO, "reconcile passes again: the store fault cleared", False),
        (logging.ERROR, f"reconcile pass failed: {FULL}; each pass retries, and this is "
                        "logged again when it changes or clears", False),
    ]  # fmt: skip


def test_any_other_failed_pass_keeps_its_traceback_each_time(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    _passes(daemon, monkeypatch, [KeyError("x"), KeyError("x"), None])
    assert _lines(caplog) == [
        (logging.ERROR, "reconcile pass failed; next pass retries", True),
        (logging.ERROR, "reconcile pass failed; next pass retries", True),
    ], "no store fault to clear"
