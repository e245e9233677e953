"""Benchmark: the reconcile loop with 10,000 active jobs over a 20,000-offering market.

Run: python benchmarks/engine_scale.py [--jobs 10000] [--offerings 20000] [--ticks 20]
[--profile 25]
Prints the tick time (p50, p99) once every job runs, and the resident memory (now and
at its peak, which the placing passes set). ``--profile N`` then profiles as many
steady passes again and prints the N functions they spent the most time in.

The instances are those of an in-memory provider: 10,000 real processes (what
the simulated market would start) do not fit on a 2-core machine, and what
is measured here is the daemon, not the jobs. Everything else is the real
thing: the SQL store on SQLite (WAL) in a temporary folder, the engine, the
``balanced`` policy, the market cache and its index. A gang's nodes report what
their agents would (joined, preflight passed, command started) through the
store, as the agent routes do, so two-node jobs reach ``running`` too.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from spotd.core.agent_wire import PreflightFigures
from spotd.core.clock import WallClock
from spotd.core.contracts import HistoryStore
from spotd.core.network import Fabric, Interconnect
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import (
    Instance,
    InstanceReport,
    InstanceState,
    LaunchRequest,
    Offering,
    Pool,
)
from spotd.engine.reconcile import Engine
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB, EngineSettings
from spotd.store import open_store
from spotd_policies.balanced import BalancedPolicy

GPUS = {"H100": 8, "A100": 8, "L40S": 1, "L4": 1}


class MemoryProvider:
    """Instances as dict entries; every one runs until terminated."""

    def __init__(self, name: str, offerings: list[Offering], store: HistoryStore) -> None:
        self.name = name
        self._offerings = offerings
        self._store = store
        self._instances: dict[str, Instance] = {}
        self._tokens: dict[str, list[str]] = {}

    def offerings(self) -> list[Offering]:
        return self._offerings

    def launch(self, request: LaunchRequest) -> list[Instance]:
        ids = self._tokens.get(request.client_token)
        if ids is None:
            ids = [f"{request.client_token}-{n}" for n in range(request.nodes)]
            self._tokens[request.client_token] = ids
            for iid in ids:
                self._instances[iid] = Instance(
                    iid, request.offering.pool, request.market, InstanceState.RUNNING,
                    tags=dict(request.tags),
                )
            if request.nodes > 1:
                self._agents_of(request, ids)
        return [self._instances[i] for i in ids]

    def _agents_of(self, request: LaunchRequest, ids: list[str]) -> None:
        """What a gang's agents report once it assembled and passed its preflight."""
        now = datetime.now(UTC)
        passed = PreflightFigures(passed=True, world_size=len(ids)).model_dump_json()
        for n, iid in enumerate(ids):
            self._store.save_report(InstanceReport(
                iid, self.name, request.tags[TAG_JOB], int(request.tags[TAG_ATTEMPT]),
                heartbeat_at=now, address=f"127.0.0.{n + 1}", ports="29500,29501",
                joined_at=now, preflight=passed, command_at=now,
            ))  # fmt: skip

    def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        return [self._instances[i] for i in instance_ids if i in self._instances]

    def list_instances(self, tags: Mapping[str, str]) -> list[Instance]:
        return [i for i in self._instances.values() if tags.items() <= i.tags.items()]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        for iid in instance_ids:
            self._instances.pop(iid, None)

    def logs(self, instance_id: str) -> str:
        return ""


def market(n: int, rng: random.Random) -> dict[str, list[Offering]]:
    by_provider: dict[str, list[Offering]] = {"aws": [], "gcp": [], "azure": []}
    for i in range(n):
        provider = rng.choice(list(by_provider))
        gpu = rng.choice(list(GPUS))
        od = rng.uniform(1, 12) * GPUS[gpu]
        region = f"r{rng.randrange(20)}"
        by_provider[provider].append(Offering(
            pool=Pool(provider, region, f"{region}-{rng.choice('abc')}", f"t{i}"),
            gpu=gpu, gpus_per_node=GPUS[gpu], gpu_memory_gb=80,
            interconnect=Interconnect(rng.choice(list(Fabric)), rng.choice([25, 200, 400, 800])),
            spot_price=od * rng.uniform(0.3, 0.5), on_demand_price=od, capacity=1.0,
        ))  # fmt: skip
    return by_provider


