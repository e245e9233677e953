"""Run every shipped scenario and print Markdown result tables (for docs/benchmarks.md).

Usage: python benchmarks/simulate_scenarios.py [--policy NAME ...] [--traces DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from spotd.simulate.cli import COLUMNS, job_title, table_rows
from spotd.simulate.runner import run_scenario

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    """Run the scenarios in order and print one Markdown table per job, then the total time."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", action="append", default=[])
    parser.add_argument("--traces", type=Path, default=None)
    args = parser.parse_args()
    began = time.perf_counter()
    for path in sorted((ROOT / "scenarios").glob("*.toml")):
        report = run_scenario(path, args.policy, traces=args.traces)
        for job in report.jobs:
            print(f"\n{job_title(report, job)} ({job.seconds:.1f} s)\n")
            print("| " + " | ".join(COLUMNS) + " |")
            print("|" + "---|" * len(COLUMNS))
            for row in table_rows(job):
                print("| " + " | ".join(row) + " |")
    print(f"\ntotal {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
