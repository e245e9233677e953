"""Benchmark: jobs placed per second by 1, 2 and 3 engines sharing one PostgreSQL database.

Run: python benchmarks/daemons_throughput.py [--jobs 600] [--offerings 4000] [--daemons 1 2 3]
      [--pg postgresql+psycopg://postgres@127.0.0.1:5432/postgres]

For each daemon count a fresh database is made, ``--jobs`` jobs are submitted
pending, and that many engine processes (each its own owner, as separate
daemons are) start together and pass until no job is left pending. Printed:
the wall time from the start signal to the last placement, jobs placed per
second, and how the jobs split between the engines.

Each engine is the real :class:`~spotd.engine.reconcile.Engine` with the
``balanced`` policy and the real SQL store on PostgreSQL; the instances are
those of the in-memory provider of ``engine_scale.py`` (each engine knows only
the instances it launched, which is all a daemon needs of the jobs it leases).
On a 2-core machine three engines compete for two cores with the database
server: the figure says what the split buys there, not on three hosts.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, make_url, text

sys.path.insert(0, str(Path(__file__).parent))
from engine_scale import MemoryProvider, job_spec, market

from spotd.core.clock import WallClock
from spotd.core.states import JobStatus
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd.store.base import make_engine
from spotd.store.coordination import Coordinator
from spotd_policies.balanced import BalancedPolicy

SEED = 7
TICK_SECONDS = 0.1


@contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """A new, empty PostgreSQL database (dropped afterwards); yields its URL."""
    name = f"spotd_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def submit(url: str, jobs: int, folder: Path, offerings: int) -> None:
    """``jobs`` pending jobs, the engine_scale mix (one- and two-node, four GPU kinds)."""
    rng = random.Random(SEED)  # noqa: S311 - a repeatable workload, not a secret
    store = open_store(url)
    engine = _engine(store, "submitter", folder, offerings=offerings)
    for i in range(jobs):
        engine.submit(job_spec(i, rng, folder))
    store.close()


def _engine(store: object, owner: str, folder: Path, *, offerings: int) -> Engine:
    # The same seeded market in every engine: they are daemons on one cloud.
    rng = random.Random(SEED)  # noqa: S311
    providers = {
        name: MemoryProvider(name, offs, store)  # type: ignore[arg-type]
        for name, offs in market(offerings, rng).items()
    }
    return Engine(
        store,  # type: ignore[arg-type]
        providers,  # type: ignore[arg-type]
        BalancedPolicy(),
        WallClock(),
        EngineSettings(owner=owner, lease_seconds=600, checkpoints_dir=folder / "ck",
                       replan_seconds=1e9),
    )  # fmt: skip


def worker(url: str, owner: str, folder: str, offerings: int, *, go: object, out: object) -> None:
    """One daemon's engine: build, wait for the start signal, pass until none is pending."""
    store = open_store(url)
    engine = _engine(store, owner, Path(folder), offerings=offerings)
    # As a daemon does: an owner lock, by which the others count it alive.
    coordinator = Coordinator(make_engine(url))
    coordinator.claim_daemon(Path(folder) / owner, owner)
    engine.announce()
    engine.peers = coordinator.live_daemons
    engine.market.refresh_all()  # the first poll, before the clock starts; a pass would claim
    out.put(("ready", owner, 0.0))  # type: ignore[attr-defined]
    go.wait()  # type: ignore[attr-defined]
    passes = 0
    while store.list_jobs([JobStatus.PENDING]):
        engine.tick()
        passes += 1
        # A daemon passes every daemon.tick_seconds, not flat out: one that has
        # placed its share must leave the cores to the others.
        time.sleep(TICK_SECONDS)
    out.put(("done", owner, float(passes)))  # type: ignore[attr-defined]
    coordinator.release()
    store.close()


def _collect(out: object, procs: list[mp.process.BaseProcess], kind: str, timeout: float) -> None:
    """Wait for ``kind`` from every engine; stop at once if one of them died."""
    limit = time.monotonic() + timeout
    seen = 0
    while seen < len(procs):
        try:
            got, owner, _ = out.get(timeout=1)  # type: ignore[attr-defined]
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > limit:
                for proc in procs:
                    proc.kill()
                raise SystemExit(f"an engine died or hung waiting for {kind!r}: {dead}") from None
            continue
        assert got == kind, (got, owner)
        seen += 1


def run_once(admin_url: str, daemons: int, jobs: int, offerings: int) -> tuple[float, Counter[str]]:
    """Seconds from the start signal until no job is pending, and the jobs per owner."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="spotd-daemons-") as tmp, \
            fresh_database(admin_url) as url:  # fmt: skip
        submit(url, jobs, Path(tmp), offerings)  # stores them; it never passes, so claims none
        go, out = ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(
                target=worker,
                args=(url, f"bench-{n}", tmp, offerings),
                kwargs={"go": go, "out": out},
            )
            for n in range(daemons)
        ]
        for proc in procs:
            proc.start()
        _collect(out, procs, "ready", timeout=600)
        began = time.perf_counter()
        go.set()
        _collect(out, procs, "done", timeout=1800)
        took = time.perf_counter() - began
        for proc in procs:
            proc.join(timeout=60)
        store = open_store(url)
        owners = Counter(str(j.owner) for j in store.list_jobs())
        store.close()
    return took, owners


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--jobs", type=int, default=600)
    args.add_argument("--offerings", type=int, default=4000)
    args.add_argument("--daemons", type=int, nargs="+", default=[1, 2, 3])
    args.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    opts = args.parse_args()
    print(f"{opts.jobs:,} pending jobs, {opts.offerings:,} offerings, PostgreSQL at "
          f"{make_url(opts.pg).host}:{make_url(opts.pg).port}")  # fmt: skip
    base = None
    for daemons in opts.daemons:
        took, owners = run_once(opts.pg, daemons, opts.jobs, opts.offerings)
        rate = opts.jobs / took
        base = base or rate
        split = ", ".join(f"{owner} {count}" for owner, count in sorted(owners.items()))
        print(f"{daemons} daemon(s): all placed in {took:.1f} s, {rate:.0f} jobs/s "
              f"({rate / base:.2f}x), split: {split}")  # fmt: skip


if __name__ == "__main__":
    main()
