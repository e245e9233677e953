"""The simulator on the real shared traces: optimum never beaten, no peeking, paper figures."""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from spotd.core.values import Market, Pool
from spotd.registry import load_policy
from spotd.simulate.adapter import PolicyAdapter, TraceHistory, TraceStats
from spotd.simulate.model import RunState
from spotd.simulate.omniscient import OMNISCIENT
from spotd.simulate.runner import ScenarioReport, run_scenario
from spotd.simulate.scenario import load_scenario
from spotd.simulate.timeline import TRACES_ENV, build_timeline
from spotd.simulate.world import EPOCH, prepare

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
TRACES = Path(os.environ.get(TRACES_ENV) or ROOT.parent / "shared" / "traces")
NINE = TRACES / "aws-v100-9zones-2023-02"
FOUR = TRACES / "aws-v100-4node-2023-08"

pytestmark = pytest.mark.skipif(
    not NINE.is_dir() or not FOUR.is_dir(),
    reason=f"shared traces not found at {TRACES} (set {TRACES_ENV})",
)


def offering(trace: Path, provider: str, zone: str, itype: str, extra: str = "") -> str:
    return f"""
[[offerings]]
trace = "{trace}"
provider = "{provider}"
region = "{zone[:-1]}"
zone = "{zone}"
instance_type = "{itype}"
{extra}
"""


REFERENCE = 'name = "slice-ref"\ntick_seconds = 360\n' + "".join(
    offering(NINE / f"{z}_v100_1.json", "aws", z, "p3.2xlarge")
    for z in ("us-east-1a", "us-east-1c", "us-east-1d", "us-east-1f")
) + """
[[jobs]]
name = "short"
compute_hours = 6
deadline_fraction = 0.75
starts = 40
seed = 4

[[jobs]]
name = "tight"
compute_hours = 4
deadline_fraction = 0.9
changeover_hours = 0.2
starts = 30
seed = 5
"""

FULL = """
name = "slice-full"
cost_model = "full"
progress_quantum = 0.1
[egress_usd_per_gb]
aws = 0.09
gcp = 0.12
""" + offering(FOUR / "us-east-1f_v100_1.json", "aws", "us-east-1f", "p5.48xlarge",
               "spot_price = 25.0\non_demand_price = 63.0") + offering(
    FOUR / "us-east-2a_v100_1.json", "gcp", "us-east-2a", "a3-megagpu-8g",
    "spot_price = 20.0\non_demand_price = 58.0") + offering(
    FOUR / "us-west-2c_v100_1.json", "aws", "us-west-2c", "p5.48xlarge",
    "spot_price = 27.0\non_demand_price = 63.0") + """
[[jobs]]
name = "gang"
compute_hours = 4
deadline_fraction = 0.8
nodes = 2
model_size_b = 5
checkpoint_gb = 100
checkpoint_interval_hours = 0.5
starts = 30
seed = 6
"""


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[ScenarioReport]:
    folder = tmp_path_factory.mktemp("scen")
    out = []
    for name, text in (("ref.toml", REFERENCE), ("full.toml", FULL)):
        path = folder / name
        path.write_text(text)
        out.append(run_scenario(path, ["cheapest", "on-demand"]))
    return out


def test_no_policy_ever_beats_the_omniscient_optimum(reports: list[ScenarioReport]) -> None:
    checked = 0
    for report in reports:
        for job in report.jobs:
            opt = next(r for r in job.runs if r.name == OMNISCIENT).costs
            assert np.isfinite(opt).all()
            for run in job.runs:
                assert run.outcomes is not None or run.name == OMNISCIENT
                for i, out in enumerate(run.outcomes or ()):
                    if not out.missed:
                        assert out.cost >= opt[i] - 1e-9, (job.prepared.job.name, run.name, i)
                        checked += 1
    assert checked > 500


def test_policies_with_a_safety_net_never_miss(reports: list[ScenarioReport]) -> None:
    for report in reports:
        for job in report.jobs:
            for m in job.metrics:
                if not m.policy.startswith("policy:"):
                    assert m.misses == 0, (report.scenario.name, job.prepared.job.name, m.policy)


def test_product_on_demand_matches_the_baseline_in_the_reference_model(
    reports: list[ScenarioReport],
) -> None:
    for job in reports[0].jobs:
        runs = {r.name: r.costs for r in job.runs}
        assert runs["policy:on-demand"].tolist() == pytest.approx(runs["od-only"].tolist())


def test_adapter_never_shows_the_future(reports: list[ScenarioReport]) -> None:
    prepared = reports[0].jobs[0].prepared
    world = prepared.world
    start, t = prepared.starts[3], 17
    now = start + t
    rng = np.random.default_rng(0)
    changed = world.avail.copy()
    changed[:, now + 1 :] = rng.integers(0, 2, size=changed[:, now + 1 :].shape).astype(bool)
    other = replace(world, avail=changed, rows=changed.T.tolist())
    views = []
    for w in (world, other):
        adapter = PolicyAdapter(load_policy("cheapest"), replace(prepared, world=w))
        adapter.reset(w, start)
        state = RunState(world=w, start=start, t=t, row=w.rows[now], progress=5, mode=w.n + 1)
        views.append(adapter.context(state))
    (ctx_a, offs_a), (ctx_b, offs_b) = views
    assert offs_a == offs_b
    assert replace(ctx_a, stats=None) == replace(ctx_b, stats=None)
    assert ctx_a.current_market is Market.ON_DEMAND and ctx_a.done_hours > 0
    assert ctx_a.stats is not None and ctx_b.stats is not None
    for off in offs_a:
        assert ctx_a.stats.availability(off.pool) == ctx_b.stats.availability(off.pool)
        assert ctx_a.stats.preemptions_per_hour(off.pool) == ctx_b.stats.preemptions_per_hour(
            off.pool)
        seen_a = ctx_a.stats.capacity_series(off.pool)
        seen_b = ctx_b.stats.capacity_series(off.pool)
        assert seen_a is not None and seen_b is not None
        assert seen_a.up.tolist() == seen_b.up.tolist() and seen_a.start == seen_b.start
        assert len(seen_a) == now + 1


