"""Run a scenario: every job, every start point, baselines, product policies and the optimum."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spotd.core.clock import WALL
from spotd.core.contracts import Clock, Policy
from spotd.registry import load_policy
from spotd.simulate.adapter import PolicyAdapter
from spotd.simulate.baselines import baselines_for
from spotd.simulate.metrics import PolicyMetrics, PolicyRun, summarize
from spotd.simulate.model import SimPolicy, run_policy
from spotd.simulate.omniscient import OMNISCIENT, omniscient_costs
from spotd.simulate.scenario import TRACES_SOURCE, Scenario, load_scenario
from spotd.simulate.timeline import build_timeline
from spotd.simulate.world import Prepared, prepare

__all__ = [
    "JobReport", "OnStep", "ScenarioReport", "Step", "report_json", "run_job", "run_scenario",
]  # fmt: skip

_DP_CHUNK = 250
"""Start points per DP batch: bounds memory on long jobs and fine progress grids."""


@dataclass(frozen=True, slots=True)
class JobReport:
    """One job of a scenario: every policy's run and its metrics."""

    prepared: Prepared
    runs: tuple[PolicyRun, ...]
    metrics: tuple[PolicyMetrics, ...]
    seconds: float


@dataclass(frozen=True, slots=True)
class ScenarioReport:
    """A whole scenario's results."""

    path: Path | None
    """The scenario file; None for one made from trace files alone."""
    scenario: Scenario
    jobs: tuple[JobReport, ...]
    seconds: float
    traces: tuple[Path, ...] = ()
    """The trace files read, in the scenario's offering order."""


@dataclass(frozen=True, slots=True)
class Step:
    """How far the replay of one job has got, for a progress bar: ``done`` of ``total``
    runs, a run being one policy (the omniscient optimum too) from one start point."""

    job: str
    policy: str
    """The policy replayed now."""
    done: int
    total: int


OnStep = Callable[[Step], None]
"""Told after each run of a job's replay (:class:`Step`)."""


def _simulate(
    policy: SimPolicy, prepared: Prepared, tell: Callable[[str, int], None]
) -> PolicyRun:
    outs = []
    for i, s in enumerate(prepared.starts):
        # The first start point keeps its tick-by-tick modes, for the timeline plot.
        outs.append(run_policy(policy, prepared.world, s, record=i == 0))
        tell(policy.name, 1)
    return PolicyRun(policy.name, np.array([o.cost for o in outs]), tuple(outs))


def run_job(
    prepared: Prepared,
    policies: Sequence[Policy] = (),
    *,
    hindsight: bool = False,
    clock: Clock = WALL,
    on_step: OnStep | None = None,
) -> JobReport:
    """Replay one prepared job under the baselines, ``policies`` and the omniscient DP;
    with ``hindsight``, ``policies`` again shown the whole trace's statistics. ``clock``
    times the replay; ``on_step`` is told after each run (:class:`Step`)."""
    began = clock.monotonic()
    world, starts = prepared.world, prepared.starts
    sims: list[SimPolicy] = [*baselines_for(world)]
    sims += [PolicyAdapter(p, prepared) for p in policies]
    if hindsight:
        sims += [PolicyAdapter(p, prepared, hindsight=True) for p in policies]
    total = (len(sims) + 1) * len(starts)
    done = 0

    def tell(policy: str, runs: int) -> None:
        nonlocal done
        done += runs
        if on_step is not None:
            on_step(Step(prepared.job.name, policy, done, total))

    runs = [_simulate(p, prepared, tell) for p in sims]
    chunks = []
    for i in range(0, len(starts), _DP_CHUNK):
        chunks.append(omniscient_costs(world, starts[i : i + _DP_CHUNK]))
        tell(OMNISCIENT, len(chunks[-1]))
    opt = np.concatenate(chunks)
    runs.append(PolicyRun(OMNISCIENT, opt, None))
    od = runs[0].costs  # on-demand only comes first: every cost is normalised by it
    metrics = tuple(summarize(r, od, opt) for r in runs)
    return JobReport(prepared, tuple(runs), metrics, clock.monotonic() - began)


def run_scenario(
    scenario: Path | Scenario,
    policies: Sequence[str | Policy] = (),
    *,
    traces: Path | None = None,
    starts: int | None = None,
    seed: int | None = None,
    hindsight: bool = False,
    clock: Clock = WALL,
    on_step: OnStep | None = None,
) -> ScenarioReport:
    """Run every job of a scenario file, or of a scenario made from trace files alone
    (:func:`~spotd.simulate.scenario.scenario_from_traces`).

    ``policies`` are product policies, by entry-point name or as objects;
    ``starts`` and ``seed`` override every job's own; ``hindsight`` replays the
    policies a second time on the whole trace's statistics (see
    :class:`~spotd.simulate.adapter.PolicyAdapter`); ``clock`` times the runs;
    ``on_step`` is told how far each job's replay has got (:class:`Step`).
    """
    began = clock.monotonic()
    path = scenario if isinstance(scenario, Path) else None
    if isinstance(scenario, Path):
        scenario = load_scenario(scenario)
    loaded = [load_policy(p) if isinstance(p, str) else p for p in policies]
    # Errors name the scenario file, or the flag the traces came from.
    source = path or Path(TRACES_SOURCE)
    timeline = build_timeline(source, scenario, traces)
    jobs = tuple(
        run_job(
            prepare(scenario, timeline, job, str(source), starts=starts, seed=seed),
            loaded,
            hindsight=hindsight,
            clock=clock,
            on_step=on_step,
        )
        for job in scenario.jobs
    )
    seconds = clock.monotonic() - began
    return ScenarioReport(path, scenario, jobs, seconds, timeline.paths)


def _job_json(report: JobReport) -> dict[str, Any]:
    p, w = report.prepared, report.prepared.world
    per_policy: dict[str, Any] = {}
    od = report.runs[0].costs
    for run, m in zip(report.runs, report.metrics, strict=True):
        results = []
        for i, start in enumerate(p.starts):
            row: dict[str, Any] = {
                "start_tick": start,
                "cost": float(run.costs[i]),
                "normalized_cost": float(run.costs[i] / od[i]),
            }
            if run.outcomes is not None:
                o = run.outcomes[i]
                row.update(
                    missed=o.missed, finish_hours=None if o.finish_tick is None
                    else o.finish_tick * w.tick_hours,
                    spot_hours=o.spot_ticks * w.tick_hours, od_hours=o.od_ticks * w.tick_hours,
                    preemptions=o.preemptions, launches=o.launches, goodput=o.goodput,
                )
            results.append(row)
        per_policy[run.name] = {"metrics": asdict(m), "results": results}
    return {
        "job": p.job.model_dump(mode="json"),
        "model": {
            "tick_hours": w.tick_hours,
            "progress_units": w.need,
            "units_per_tick": dict(zip(w.labels, w.rate, strict=True)),
            "deadline_ticks": w.window,
            "changeover_ticks": w.changeover,
            "offerings": list(w.labels),
            "eligible": [w.labels[z] for z in w.eligible],
            "home": w.labels[w.home],
        },
        "seconds": report.seconds,
        "policies": per_policy,
    }


def report_json(report: ScenarioReport) -> dict[str, Any]:
    """The whole report as plain JSON-ready data (per-policy metrics and per-start results)."""
    s = report.scenario
    return {
        "scenario": s.name,
        "file": None if report.path is None else str(report.path),
        "traces": [str(t) for t in report.traces],
        "cost_model": str(s.cost_model),
        "seconds": report.seconds,
        "jobs": [_job_json(j) for j in report.jobs],
    }
