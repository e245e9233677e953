"""Held-out evaluation: every job replayed on each half of its traces' timeline apart.

Rules and parameters are chosen on the first half (the *tuning* half); the
second half is *held out*. Start points are drawn within each half so that a
first-half job's whole deadline window lies in the first half, and a
second-half job starts in the second; a second-half job still sees the first
half as history, as a daemon would. Each half gets half the job's start
points (at least one), so the two halves together cost what one run does.

:func:`half_rows` turns the two halves' reports into the rows of the closure
table: every policy's mean cost (normalised by on-demand on the same start)
and misses, the best baseline's and the optimum's mean, on all start points,
the tuning half and the held-out half.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spotd.core.clock import WALL
from spotd.core.contracts import Clock, Policy
from spotd.registry import load_policy
from spotd.simulate.metrics import PolicyRun
from spotd.simulate.omniscient import OMNISCIENT
from spotd.simulate.runner import JobReport, run_job
from spotd.simulate.scenario import Scenario, load_scenario
from spotd.simulate.timeline import build_timeline
from spotd.simulate.world import prepare

__all__ = ["ALL", "HELD_OUT", "TUNING", "HalfRow", "HalvesReport", "half_rows", "run_halves"]

ALL = "all"
TUNING = "tuning half"
HELD_OUT = "held-out half"

BASELINE_PREFIXES = ("greedy", "up-")
"""Runs that count as baselines when the best one is picked."""


@dataclass(frozen=True, slots=True)
class HalvesReport:
    """One job of a scenario, replayed on each half of the timeline."""

    scenario: str
    job: str
    tuning: JobReport
    held_out: JobReport


@dataclass(frozen=True, slots=True)
class HalfRow:
    """One job on one split: each run's mean normalised cost and misses."""

    name: str
    """``scenario / job``."""
    split: str
    starts: int
    means: dict[str, float]
    misses: dict[str, int]

    @property
    def best_baseline(self) -> tuple[str, float]:
        """The cheapest baseline on these start points: (name, mean)."""
        name = min((n for n in self.means if n.startswith(BASELINE_PREFIXES)),
                   key=self.means.__getitem__)
        return name, self.means[name]

    @property
    def optimum(self) -> float:
        """The omniscient optimum's mean on these start points."""
        return self.means[OMNISCIENT]


def run_halves(
    path: Path,
    policies: Sequence[str | Policy] = (),
    *,
    traces: Path | None = None,
    clock: Clock = WALL,
) -> list[HalvesReport]:
    """Replay every job of the scenario file at ``path`` on each half of its timeline."""
    scenario: Scenario = load_scenario(path)
    timeline = build_timeline(path, scenario, traces)
    middle = timeline.ticks // 2
    out = []
    for job in scenario.jobs:
        # Fresh policy objects per job and half: nothing a policy caches crosses over.
        reports = []
        for within in ((0, middle), (middle, timeline.ticks)):
            loaded = [load_policy(p) if isinstance(p, str) else p for p in policies]
            prepared = prepare(scenario, timeline, job, str(path),
                               starts=max(1, job.starts // 2), within=within)
            reports.append(run_job(prepared, loaded, clock=clock))
        out.append(HalvesReport(scenario.name, job.name, reports[0], reports[1]))
    return out


def _normalised(report: JobReport) -> dict[str, tuple[np.ndarray, int]]:
    od = report.runs[0].costs  # on-demand only runs first
    return {run.name: (run.costs / od, _misses(run)) for run in report.runs}


def _misses(run: PolicyRun) -> int:
    return 0 if run.outcomes is None else sum(o.missed for o in run.outcomes)


def half_rows(report: HalvesReport) -> list[HalfRow]:
    """The job's rows: all start points, then the tuning half, then the held-out half."""
    name = f"{report.scenario} / {report.job}"
    first, second = _normalised(report.tuning), _normalised(report.held_out)
    rows = []
    for split, parts in ((ALL, (first, second)), (TUNING, (first,)), (HELD_OUT, (second,))):
        costs = {n: np.concatenate([p[n][0] for p in parts]) for n in first}
        rows.append(HalfRow(
            name, split, len(next(iter(costs.values()))),
            {n: float(c.mean()) for n, c in costs.items()},
            {n: sum(p[n][1] for p in parts) for n in first},
        ))
    return rows
