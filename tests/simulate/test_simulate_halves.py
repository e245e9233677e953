"""Held-out evaluation: start points drawn within each half, rows for all and each half."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spotd.simulate.halves import ALL, HELD_OUT, TUNING, half_rows, run_halves
from spotd.simulate.omniscient import OMNISCIENT
from spotd.simulate.scenario import ScenarioError, parse_scenario
from spotd.simulate.timeline import Timeline
from spotd.simulate.world import prepare

SCENARIO = """
name = "tiny"

[[offerings]]
trace = "t/a.json"
provider = "aws"
region = "us-east-1"
zone = "us-east-1a"
instance_type = "p3.2xlarge"

[[offerings]]
trace = "t/b.json"
provider = "aws"
region = "us-east-1"
zone = "us-east-1b"
instance_type = "p3.2xlarge"

[[jobs]]
name = "j"
compute_hours = 3
deadline_fraction = 0.5
changeover_hours = 1
starts = 6
"""


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    (tmp_path / "t").mkdir()
    for name in ("a", "b"):
        data = np.repeat(rng.random(20) < 0.6, 3).astype(int).tolist()
        (tmp_path / "t" / f"{name}.json").write_text(
            json.dumps({"metadata": {"gap_seconds": 3600}, "data": data}))
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    return path


def test_starts_are_drawn_so_the_whole_window_lies_within_the_ticks_given() -> None:
    import tomllib

    s = parse_scenario(tomllib.loads(SCENARIO), source="t")
    tl = Timeline(values=np.ones((2, 60), dtype=np.int64), tick_hours=1.0, paths=())
    job = s.jobs[0]  # a 6-tick window
    for within in ((0, 30), (30, 60), (12, 19)):
        p = prepare(s, tl, job, "t", starts=200, within=within)
        assert min(p.starts) >= within[0]
        assert max(p.starts) + p.world.window <= within[1]
    assert set(prepare(s, tl, job, "t", starts=200, within=(12, 19)).starts) == {12, 13}
    with pytest.raises(ScenarioError, match="shorter than the deadline"):
        prepare(s, tl, job, "t", within=(10, 15))


def test_rows_give_all_the_tuning_and_the_held_out_half(scenario: Path) -> None:
    (report,) = run_halves(scenario, ["balanced"])
    assert all(s < 30 for s in report.tuning.prepared.starts)
    assert all(s >= 30 for s in report.held_out.prepared.starts)
    rows = half_rows(report)
    assert [r.split for r in rows] == [ALL, TUNING, HELD_OUT]
    assert [r.starts for r in rows] == [6, 3, 3]
    every, first, second = rows
    for name, mean in every.means.items():
        assert mean == pytest.approx((first.means[name] + second.means[name]) / 2)
        assert every.misses[name] == first.misses[name] + second.misses[name]
    for row in rows:
        best, best_mean = row.best_baseline
        assert best.startswith(("greedy", "up-"))
        assert row.optimum == row.means[OMNISCIENT] <= best_mean
        assert row.optimum <= row.means["policy:balanced"] + 1e-12
