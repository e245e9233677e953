"""spotd.train.ranks: every rank's own progress file, written cheaply and caught up by
a background thread while the rank does nothing more (blocked in a collective)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from spotd.core.clock import ManualClock
from spotd.train import Run
from spotd.train.log import RankLog
from spotd.train.ranks import RankFile, rank_file_beside

EPOCH = datetime(2026, 3, 2, tzinfo=UTC)


def step_in(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["step"])
    except FileNotFoundError:
        return None


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_writes_at_most_every_interval_and_flushes_what_it_held(tmp_path: Path) -> None:
    clock = ManualClock(EPOCH)
    path = tmp_path / "progress-rank-2.json"
    # An hour between the thread's looks: this test sees only report() and flush().
    ranks = RankFile(path, 2, 3600.0, clock, RankLog(None, is_main=True))
    ranks.report(1)
    assert json.loads(path.read_text()) == {
        "rank": 2,
        "step": 1,
        "pid": os.getpid(),
        "at": "2026-03-02T00:00:00.000+00:00",
    }
    ranks.report(2)
    assert step_in(path) == 1, "held back: written less than the interval ago"
    clock.advance(3600)
    ranks.report(3)
    assert step_in(path) == 3
    ranks.report(4)
    ranks.close()
    assert step_in(path) == 4, "close writes the last step"
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "no temp file left"


def test_the_thread_writes_a_step_the_rank_held_back(tmp_path: Path) -> None:
    path = tmp_path / "progress-rank-0.json"
    # The clock never moves, so report() writes only the first step; the rank then
    # blocks (it reports nothing more) and the thread writes the last one.
    ranks = RankFile(path, 0, 0.05, ManualClock(EPOCH), RankLog(None, is_main=True))
    ranks.report(7)
    ranks.report(8)
    try:
        assert wait_for(lambda: step_in(path) == 8), "the held step never reached the file"
    finally:
        ranks.close()


def test_nowhere_to_write_is_said_once(tmp_path: Path) -> None:
    said: list[str] = []
    missing = tmp_path / "gone" / "progress-rank-0.json"
    ranks = RankFile(missing, 0, 0.0, ManualClock(EPOCH), RankLog(said.append, is_main=True))
    ranks.report(1)
    ranks.report(2)
    ranks.close()
    assert len(said) == 1 and "progress-rank-0.json" in said[0]
    quiet = RankFile(None, 0, 0.0, ManualClock(EPOCH), RankLog(said.append, is_main=True))
    quiet.report(1)
    quiet.close()
    assert len(said) == 1


def test_run_keeps_the_rank_file_beside_the_progress_file(tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    assert rank_file_beside(progress, 3) == tmp_path / "progress-rank-3.json"
    assert rank_file_beside(None, 3) is None and rank_file_beside("", 3) is None
    env = {"SPOTD_PROGRESS_FILE": str(progress)}
    with Run.from_env(env, clock=ManualClock(EPOCH), handle_signals=False) as run:
        run.restore({})
        for step in range(1, 6):
            run.report(step)
    kept = json.loads((tmp_path / "progress-rank-0.json").read_text())
    assert (kept["rank"], kept["step"], kept["pid"]) == (0, 5, os.getpid())
    assert json.loads(progress.read_text())["step"] == 5
