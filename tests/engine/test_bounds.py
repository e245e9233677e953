"""A job never holds up the others: not one whose every pass fails, nor one at the
spec's bounds (spotd.core.limits), which the engine computes with without error."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from engine_support import EPOCH, FakeProvider, fast_settings, run_until, spec
from hypothesis import given, settings
from hypothesis import strategies as st

from spotd.core import limits
from spotd.core.cadence import checkpoint_interval
from spotd.core.network import Fabric, Interconnect
from spotd.core.progress import work_per_hour
from spotd.core.spec import JobSpec
from spotd.core.spec_io import spec_from_json, spec_to_json
from spotd.core.states import JobStatus
from spotd.core.values import (
    AttemptRecord,
    Decision,
    InstanceState,
    JobRecord,
    Market,
    Offering,
    PlacementContext,
    Pool,
)
from spotd.daemon.wiring import build_engine
from spotd.engine.gang import assembly_seconds
from spotd.engine.launching import job_environment, max_run_seconds
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies.balanced import BalancedPolicy
from spotd_policies.cheapest import CheapestPolicy

UNEXPECTED = "unexpected error; the daemon goes on"


class FailingFor:
    """The cheapest policy, except that placing the jobs in ``failing`` raises every
    time (a bug): what a pass meets when one job's step goes wrong in a way no one
    foresaw. ``asked`` lists the jobs it was asked to place, in order."""

    name = "failing-for"

    def __init__(self) -> None:
        self.failing: set[str] = set()
        self.asked: list[str] = []
        self._cheapest = CheapestPolicy()

    def place(self, ctx: PlacementContext, offerings: Sequence[Offering]) -> Decision:
        self.asked.append(ctx.job_id)
        if ctx.job_id in self.failing:
            raise RuntimeError(f"a bug placing {ctx.job_id}")
        return self._cheapest.place(ctx, offerings)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Engine, FakeProvider, FailingFor]]:
    """An engine on the scripted provider, with a policy that fails for chosen jobs."""
    from spotd_sim import SimClock

    provider = FakeProvider()
    policy = FailingFor()
    store = open_store(f"sqlite:///{tmp_path / 'b.db'}")
    eng = Engine(
        store, {"fake": provider}, policy, SimClock(tmp_path / "clock", 3600.0),
        EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck", cooldown_hours=100.0),
    )  # fmt: skip
    yield eng, provider, policy
    store.close()


def _failures(caplog: pytest.LogCaptureFixture, job_id: str) -> int:
    """How many passes logged an unexpected error for ``job_id``."""
    said = f"job {job_id}: {UNEXPECTED}"
    return sum(1 for r in caplog.records if r.getMessage() == said)


def _run_beside(
    eng: Engine, provider: FakeProvider, bad: JobRecord, caplog: pytest.LogCaptureFixture
) -> JobRecord:
    """Submit a job beside ``bad`` and pass until it has succeeded: every pass that steps
    it must step ``bad`` too, and fail on it. Returns the good job."""
    good = eng.submit(spec())
    seen: list[JobStatus] = []
    for passes in range(1, 11):
        eng.tick()
        assert _failures(caplog, bad.id) == passes, "bad failed on every pass"
        good = eng.store.get_job(good.id)
        seen.append(good.status)
        if good.status is JobStatus.RUNNING:
            (attempt,) = eng.store.attempts(good.id)
            # The command ends: the next pass closes the job.
            provider.states[attempt.instance_ids[0]] = InstanceState.EXITED
            provider.exit_codes[attempt.instance_ids[0]] = 0
        if good.status.terminal:
            break
    assert seen[:3] == [JobStatus.PROVISIONING, JobStatus.RUNNING, JobStatus.SUCCEEDED], seen
    assert good.status is JobStatus.SUCCEEDED
    return good


def test_a_job_whose_every_pass_raises_does_not_hold_up_the_others(
    engine: tuple[Engine, FakeProvider, FailingFor], caplog: pytest.LogCaptureFixture
) -> None:
    eng, provider, policy = engine
    caplog.set_level(logging.ERROR, logger="spotd.engine.reconcile")
    # Higher priority: each pass steps it first, so an error it let out of its step
    # would end the pass before the other job's turn.
    bad = eng.submit(spec(priority=10))
    policy.failing.add(bad.id)
    good = _run_beside(eng, provider, bad, caplog)
    assert policy.asked[:2] == [bad.id, good.id], "the failing job went first"
    assert eng.store.get_job(bad.id).status is JobStatus.PENDING
    assert eng.store.attempts(bad.id) == []


def test_a_stored_job_beyond_the_bounds_fails_alone(
    engine: tuple[Engine, FakeProvider, FailingFor], caplog: pytest.LogCaptureFixture
) -> None:
    # The job: stored (here, before the bounds) with a 1e308 GB checkpoint, its
    # interval is infinite and its environment cannot be built, on every pass.
    eng, provider, _policy = engine
    caplog.set_level(logging.ERROR, logger="spotd.engine.reconcile")
    stored = json.loads(spec_to_json(spec(priority=10)))
    stored["checkpoint"]["size_gb"] = 1e308
    bad = eng.store.create_job(spec_from_json(json.dumps(stored)), now=eng.clock.now())
    _run_beside(eng, provider, bad, caplog)
    raised = [r.exc_info[1] for r in caplog.records if r.exc_info and bad.id in r.getMessage()]
    assert raised and all(isinstance(e, OverflowError) for e in raised), raised
    launched = {r.tags["spotd-job"] for r in provider.launched}
    assert bad.id not in launched


def test_a_job_at_the_bounds_of_what_a_node_execs_runs(tmp_path: Path) -> None:
    # [env], one [fabric_env] table and the command at their bounds in all, each string at
    # its own: the simulated node execs it as a cloud's would (no "Argument list too long").
    value = "v" * (limits.MAX_ARG_BYTES - 4)  # "Vn=" + value + NUL: 32768 bytes
    env = {f"V{n}": value for n in range(limits.MAX_ENV_BYTES // limits.MAX_ARG_BYTES)}
    fabric = {f"F{n}": value for n in range(limits.MAX_FABRIC_ENV_BYTES // limits.MAX_ARG_BYTES)}
    code = "import os, sys; print('exec ok', len(sys.argv), len(os.environ['V7']))"
    head = [sys.executable, "-c", code]
    room = limits.MAX_COMMAND_BYTES - sum(len(a.encode()) + 1 for a in head)
    args = ["a" * (limits.MAX_ARG_BYTES - 1)] * (room // limits.MAX_ARG_BYTES)
    args.append("b" * (room - len(args) * limits.MAX_ARG_BYTES - 1))
    job_spec = spec(env=env, fabric_env={f.value: fabric for f in Fabric}, command=head + args)
    assert sum(len(a.encode()) + 1 for a in job_spec.command) == limits.MAX_COMMAND_BYTES
    eng = build_engine(fast_settings(tmp_path))
    try:
        job = eng.submit(job_spec)
        job = run_until(eng, job.id, lambda j: j.status.terminal)
        assert job.status is JobStatus.SUCCEEDED
        (attempt,) = eng.store.attempts(job.id)
        logs = eng.providers[attempt.pool.provider].logs(attempt.instance_ids[0])
        assert f"exec ok {len(job_spec.command) - 2} {len(value)}" in logs
    finally:
        for provider in eng.providers.values():  # leave no node behind, whatever happened
            provider.terminate([i.id for i in provider.list_instances({}) if not i.ended])
        eng.store.close()


# --------------------------------------------------------------------------
# Within the bounds, the engine's arithmetic holds: no overflow, no infinity
# --------------------------------------------------------------------------

SECONDS = int(limits.MAX_DURATION.total_seconds())


def up_to(bound: float) -> st.SearchStrategy[float]:
    """Floats > 0 up to ``bound``, the smallest and the bound itself included."""
    return st.floats(min_value=0.0, max_value=bound, exclude_min=True) | st.sampled_from(
        [5e-324, bound]
    )


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


@st.composite
def bounded_specs(draw: st.DrawFn) -> JobSpec:
    """Specs whose numbers lie anywhere within their bounds, the edges most of all."""
    durations = st.integers(1, SECONDS) | st.sampled_from([1, SECONDS])
    fabric = draw(st.sampled_from(list(Fabric)))
    body: dict[str, Any] = {
        "name": "edge",
        "command": ["python3", "train.py"],
        "fabric_env": {fabric.value: {"NCCL_DEBUG": "INFO"}},
        "resources": {
            "gpus": ["H100"],
            "gpus_per_node": draw(st.integers(1, limits.MAX_GPUS_PER_NODE)),
            "nodes": draw(st.integers(1, limits.MAX_NODES) | st.just(limits.MAX_NODES)),
            "model_size_b": draw(optional(up_to(limits.MAX_MODEL_SIZE_B))),
            "min_gbps_per_gpu": draw(optional(up_to(limits.MAX_GBPS_PER_GPU))),
        },
        "market": {
            "type": draw(st.sampled_from(["spot", "on-demand", "auto"])),
            "max_price_per_gpu_hour": draw(optional(up_to(limits.MAX_PRICE_PER_GPU_HOUR))),
            "max_run_hours": draw(optional(up_to(limits.MAX_RUN_HOURS))),
        },
        "checkpoint": {
            "interval": draw(st.just("auto") | durations),
            "size_gb": draw(
                st.floats(limits.MIN_CHECKPOINT_GB, limits.MAX_CHECKPOINT_GB)
                | st.sampled_from([limits.MIN_CHECKPOINT_GB, limits.MAX_CHECKPOINT_GB])
            ),
            "on_notice": draw(st.booleans()),
        },
        "deadline": {
            "compute_hours": draw(up_to(limits.MAX_COMPUTE_HOURS)),
            "finish_by": draw(
                st.integers(1, 10 * SECONDS).map(lambda s: EPOCH + timedelta(seconds=s))
                | st.just(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))
            ),
        },
        "budget": {"max_usd": draw(up_to(limits.MAX_BUDGET_USD))},
        "gang": {"timeout": draw(durations)},
        "preflight": {
            "timeout": draw(durations),
            "min_busbw_gbps": draw(optional(up_to(limits.MAX_BUSBW_GBPS))),
        },
    }
    return JobSpec.model_validate(body)


@given(
    spec=bounded_specs(),
    fabric=st.sampled_from(list(Fabric)),
    rate=st.just(0.0) | st.floats(min_value=1e-9, max_value=1e3),
    price=st.floats(min_value=0.01, max_value=100.0),
)
@settings(max_examples=60, deadline=None)
def test_a_spec_within_the_bounds_gives_a_launch_and_its_times(
    spec: JobSpec, fabric: Fabric, rate: float, price: float
) -> None:
    # What the engine computes from a spec to place and launch it: the checkpoint
    # interval (``rate`` is what a pool's history can say, none to a thousand an hour),
    # the work an hour does, the nodes' environment, and the times it waits for.
    offering = Offering(
        pool=Pool("fake", "r1", "r1a", "x.gpu"), gpu="H100",
        gpus_per_node=spec.resources.gpus_per_node, gpu_memory_gb=80,
        interconnect=Interconnect(fabric, 400.0), spot_price=price, on_demand_price=price * 3,
        capacity=1.0,
    )  # fmt: skip
    nodes = spec.resources.nodes
    job = JobRecord(
        id="j-edge", name="edge", spec=spec, status=JobStatus.PROVISIONING, failure=None,
        submitted_at=EPOCH, updated_at=EPOCH,
    )  # fmt: skip
    attempt = AttemptRecord(
        id=1, job_id=job.id, seq=1, pool=offering.pool, market=Market.SPOT, nodes=nodes,
        price_per_node_hour=price, client_token="j-edge-a1", instance_ids=(), resume_from=None,
        started_at=EPOCH, running_at=None, ended_at=None, end_reason=None,
    )  # fmt: skip
    interval = checkpoint_interval(spec, rate)
    env = job_environment(
        job, attempt, offering, checkpoint_uri="/ck/j-edge", interval_hours=interval
    )
    assert int(env["SPOTD_CHECKPOINT_INTERVAL_SECONDS"]) >= 0
    assert env["SPOTD_NUM_NODES"] == str(nodes)
    assert 0 < work_per_hour(spec, offering, interval) < float("inf")
    run = max_run_seconds(spec)
    assert run is None or 1 <= run <= limits.MAX_RUN_HOURS * 3600
    # The times the engine adds to a launch or to now: each stays a datetime.
    assert spec.deadline is not None and spec.deadline.compute_hours is not None
    assert EPOCH + timedelta(hours=spec.deadline.compute_hours) >= EPOCH
    assert EPOCH + timedelta(seconds=assembly_seconds(spec)) > EPOCH
    # And the default policy prices and places it, deadline plan and all.
    decision = BalancedPolicy().place(
        PlacementContext(job_id=job.id, spec=spec, now=EPOCH), [offering]
    )
    assert isinstance(decision, Decision)
