"""Run every shipped scenario and print Markdown result tables (for docs/benchmarks.md).

Usage: python benchmarks/simulate_scenarios.py [--policy NAME ...] [--traces DIR] [--workers N]
       [--hindsight-stats] [--judge NAME] [--halves] [--scenario FILE ...]

Scenarios run in parallel processes (one per core by default); every scenario
is deterministic, so the tables do not depend on how many run at once.

After the tables, the closure table judges one product policy (``--judge``,
by default ``balanced`` when it ran): on every job, on the start points whose
deadline falls in the trace's first half (where rules may be chosen) and on
those that start in its second half (held out), its mean, p75 and misses, the
best baseline and the optimum on the same start points, and the share of the
baseline's gap to the optimum it closes.

With ``--halves`` every job is instead replayed on each half of its traces'
timeline apart (:mod:`spotd.simulate.halves`: start points drawn within the
half, half the job's start points in each), and one table gives, per job, on
all start points, on the tuning (first) halves and on the held-out (second)
halves: the best baseline, the optimum, and every product policy's mean,
misses and closure. ``--scenario`` runs only the scenario files named.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from spotd.simulate.adapter import HINDSIGHT
from spotd.simulate.cli import COLUMNS, job_title, table_rows
from spotd.simulate.halves import HalfRow, half_rows, run_halves
from spotd.simulate.metrics import Split, closure, halves, summarize
from spotd.simulate.omniscient import OMNISCIENT
from spotd.simulate.runner import JobReport, run_scenario

CLOSURE_COLUMNS = (
    "job", "starts", "mean", "p75", "misses", "best baseline", "optimum", "closure",
)

ROOT = Path(__file__).resolve().parent.parent


def tables(
    path: Path, policies: list[str], traces: Path | None, hindsight: bool, judge: str | None
) -> tuple[str, list[tuple[str, list[str], float]]]:
    """One scenario's Markdown tables, one per job, and the judged policy's closure rows
    (label of the split, table cells, closure)."""
    report = run_scenario(path, policies, traces=traces, hindsight=hindsight)
    out = []
    rows: list[tuple[str, list[str], float]] = []
    for job in report.jobs:
        out.append(f"\n{job_title(report, job)} ({job.seconds:.1f} s)\n")
        out.extend(_markdown(COLUMNS, table_rows(job)))
        out.append(f"\n{_goal(job)}")
        if judge is not None:
            rows += _closure_rows(f"{report.scenario.name} / {job.prepared.job.name}", job, judge)
    return "\n".join(out), rows


def _markdown(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _closure_rows(name: str, job: JobReport, judge: str) -> list[tuple[str, list[str], float]]:
    """The judged policy on all start points, the first half's and the held-out second's."""
    world = job.prepared.world
    starts = job.prepared.starts
    everyone = Split("all", np.ones(len(starts), dtype=np.bool_))
    rows = []
    for split in (everyone, *halves(starts, world.window, world.avail.shape[1])):
        if not split.mask.any():
            continue
        od = job.runs[0].costs[split.mask]
        opt = next(r for r in job.runs if r.name == OMNISCIENT).costs[split.mask]
        metrics = {r.name: summarize(r.subset(split.mask), od, opt) for r in job.runs}
        best = min((m for n, m in metrics.items() if n.startswith(("greedy", "up-"))),
                   key=lambda m: m.mean_cost)
        ours, optimum = metrics[judge], metrics[OMNISCIENT].mean_cost
        share = closure(ours.mean_cost, best.mean_cost, optimum)
        cells = [
            name if split is everyone else f"{name}, {split.label}",
            str(int(split.mask.sum())), f"{ours.mean_cost:.3f}", f"{ours.p75_cost:.3f}",
            str(ours.misses), f"{best.policy} {best.mean_cost:.3f}", f"{optimum:.3f}",
            f"{share:+.2f}",
        ]
        rows.append((split.label, cells, share))
    return rows


def closure_table(judge: str, rows: list[tuple[str, list[str], float]]) -> str:
    """The closure rows as one Markdown table, then the mean closure of each split."""
    out = [f"\nClosure of {judge}: (best baseline - {judge}) / (best baseline - optimum)\n"]
    out.extend(_markdown(CLOSURE_COLUMNS, [cells for _, cells, _ in rows]))
    out.append("")
    for label in dict.fromkeys(label for label, _, _ in rows):
        shares = [s for lab, _, s in rows if lab == label]
        behind = sum(s < 0 for s in shares)
        out.append(
            f"- {label}: mean closure {np.nanmean(shares):+.3f} over {len(shares)} rows, "
            f"behind the best baseline on {behind}"
        )
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


def halves_rows(path: Path, policies: list[str], traces: Path | None) -> list[HalfRow]:
    """One scenario's rows of the halves table (all, tuning half, held-out half per job)."""
    return [row for report in run_halves(path, policies, traces=traces)
            for row in half_rows(report)]


