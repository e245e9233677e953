"""Helpers for engine and daemon tests: a fast simulated market and a tick loop."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import fsspec

from spotd.core.clock import ManualClock
from spotd.core.errors import NotFoundError, ProviderError
from spotd.core.network import Fabric, Interconnect
from spotd.core.spec import JobSpec
from spotd.core.values import Instance, InstanceState, JobRecord, LaunchRequest, Offering, Pool
from spotd.daemon.config import (
    DaemonSettings,
    ProvidersSettings,
    SchedulingSettings,
    Settings,
)
from spotd.engine.reconcile import Engine
from spotd.store import SqlStore
from spotd_sim import SimSettings

EPOCH = datetime(2026, 3, 2, tzinfo=UTC)


class StepClock:
    """An engine clock that moves only when told (``clock.at += ...``): cooldowns,
    budgets and deadlines come when the test says."""

    def __init__(self) -> None:
        self.at = EPOCH

    def now(self) -> datetime:
        return self.at

    def seconds_to_real(self, seconds: float) -> float:
        return seconds


def fast_settings(
    root: Path,
    *,
    speed: float = 600.0,
    up: float = 50.0,
    db_url: str | None = None,
    owner: str = "test",
    boot_seconds: float = 60,
    **sched: object,
) -> Settings:
    """Settings for a daemon on ``root``: the sim market with rare preemptions by default.
    ``boot_seconds`` is simulated: a tenth of a real second at the default speed."""
    return Settings(
        data_dir=root,
        database_url=db_url or f"sqlite:///{root / 'spotd.db'}",
        daemon=DaemonSettings(port=0, tick_seconds=0.1, owner=owner, reap_every_ticks=3),
        scheduling=SchedulingSettings(**sched),  # type: ignore[arg-type]
        providers=ProvidersSettings(
            sim=SimSettings(
                seed=3, speed=speed, mean_up_hours=up, mean_down_hours=1.0,
                boot_seconds=boot_seconds, epoch=EPOCH,
            )
        ),
    )


def spec(
    code: str = "print('hello')", *, gpus: Sequence[str] = ("A100",), **extra: object
) -> JobSpec:
    """A one-node job running ``python -c code``."""
    body: dict[str, object] = {
        "name": "t",
        "command": [sys.executable, "-c", code],
        "resources": {"gpus": list(gpus), "gpus_per_node": 1},
    }
    body.update(extra)
    return JobSpec.model_validate(body)


FILE_WAIT_GUARD_SECONDS = 600
"""How long a job of :func:`job_until_file` waits for its file before it gives up with
exit code 1: only a guard against a runaway node process, longer than any test's own
safety timeout."""


def job_until_file(path: Path) -> str:
    """Code for :func:`spec` of a job that runs until ``path`` exists, then exits 0.

    The test decides when the job ends, whatever the machine's load: a job of
    ``time.sleep(n)`` may end before a slow test has seen it run or reclaimed its
    node. Every attempt of the job waits for the same file.
    """
    return (
        "import pathlib, sys, time\n"
        f"for _ in range({FILE_WAIT_GUARD_SECONDS * 50}):\n"
        f"    if pathlib.Path({str(path)!r}).exists():\n"
        "        sys.exit(0)\n"
        "    time.sleep(0.02)\n"
        "sys.exit(1)\n"
    )


def run_until(
    engine: Engine,
    job_id: str,
    done: Callable[[JobRecord], bool],
    *,
    timeout: float = 30.0,
) -> JobRecord:
    """Tick the engine until ``done(job)`` holds; fail the test on timeout."""
    limit = time.monotonic() + timeout
    while True:
        engine.tick()
        job = engine.store.get_job(job_id)
        if done(job):
            return job
        if time.monotonic() > limit:
            raise AssertionError(f"job {job_id} stuck in {job.status} after {timeout} s")
        time.sleep(0.05)


@dataclass
class FakeProvider:
    """A scripted provider for engine paths a real market cannot be made to take on cue.

    It tests the engine's reactions, not an adapter: adapters have their own
    contract suite against the real SDKs.
    """

    name: str = "fake"
    launch_errors: list[ProviderError] = field(default_factory=list)
    states: dict[str, InstanceState] = field(default_factory=dict)
    launched: list[LaunchRequest] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    tags: dict[str, Mapping[str, str]] = field(default_factory=dict)
    exit_codes: dict[str, int] = field(default_factory=dict)

    def offerings(self) -> list[Offering]:
        return [
            Offering(
                pool=Pool(self.name, region, f"{region}{zone}", "x1.gpu"),
                gpu="A100", gpus_per_node=1, gpu_memory_gb=80,
                interconnect=Interconnect(Fabric.ETHERNET, 25),
                spot_price=price, on_demand_price=3.0, capacity=1.0,
            )
            for region, zone, price in (("r1", "a", 1.0), ("r1", "b", 1.1), ("r2", "a", 1.2))
        ]

    def launch(self, request: LaunchRequest) -> list[Instance]:
        if self.launch_errors:
            raise self.launch_errors.pop(0)
        self.launched.append(request)
        ids = [f"{request.client_token}-{n}" for n in range(request.nodes)]
        for iid in ids:
            self.states.setdefault(iid, InstanceState.RUNNING)
            self.tags[iid] = request.tags
        return [self._instance(i, request.offering.pool) for i in ids]

    def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        pool = self.offerings()[0].pool
        return [self._instance(i, pool) for i in instance_ids if i in self.states]

    def list_instances(self, tags: Mapping[str, str]) -> list[Instance]:
        pool = self.offerings()[0].pool
        return [
            self._instance(i, pool)
            for i, t in self.tags.items()
            if all(t.get(k) == v for k, v in tags.items())
        ]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        for iid in instance_ids:
            if iid in self.states and self.states[iid] is not InstanceState.EXITED:
                self.states[iid] = InstanceState.TERMINATED
            self.terminated.append(iid)

    def logs(self, instance_id: str) -> str:
        if instance_id not in self.states:
            raise NotFoundError(instance_id, provider=self.name)
        return ""

    def _instance(self, iid: str, pool: Pool) -> Instance:
        from spotd.core.values import Market

        inst = Instance(id=iid, pool=pool, market=Market.SPOT, state=self.states[iid])
        return replace(inst, exit_code=self.exit_codes.get(iid), tags=dict(self.tags.get(iid, {})))


def ticks_until(
    engine: Engine,
    clock: ManualClock,
    job_id: str,
    done: Callable[[JobRecord], bool],
    *,
    tick_seconds: float = 60.0,
    passes: int = 400,
) -> JobRecord:
    """Pass and move ``clock`` on by ``tick_seconds`` until ``done(job)`` holds: an engine on
    the in-process market, whose every step the test's clock decides. Fails after
    ``passes`` passes, with the job's events."""
    for _ in range(passes):
        engine.market.refresh_all()
        engine.tick()
        job = engine.store.get_job(job_id)
        if done(job):
            return job
        clock.advance(tick_seconds)
    raise AssertionError(f"{job_id} never got there: {engine.store.events(job_id)}")


@contextmanager
def memory_checkpoints(name: str) -> Iterator[str]:
    """A checkpoint URI in fsspec's in-memory filesystem, of its own, removed at the end."""
    root = f"spotd-{name}-{uuid.uuid4().hex}"
    try:
        yield f"memory://{root}/ck"
    finally:
        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)


def count_job_loads(store: SqlStore) -> list[list[str]]:
    """Record each read of job records from ``store`` (the ids, sorted), to tell which jobs
    a pass stepped: the list fills as the engine reads."""
    loads: list[list[str]] = []
    read = store.jobs_by_id

    def counting(job_ids: Collection[str]) -> dict[str, JobRecord]:
        loads.append(sorted(job_ids))
        return read(job_ids)

    store.jobs_by_id = counting  # type: ignore[method-assign]
    return loads
