"""KeptBuilds values (drawings, reports): answered at once, built again behind the answer
once old."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from spotd.core.clock import ManualClock
from spotd.daemon.dashboard.kept import KeptBuilds

FAILURE = "the dashboard could not redraw %s"
EPOCH = datetime(2026, 3, 1, tzinfo=UTC)


def test_a_fresh_drawing_is_answered_without_drawing_again() -> None:
    kept: KeptBuilds[str, str] = KeptBuilds(60.0, max_items=4, name="t", failure=FAILURE)
    calls: list[str] = []

    def draw() -> str:
        calls.append("a")
        return f"svg {len(calls)}"

    assert kept.get("a", draw) == "svg 1"
    assert kept.get("a", draw) == "svg 1"
    assert calls == ["a"]


def test_an_old_drawing_is_answered_and_redrawn_behind_the_answer() -> None:
    clock = ManualClock(EPOCH)
    kept: KeptBuilds[str, str] = KeptBuilds(60.0, max_items=4, name="t", failure=FAILURE,
                                            clock=clock)  # fmt: skip
    assert kept.get("a", lambda: "old") == "old"
    clock.advance(61)
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(5)
        return "new"

    # The ask that finds it old gets the old drawing at once, while the new one is drawn.
    assert kept.get("a", slow) == "old"
    assert started.wait(5)
    assert kept.get("a", slow) == "old"  # one redrawing at a time: no second one queued
    release.set()
    kept.settled().result(5)
    assert kept.get("a", lambda: "newer") == "new"


def test_a_failed_redrawing_keeps_the_old_drawing(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock(EPOCH)
    kept: KeptBuilds[str, str] = KeptBuilds(60.0, max_items=4, name="t", failure=FAILURE,
                                            clock=clock)  # fmt: skip
    kept.get("a", lambda: "old")
    clock.advance(61)

    def broken() -> str:
        raise RuntimeError("matplotlib fell over")

    assert kept.get("a", broken) == "old"
    kept.settled().result(5)
    assert "could not redraw" in caplog.text
    assert kept.get("a", lambda: "again") == "old"  # the failed one is due again
    kept.settled().result(5)
    assert kept.get("a", lambda: "later") == "again"


def test_the_oldest_kept_drawing_goes_first() -> None:
    kept: KeptBuilds[str, str] = KeptBuilds(60.0, max_items=2, name="t", failure=FAILURE)
    for key in ("a", "b", "c"):
        kept.get(key, lambda k=key: k)  # type: ignore[misc]
    assert kept.get("a", lambda: "drawn again") == "drawn again"
    assert kept.get("c", lambda: "not drawn") == "c"


def test_ready_answers_none_and_builds_behind_the_answer() -> None:
    kept: KeptBuilds[str, str] = KeptBuilds(60.0, max_items=4, name="t", failure=FAILURE)
    assert kept.ready("a", lambda: "built") is None
    kept.settled().result(5)
    assert kept.ready("a", lambda: "not built") == "built"


def test_then_runs_after_the_value_is_kept_and_only_behind_the_answer() -> None:
    """The cost page's figures are shown while their charts are still being drawn."""
    drawing, done = threading.Event(), threading.Event()
    seen: list[str] = []

    def then(value: str) -> None:
        drawing.set()
        assert done.wait(5)
        seen.append(value)

    kept: KeptBuilds[str, str] = KeptBuilds(60.0, max_items=4, name="t", failure=FAILURE,
                                            then=then)  # fmt: skip
    assert kept.ready("a", lambda: "report") is None
    assert drawing.wait(5)
    assert kept.ready("a", lambda: "not built") == "report", "kept before then ends"
    done.set()
    kept.settled().result(5)
    assert seen == ["report"]
    assert kept.get("b", lambda: "asked") == "asked"
    assert seen == ["report"], "a value built in the ask is not followed by then"


def test_at_most_max_pending_builds_are_due_at_once() -> None:
    kept: KeptBuilds[str, str] = KeptBuilds(
        60.0, max_items=8, name="t", failure=FAILURE, max_pending=2
    )
    release = threading.Event()

    def slow(key: str) -> str:
        release.wait(5)
        return key

    for key in ("a", "b", "c"):
        assert kept.ready(key, lambda k=key: slow(k)) is None  # type: ignore[misc]
    release.set()
    kept.settled().result(5)
    assert kept.ready("a", lambda: "x") == "a" and kept.ready("b", lambda: "x") == "b"
    assert kept.ready("c", lambda: "c later") is None, "turned away, built when asked again"
    kept.settled().result(5)
    assert kept.ready("c", lambda: "x") == "c later"