def halves_table(policies: list[str], rows: list[HalfRow]) -> str:
    """The halves rows as one Markdown table, then each policy's mean closure per split."""
    names = [f"policy:{p}" for p in policies]
    columns = ["job", "split", "starts", "best baseline", "optimum"]
    for p in policies:
        columns += [f"{p} mean", "misses", "closure"]
    cells = []
    for row in rows:
        best, best_mean = row.best_baseline
        line = [row.name, row.split, str(row.starts), f"{best} {best_mean:.3f}",
                f"{row.optimum:.3f}"]
        for name in names:
            share = closure(row.means[name], best_mean, row.optimum)
            line += [f"{row.means[name]:.3f}", str(row.misses[name]), f"{share:+.2f}"]
        cells.append(line)
    out = ["\nHalves: closure = (best baseline - policy) / (best baseline - optimum)\n"]
    out.extend(_markdown(columns, cells))
    out.append("")
    for name in names:
        for split in dict.fromkeys(r.split for r in rows):
            mine = [r for r in rows if r.split == split]
            shares = [closure(r.means[name], r.best_baseline[1], r.optimum) for r in mine]
            # Behind by what the table shows (3 decimals); rows without a gap have no closure.
            behind = sum(r.means[name] > r.best_baseline[1] + 5e-4 for r in mine)
            misses = sum(r.misses[name] for r in mine)
            gaps = sum(not np.isnan(x) for x in shares)
            out.append(
                f"- {name}, {split}: mean closure {np.nanmean(shares):+.3f} over the {gaps} "
                f"of {len(mine)} rows with a gap, behind the best baseline on {behind}, "
                f"{misses} misses"
            )
    return "\n".join(out)


def main() -> None:
    """Run the scenarios and print their tables in file order, then the total time."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", action="append", default=[])
    parser.add_argument("--traces", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--hindsight-stats", action="store_true",
                        help="also replay each policy on the whole trace's statistics")
    parser.add_argument("--judge", default=None,
                        help="product policy of the closure table (default: balanced if run)")
    parser.add_argument("--halves", action="store_true",
                        help="replay each half of the timeline apart: tuning and held-out rows")
    parser.add_argument("--scenario", action="append", type=Path, default=[],
                        help="scenario file to run (default: every scenarios/*.toml)")
    args = parser.parse_args()
    judge = args.judge or ("balanced" if "balanced" in args.policy else None)
    if judge is not None and judge not in args.policy:
        parser.error(f"--judge {judge}: not among the --policy names")
    label = None if judge is None else f"policy:{judge}"
    began = time.perf_counter()
    paths = args.scenario or sorted((ROOT / "scenarios").glob("*.toml"))
    if args.halves:
        _run_halves(paths, args.policy, args.traces, args.workers)
        print(f"\ntotal {time.perf_counter() - began:.1f} s")
        return
    # The biggest scenarios (most start points and offerings) first, so the
    # small ones fill in behind them.
    order = sorted(paths, key=lambda p: -p.stat().st_size)
    with ProcessPoolExecutor(max_workers=max(1, min(args.workers, len(paths)))) as pool:
        futures = {
            p: pool.submit(tables, p, args.policy, args.traces, args.hindsight_stats, label)
            for p in order
        }
        rows = []
        for path in paths:
            text, found = futures[path].result()
            print(text)
            rows += found
    if label is not None:
        print(closure_table(label, rows))
    print(f"\ntotal {time.perf_counter() - began:.1f} s")


def _run_halves(paths: list[Path], policies: list[str], traces: Path | None, workers: int) -> None:
    """Every scenario's halves rows, in file order, as one table."""
    with ProcessPoolExecutor(max_workers=max(1, min(workers, len(paths)))) as pool:
        # The biggest scenarios first, so the small ones fill in behind them.
        order = sorted(paths, key=lambda p: -p.stat().st_size)
        futures = {p: pool.submit(halves_rows, p, policies, traces) for p in order}
        rows = [row for p in paths for row in futures[p].result()]
    print(halves_table(policies, rows))


if __name__ == "__main__":
    main()