def test_trace_stats_count_the_past_only() -> None:
    avail = np.array([[1, 1, 0, 1, 0, 0, 1, 1]], dtype=bool)
    history = TraceHistory(avail, tick_hours=0.5)
    pool = Pool("aws", "r", "z", "t")
    stats = TraceStats(history, {pool: 0}, tick=4)
    assert stats.availability(pool) == pytest.approx(3 / 5)
    # two drops (1->0 at ticks 2 and 4) over 1.5 hours up
    assert stats.preemptions_per_hour(pool) == pytest.approx(2 / 1.5)
    assert TraceStats(history, {pool: 0}, tick=0).availability(pool) is None  # 0.5 h seen
    assert stats.availability(Pool("gcp", "r", "z", "t")) is None
    series = stats.capacity_series(pool)
    assert series is not None and series.up.tolist() == [True, True, False, True, False]
    assert series.age_hours() == 0.0  # went down at this very tick
    windowed = TraceStats(TraceHistory(avail, 0.5, window=3), {pool: 0}, tick=6)
    recent = windowed.capacity_series(pool)
    assert recent is not None and recent.up.tolist() == [False, False, True]
    assert recent.start == EPOCH + timedelta(hours=2)


def test_trace_stats_with_hindsight_see_the_whole_trace_and_keep_the_present() -> None:
    rng = np.random.default_rng(7)
    avail = rng.random((1, 52)) < 0.6  # 52 hourly ticks: 2 whole days and 4 hours
    pool = Pool("aws", "r", "z", "t")
    history = TraceHistory(avail, tick_hours=1.0, hindsight=True)
    assert history.whole_days == 48
    stats = TraceStats(history, {pool: 0}, tick=10)
    series = stats.capacity_series(pool)
    assert series is not None
    # The future up to the last whole day, moved back two days, then the past to now.
    assert series.up.tolist() == avail[0, 11:48].tolist() + avail[0, :11].tolist()
    assert series.start == EPOCH - timedelta(hours=37)
    assert series.up[-1] == avail[0, 10]  # the present is still the present
    for i in range(37):  # every moved sample keeps its hour of day
        moved = series.start + timedelta(hours=i)
        assert moved.hour == (EPOCH + timedelta(hours=11 + i)).hour
    ups = int(avail.sum())
    drops = int((avail[0, :-1] & ~avail[0, 1:]).sum())
    assert stats.availability(pool) == pytest.approx(ups / 52)
    assert stats.preemptions_per_hour(pool) == pytest.approx(drops / ups)
    late = TraceStats(history, {pool: 0}, tick=50).capacity_series(pool)
    assert late is not None and late.start == EPOCH
    assert late.up.tolist() == avail[0, :51].tolist()
    plain = TraceStats(TraceHistory(avail, tick_hours=1.0), {pool: 0}, tick=10)
    assert plain.availability(pool) == pytest.approx(int(avail[0, :11].sum()) / 11)


def test_shipped_scenarios_load_and_find_their_traces() -> None:
    files = sorted(SCENARIOS.glob("*.toml"))
    assert len(files) >= 4
    for path in files:
        s = load_scenario(path)
        tl = build_timeline(path, s, None)
        for job in s.jobs:
            p = prepare(s, tl, job, str(path))
            assert len(p.starts) == job.starts


PUBLISHED = {"greedy-1z": 0.76, "up-1z": 0.70, OMNISCIENT: 0.57}
"""Mean normalised cost on us-east-1f, 48 h, fraction 0.8, d = 0.3 h (NSDI 2024)."""


@pytest.mark.slow
def test_published_behaviour_on_scenario_one() -> None:
    report = run_scenario(SCENARIOS / "1-one-zone.toml")
    job = report.jobs[0]
    assert len(job.prepared.starts) == 100 and job.prepared.world.tick_hours == 0.1
    means = {m.policy: m.mean_cost for m in job.metrics}
    for name, published in PUBLISHED.items():
        assert means[name] == pytest.approx(published, abs=0.03), means
    assert means[OMNISCIENT] < means["up-1z"] < means["greedy-1z"] < 1.0
    assert all(m.misses == 0 for m in job.metrics)


def test_a_trace_given_alone_replays_like_its_scenario() -> None:
    """Scenario 1 is one trace file in the reference model: naming the file alone, with
    the same tick and job, gives the same figures for every policy."""
    from spotd.simulate.scenario import scenario_from_traces

    policy = ["balanced"]
    by_file = run_scenario(SCENARIOS / "1-one-zone.toml", policy, starts=8)
    alone = run_scenario(
        scenario_from_traces([NINE / "us-east-1f_v100_1.json"], tick_seconds=360), policy,
        starts=8,
    )  # fmt: skip
    # The files are read where they really are (the shared folder may be a link).
    assert alone.path is None
    assert alone.traces == ((NINE / "us-east-1f_v100_1.json").resolve(),)
    assert [m.policy for m in alone.jobs[0].metrics] == [m.policy for m in by_file.jobs[0].metrics]
    for mine, theirs in zip(alone.jobs[0].metrics, by_file.jobs[0].metrics, strict=True):
        assert mine.mean_cost == pytest.approx(theirs.mean_cost, abs=1e-12), mine.policy