def job_spec(i: int, rng: random.Random, folder: Path) -> JobSpec:
    """The benchmarks' job ``i``: one or two nodes of one of four GPU kinds."""
    gpu = rng.choice(list(GPUS))
    return JobSpec.model_validate({
        "name": f"job-{i}", "command": ["true"],
        "resources": {"gpus": [gpu], "gpus_per_node": GPUS[gpu], "nodes": rng.choice([1, 2]),
                      "model_size_b": 3},
        "checkpoint": {"uri": str(folder / "ck" / str(i))},
    })  # fmt: skip


def rss_mib(field: str = "VmRSS") -> float:
    """Resident memory now (``VmRSS``) or at its peak (``VmHWM``), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--jobs", type=int, default=10_000)
    args.add_argument("--offerings", type=int, default=20_000)
    args.add_argument("--ticks", type=int, default=20)
    args.add_argument("--profile", type=int, default=0, metavar="N",
                      help="profile --ticks more steady passes; print the top N functions")
    opts = args.parse_args()
    # The database and checkpoint folders (tens of MB) go when the run ends.
    with tempfile.TemporaryDirectory(prefix="spotd-scale-") as tmp:
        run(opts, Path(tmp))


def run(opts: argparse.Namespace, folder: Path) -> None:
    """Submit the jobs, place them all, then time the steady passes."""
    rng = random.Random(7)  # noqa: S311 - a seeded, repeatable workload, not a secret
    store = open_store(f"sqlite:///{folder / 'spotd.db'}")
    providers = {
        name: MemoryProvider(name, offs, store)
        for name, offs in market(opts.offerings, rng).items()
    }
    engine = Engine(
        store, providers, BalancedPolicy(), WallClock(),
        EngineSettings(owner="bench", lease_seconds=3600, checkpoints_dir=folder / "ck",
                       replan_seconds=1e9),
    )  # fmt: skip
    start = time.perf_counter()
    for i in range(opts.jobs):
        engine.submit(job_spec(i, rng, folder))
    print(f"submitted {opts.jobs:,} jobs in {time.perf_counter() - start:.1f} s")

    start = time.perf_counter()
    placing = 0
    while True:
        engine.tick()
        placing += 1
        running = len(store.list_jobs([JobStatus.RUNNING]))
        if running == opts.jobs or placing > 10:
            break
    print(f"{running:,} jobs running after {placing} passes, {time.perf_counter() - start:.1f} s")

    times = []
    for _ in range(opts.ticks):
        t0 = time.perf_counter()
        engine.tick()
        times.append(time.perf_counter() - t0)
    times.sort()
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    print(
        f"steady pass over {opts.jobs:,} running jobs, {opts.offerings:,} offerings: "
        f"p50 {statistics.median(times):.3f} s, p99 {p99:.3f} s ({opts.ticks} passes)"
    )
    print(f"resident memory: {rss_mib():.0f} MiB, peak {rss_mib('VmHWM'):.0f} MiB "
          f"(python {sys.version.split()[0]})")
    if opts.profile:
        profile(engine, opts.ticks, opts.profile)
    store.close()


def profile(engine: Engine, ticks: int, top: int) -> None:
    """Where the time of ``ticks`` more steady passes goes (after the timed ones: the
    profiler's own cost would be in the figures)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(ticks):
        engine.tick()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    print(f"profile of {ticks} more steady passes (cumulative):")
    print(out.getvalue())


if __name__ == "__main__":
    main()
