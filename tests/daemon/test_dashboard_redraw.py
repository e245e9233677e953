"""Kept drawings: answered at once, redrawn behind the answer once old."""

from __future__ import annotations

import threading
import time

import pytest

from spotd.daemon.dashboard.redraw import KeptDrawings


def test_a_fresh_drawing_is_answered_without_drawing_again() -> None:
    kept: KeptDrawings[str] = KeptDrawings(60.0, max_items=4, name="t")
    calls: list[str] = []

    def draw() -> str:
        calls.append("a")
        return f"svg {len(calls)}"

    assert kept.get("a", draw) == "svg 1"
    assert kept.get("a", draw) == "svg 1"
    assert calls == ["a"]


def test_an_old_drawing_is_answered_and_redrawn_behind_the_answer() -> None:
    kept: KeptDrawings[str] = KeptDrawings(0.0, max_items=4, name="t")
    assert kept.get("a", lambda: "old") == "old"
    time.sleep(0.01)
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
    kept.redrawn().result(5)
    assert kept.get("a", lambda: "newer") == "new"


def test_a_failed_redrawing_keeps_the_old_drawing(caplog: pytest.LogCaptureFixture) -> None:
    kept: KeptDrawings[str] = KeptDrawings(0.0, max_items=4, name="t")
    kept.get("a", lambda: "old")
    time.sleep(0.01)

    def broken() -> str:
        raise RuntimeError("matplotlib fell over")

    assert kept.get("a", broken) == "old"
    kept.redrawn().result(5)
    assert "could not redraw" in caplog.text
    assert kept.get("a", lambda: "again") == "old"  # the failed one is due again
    kept.redrawn().result(5)
    assert kept.get("a", lambda: "later") == "again"


def test_the_oldest_kept_drawing_goes_first() -> None:
    kept: KeptDrawings[str] = KeptDrawings(60.0, max_items=2, name="t")
    for key in ("a", "b", "c"):
        kept.get(key, lambda k=key: k)  # type: ignore[misc]
    assert kept.get("a", lambda: "drawn again") == "drawn again"
    assert kept.get("c", lambda: "not drawn") == "c"
