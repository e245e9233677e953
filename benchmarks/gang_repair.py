"""Node repair against restarting the whole gang: time to resume and cost (docs/benchmarks.md).

Usage: python benchmarks/gang_repair.py [--traces DIR] [--starts N] [--seed N]
       [--compute-hours H] [--checkpoint-hours H] [--horizon-days D]
       [--boot-hours H] [--rendezvous-hours H] [--restore-hours H]
       [--replace-boot-hours H] [--offset-hours H] [--price USD]

Replays a 4-node gang job in each zone of the 4-node set
(``aws-v100-4node-2023-08`` under the traces folder: ``--traces``, else
``SPOTD_TRACES``, else ``../shared/traces`` beside the repository) from the same
start points under each rule of :mod:`spotd.simulate.gang_repair`, then a
16-node job on a SYNTHETIC 16-node market of each zone: four 4-node groups of
that zone, group g living its trace g x ``--offset-hours`` later (no 16-node
trace was measured). Prints one Markdown table per gang size.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from spotd.simulate.gang_repair import (
    GangChangeover,
    GangRepairJob,
    RepairRule,
    RepairSummary,
    cost_against,
    draw_starts,
    replay,
    staggered_market,
    summarize_replay,
)
from spotd.simulate.timeline import TRACES_ENV
from spotd_sim.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
SET = "aws-v100-4node-2023-08"
SPOT_PRICE = 0.918
"""USD per node-hour: p3.2xlarge spot, the traces' paper."""
GROUP = 4
"""Nodes of one group of the 4-node set."""

COLUMNS = (
    "zone", "rule", "finished", "losses/job", "nodes lost/job", "resume mean h",
    "resume p50 h", "resume p90 h", "wall h", "node-h", "cost USD", "cost vs restart",
)


def _cell(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _row(zone: str, s: RepairSummary, vs: float) -> list[str]:
    return [
        zone, s.rule.value, f"{s.finished}/{s.starts}", _cell(s.losses), _cell(s.nodes_lost),
        _cell(s.resume_mean_hours), _cell(s.resume_p50_hours), _cell(s.resume_p90_hours),
        _cell(s.wall_hours, 1),
        _cell(s.node_hours, 1), _cell(s.cost, 2), "-" if math.isnan(vs) else f"{vs:+.1%}",
    ]


def _markdown(rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _table(markets: dict[str, np.ndarray], job: GangRepairJob, tick_hours: float,
           args: argparse.Namespace) -> str:
    rows = []
    horizon = math.floor(job.horizon_hours / tick_hours + 1e-9)
    for zone, values in markets.items():
        starts = draw_starts(len(values), horizon, args.starts, args.seed)
        runs = {rule: replay(values, starts, job, rule, tick_hours) for rule in RepairRule}
        base = runs[RepairRule.RESTART]
        rows += [_row(zone, summarize_replay(run, args.price), cost_against(run, base))
                 for run in runs.values()]
    return _markdown(rows)


def _load(folder: Path) -> tuple[dict[str, np.ndarray], float]:
    markets: dict[str, np.ndarray] = {}
    gaps = set()
    for path in sorted(folder.glob("*.json")):
        trace = load_trace(path)
        gaps.add(trace.gap_seconds)
        markets[path.stem.split("_")[0]] = np.asarray(trace.values, dtype=np.int64)
    if not markets or len(gaps) != 1:
        raise SystemExit(f"{folder}: expected trace files sharing one tick, found {len(markets)}")
    return markets, gaps.pop() / 3600


def main() -> None:
    """Print the 4-node and the synthetic 16-node tables."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    default_traces = Path(os.environ.get(TRACES_ENV) or ROOT.parent / "shared" / "traces")
    p.add_argument("--traces", type=Path, default=default_traces)
    p.add_argument("--starts", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compute-hours", type=float, default=24.0)
    p.add_argument("--checkpoint-hours", type=float, default=1.0)
    p.add_argument("--horizon-days", type=float, default=7.0)
    figures = GangChangeover()
    p.add_argument("--boot-hours", type=float, default=figures.boot_hours)
    p.add_argument("--rendezvous-hours", type=float, default=figures.rendezvous_hours)
    p.add_argument("--restore-hours", type=float, default=figures.restore_hours)
    p.add_argument("--replace-boot-hours", type=float, default=None)
    p.add_argument("--offset-hours", type=float, default=1.0)
    p.add_argument("--price", type=float, default=SPOT_PRICE)
    args = p.parse_args()
    began = time.perf_counter()
    markets, tick_hours = _load(args.traces / SET)
    changeover = GangChangeover(args.boot_hours, args.rendezvous_hours, args.restore_hours,
                                args.replace_boot_hours)
    offset = round(args.offset_hours / tick_hours)
    for nodes, label, market in (
        (GROUP, f"measured 4-node groups ({SET})", markets),
        (4 * GROUP, f"SYNTHETIC: 4 groups of the zone's 4-node trace, {offset} ticks "
                    f"({offset * tick_hours:g} h) apart", {
                        z: staggered_market(v, 4, offset) for z, v in markets.items()}),
    ):
        job = GangRepairJob(nodes, args.compute_hours, args.checkpoint_hours,
                            args.horizon_days * 24, changeover)
        print(f"\n{nodes}-node gang, {label}: {job.compute_hours:g} h compute, checkpoint every "
              f"{job.checkpoint_hours:g} h, changeover {changeover.full_hours:g} h (a replacement "
              f"{changeover.replace_hours:g} h), tick {tick_hours * 3600:g} s, {args.starts} "
              f"starts (seed {args.seed}), horizon {args.horizon_days:g} days, "
              f"{args.price:g} USD per node-hour\n")
        print(_table(market, job, tick_hours, args))
    print(f"\ntotal {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
