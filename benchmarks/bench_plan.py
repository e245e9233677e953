"""Benchmark: plan time over a 20,000-offering catalog, and placing 1,000 pending jobs.

Run: python benchmarks/bench_plan.py [--offerings 20000] [--jobs 1000] [--policy balanced]
Prints figures; asserts nothing (goals: median plan < 50 ms, 1,000 jobs < 2 s on 2 cores).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from spotd.core.network import Fabric, Interconnect
from spotd.core.spec import DeadlineSpec, JobSpec, MarketMode
from spotd.core.values import Market, Offering, PlacementContext, Pool
from spotd.market.cache import OfferingIndex
from spotd.registry import load_policy

GPUS = {"H100": 8, "A100": 8, "L40S": 1, "L4": 1, "B200": 8, "A10G": 1}
NOW = datetime(2026, 11, 29, tzinfo=UTC)


def catalog(n: int, rng: random.Random) -> list[Offering]:
    """``n`` made-up offerings over 3 providers, 30 regions, 3 zones each, many types."""
    out = []
    for i in range(n):
        gpu = rng.choice(list(GPUS))
        per_node = GPUS[gpu]
        od = rng.uniform(0.5, 12) * per_node
        provider = rng.choice(["aws", "gcp", "azure"])
        region = f"r{rng.randrange(30)}"
        out.append(
            Offering(
                pool=Pool(provider, region, f"{region}-{rng.choice('abc')}", f"type-{i}"),
                gpu=gpu,
                gpus_per_node=per_node,
                gpu_memory_gb=80,
                interconnect=Interconnect(
                    rng.choice(list(Fabric)), rng.choice([10, 25, 50, 100, 200, 400, 800])
                ),
                spot_price=od * rng.uniform(0.25, 0.6) if rng.random() < 0.9 else None,
                on_demand_price=od,
                capacity=rng.choice([None, 0.0, 0.3, 0.7, 1.0]),
            )
        )
    return out


def job(i: int, rng: random.Random) -> JobSpec:
    gpu = rng.choice(list(GPUS))
    return JobSpec.model_validate(
        {
            "name": f"job-{i}",
            "command": ["true"],
            "resources": {
                "gpus": [gpu],
                "gpus_per_node": GPUS[gpu],
                "nodes": rng.choice([1, 1, 2, 4]),
                "model_size_b": rng.choice([1.0, 7.0, 13.0, 70.0]),
            },
            "market": {"type": rng.choice(["spot", "on-demand", "auto"])},
            "deadline": {"compute_hours": rng.uniform(1, 100)},
        }
    )


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--offerings", type=int, default=20_000)
    args.add_argument("--jobs", type=int, default=1_000)
    args.add_argument("--policy", default="balanced")
    args.add_argument("--seed", type=int, default=1)
    opts = args.parse_args()
    rng = random.Random(opts.seed)  # noqa: S311 - a seeded, repeatable catalog, not a secret
    raw = catalog(opts.offerings, rng)
    policy = load_policy(opts.policy)
    # The daemon indexes each market snapshot once, when a poll brings it.
    start = time.perf_counter()
    offerings = OfferingIndex(raw)
    offerings.bucket("H100", 8, Market.SPOT)
    print(f"index of {len(raw):,} offerings built in {(time.perf_counter() - start) * 1000:.1f} ms")

    times = []
    for i in range(30):
        spec = job(i, rng)
        start = time.perf_counter()
        policy.place(PlacementContext(job_id=f"j{i}", spec=spec, now=NOW), offerings)
        times.append(time.perf_counter() - start)
    print(
        f"{opts.policy}: plan over {len(offerings):,} offerings: "
        f"median {statistics.median(times) * 1000:.1f} ms, "
        f"p90 {statistics.quantiles(times, n=10)[-1] * 1000:.1f} ms (30 plans)"
    )

    # Pending jobs are placed one after the other against the same snapshot,
    # as one reconcile pass does.
    specs = [job(i, rng) for i in range(opts.jobs)]
    start = time.perf_counter()
    placed = 0
    for i, spec in enumerate(specs):
        decision = policy.place(PlacementContext(job_id=f"p{i}", spec=spec, now=NOW), offerings)
        placed += decision.choice is not None
    elapsed = time.perf_counter() - start
    print(f"{opts.policy}: placed {placed:,} of {opts.jobs:,} pending jobs in {elapsed:.2f} s")

    # `spotd plan` also explains every other offering: the full ranking.
    times = []
    for i in range(10):
        decision = policy.place(PlacementContext(job_id=f"f{i}", spec=job(i, rng), now=NOW),
                                offerings)
        start = time.perf_counter()
        count = len(decision.candidates)
        times.append(time.perf_counter() - start)
    print(f"{opts.policy}: full ranking of {count:,} candidates (spotd plan): "
          f"median {statistics.median(times) * 1000:.0f} ms")

    # A job with a deadline on market "auto" gets its plan solved on first placement.
    times = []
    for i in range(5):
        spec = job(i, rng).model_copy(update={
            "market": job(i, rng).market.model_copy(update={"type": MarketMode.AUTO}),
            "deadline": DeadlineSpec(compute_hours=48.0, finish_by=NOW + timedelta(hours=60)),
        })
        start = time.perf_counter()
        policy.place(PlacementContext(job_id=f"d{i}", spec=spec, now=NOW), offerings)
        times.append(time.perf_counter() - start)
    print(f"{opts.policy}: first placement of a 48 h job due in 60 h (plan solved): "
          f"median {statistics.median(times) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
