"""Run every shipped scenario and print Markdown result tables (for docs/benchmarks.md).

Usage: python benchmarks/simulate_scenarios.py [--policy NAME ...] [--traces DIR] [--workers N]
       [--hindsight-stats]

Scenarios run in parallel processes (one per core by default); every scenario
is deterministic, so the tables do not depend on how many run at once.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from spotd.simulate.adapter import HINDSIGHT
from spotd.simulate.cli import COLUMNS, job_title, table_rows
from spotd.simulate.omniscient import OMNISCIENT
from spotd.simulate.runner import JobReport, run_scenario

ROOT = Path(__file__).resolve().parent.parent


def tables(path: Path, policies: list[str], traces: Path | None, hindsight: bool) -> str:
    """One scenario's Markdown tables, one per job."""
    report = run_scenario(path, policies, traces=traces, hindsight=hindsight)
    out = []
    for job in report.jobs:
        out.append(f"\n{job_title(report, job)} ({job.seconds:.1f} s)\n")
        out.append("| " + " | ".join(COLUMNS) + " |")
        out.append("|" + "---|" * len(COLUMNS))
        out.extend("| " + " | ".join(row) + " |" for row in table_rows(job))
        out.append(f"\n{_goal(job)}")
    return "\n".join(out)


def _goal(job: JobReport) -> str:
    """Issue 5's goal for a product policy on this job, and what choosing, for every start
    point with hindsight, the cheapest of the online policies that ran would reach."""
    means = {m.policy: m.mean_cost for m in job.metrics}
    optimum = means[OMNISCIENT]
    best = min((n for n in means if n.startswith(("greedy", "up-"))), key=means.__getitem__)
    target = optimum + (means[best] - optimum) / 2
    od = job.runs[0].costs  # every cost is normalised by on-demand only, which runs first
    online = [
        run.costs / od for run in job.runs
        if run.name != OMNISCIENT and not run.name.endswith(HINDSIGHT)
    ]
    hindsight = float(np.min(np.stack(online), axis=0).mean())
    return (
        f"Goal: mean <= {target:.3f} (half of {best}'s gap to the optimum {optimum:.3f}). "
        f"The cheapest of the {len(online)} online policies above that see only the past, "
        f"picked per start point with hindsight: {hindsight:.3f}."
    )


def main() -> None:
    """Run the scenarios and print their tables in file order, then the total time."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", action="append", default=[])
    parser.add_argument("--traces", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--hindsight-stats", action="store_true",
                        help="also replay each policy on the whole trace's statistics")
    args = parser.parse_args()
    began = time.perf_counter()
    paths = sorted((ROOT / "scenarios").glob("*.toml"))
    # The biggest scenarios (most start points and offerings) first, so the
    # small ones fill in behind them.
    order = sorted(paths, key=lambda p: -p.stat().st_size)
    with ProcessPoolExecutor(max_workers=max(1, min(args.workers, len(paths)))) as pool:
        futures = {
            p: pool.submit(tables, p, args.policy, args.traces, args.hindsight_stats)
            for p in order
        }
        for path in paths:
            print(futures[path].result())
    print(f"\ntotal {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
