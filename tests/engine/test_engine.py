"""The reconcile loop against the simulated market (real processes) and a scripted provider."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import pytest
from engine_support import (
    EPOCH,
    FakeProvider,
    StepClock,
    fast_settings,
    job_until_file,
    run_until,
    spec,
)

from spotd.core.agent_wire import ExitReport, NoticeReport, PreflightCheck, PreflightFigures
from spotd.core.clock import WALL, ManualClock
from spotd.core.errors import (
    AuthError,
    CapacityError,
    InvalidRequestError,
    StoreError,
    SubmitRefused,
    ThrottledError,
)
from spotd.core.states import FailureCause, JobStatus, Transition, transition
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    EventCause,
    EventFacts,
    ExclusionKind,
    Instance,
    InstanceReport,
    InstanceState,
    JobRecord,
    Market,
    Offering,
)
from spotd.daemon.metrics import store_totals
from spotd.daemon.views import job_view
from spotd.daemon.wiring import build_engine
from spotd.engine.reconcile import Engine
from spotd.engine.settings import (
    MISSING_BEFORE_LOST,
    TAG_ATTEMPT,
    TAG_JOB,
    TAG_OWNER,
    EngineSettings,
    checkpoint_uri,
)
from spotd.exits import KeptExit, keep_exit
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy


@pytest.fixture
def engine(tmp_path: Path, store_url: str) -> Iterator[Engine]:
    """An engine on the simulated market, on each store backend."""
    eng = build_engine(fast_settings(tmp_path, db_url=store_url))
    yield eng
    # Leave no VM behind, whatever the test did.
    for provider in eng.providers.values():
        live = [i.id for i in provider.list_instances({}) if not i.ended]
        provider.terminate(live)
    eng.store.close()


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[Engine, FakeProvider]]:
    """An engine on the scripted provider, on a clock that moves only when told (it is
    never told here): cooldowns, budgets and deadlines do not run out between passes,
    however slow the machine."""
    provider = FakeProvider()
    store = open_store(f"sqlite:///{tmp_path / 'f.db'}")
    eng = Engine(
        store, {"fake": provider}, CheapestPolicy(), ManualClock(EPOCH),
        EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"),
    )
    yield eng, provider
    store.close()


PASSES = 50
"""Passes an engine whose clock does not move gets to bring a job somewhere: it takes a
few, and nothing but its passes moves the job, so no wall-clock time bounds them."""


def pass_until(
    eng: Engine, job_id: str, done: Callable[[JobRecord], bool], *, passes: int = PASSES
) -> JobRecord:
    """Tick ``eng`` until ``done(job)`` holds; fail the test after ``passes`` passes."""
    for _ in range(passes):
        eng.tick()
        job = eng.store.get_job(job_id)
        if done(job):
            return job
    raise AssertionError(f"job {job_id} still {job.status} after {passes} passes")


def _running(eng: Engine) -> tuple[JobRecord, AttemptRecord]:
    """A one-node job submitted and passed until it runs, with its one attempt."""
    job = eng.submit(spec())
    job = pass_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING)
    (attempt,) = eng.store.attempts(job.id)
    return job, attempt


def _terminal(job: object) -> bool:
    return getattr(job, "status").terminal  # noqa: B009


def test_job_runs_to_success(engine: Engine, tmp_path: Path) -> None:
    # The command waits until the test has seen it run: one that exits between two
    # passes goes from provisioning straight to succeeded (allowed, and a loaded
    # machine's passes can be that slow), and this test checks every step.
    go = tmp_path / "go"
    job = engine.submit(spec("print('hello from the node', flush=True)\n" + job_until_file(go)))
    run_until(engine, job.id, lambda j: j.status is JobStatus.RUNNING)
    go.touch()
    job = run_until(engine, job.id, _terminal)
    assert job.status is JobStatus.SUCCEEDED
    events = [(e.from_status, e.to_status) for e in engine.store.events(job.id)]
    assert events == [
        (None, JobStatus.PENDING),
        (JobStatus.PENDING, JobStatus.PROVISIONING),
        (JobStatus.PROVISIONING, JobStatus.RUNNING),
        (JobStatus.RUNNING, JobStatus.SUCCEEDED),
    ]
    (attempt,) = engine.store.attempts(job.id)
    assert attempt.end_reason is AttemptEnd.SUCCEEDED
    assert attempt.market is Market.SPOT
    assert attempt.running_at is not None and attempt.ended_at is not None
    assert "hello from the node" in engine.providers[attempt.pool.provider].logs(
        attempt.instance_ids[0]
    )


def test_job_gets_spotd_environment(engine: Engine, tmp_path: Path) -> None:
    code = "import os; print('env', os.environ['SPOTD_JOB_ID'], os.environ['SPOTD_ATTEMPT'])"
    job = engine.submit(spec(code, env={"MY_VAR": "x"}))
    job = run_until(engine, job.id, _terminal)
    (attempt,) = engine.store.attempts(job.id)
    out = engine.providers[attempt.pool.provider].logs(attempt.instance_ids[0])
    assert f"env {job.id} 1" in out


def test_failing_command_fails_the_job(engine: Engine) -> None:
    job = engine.submit(spec("raise SystemExit(3)"))
    job = run_until(engine, job.id, _terminal)
    assert job.status is JobStatus.FAILED
    assert job.failure is FailureCause.USER_COMMAND_FAILED
    (attempt,) = engine.store.attempts(job.id)
    assert attempt.end_reason is AttemptEnd.USER_FAILED
    # Where, then what: the node's id reads as a place, not as the exit code's label.
    last = engine.store.events(job.id)[-1]
    assert last.detail == f"command on {attempt.instance_ids[0]} exited with 3"
    # ...and the same as typed facts, so no reader parses the detail for them.
    assert last.cause is AttemptEnd.USER_FAILED
    assert (last.facts.exit_code, last.facts.signal) == (3, None)
    assert (last.facts.node, last.facts.rank) == (attempt.instance_ids[0], None)  # one node
    assert last.facts.provider == attempt.pool.provider


def test_cancel_stops_the_instance(engine: Engine) -> None:
    job = engine.submit(spec("import time; time.sleep(600)"))
    job = run_until(engine, job.id, lambda j: j.status is JobStatus.RUNNING)
    engine.request_cancel(job.id)
    assert engine.store.get_job(job.id).status is JobStatus.RUNNING, "asked, not done yet"
    engine.tick()  # the pass of the daemon holding the job carries it out
    job = engine.store.get_job(job.id)
    assert job.status is JobStatus.CANCELLED
    (attempt,) = engine.store.attempts(job.id)
    assert attempt.end_reason is AttemptEnd.CANCELLED
    provider = engine.providers[attempt.pool.provider]
    (instance,) = provider.describe(attempt.instance_ids)
    assert instance.state is InstanceState.TERMINATED


def test_impossible_deadline_fails_before_launch(engine: Engine) -> None:
    finish_by = (engine.clock.now() + timedelta(hours=2)).isoformat()
    job = engine.submit(spec(deadline={"compute_hours": 10, "finish_by": finish_by}))
    job = run_until(engine, job.id, _terminal)
    assert job.failure is FailureCause.DEADLINE_IMPOSSIBLE
    assert engine.store.attempts(job.id) == []


def test_budget_stops_a_running_job(engine: Engine) -> None:
    # Placed because the expected cost (0.1 h) fits; stopped when the real one does not.
    job = engine.submit(
        spec(
            "import time; time.sleep(600)",
            budget={"max_usd": 0.5},
            deadline={"compute_hours": 0.1},
        )
    )
    job = run_until(engine, job.id, _terminal)
    assert job.status is JobStatus.FAILED and job.failure is FailureCause.OVER_BUDGET
    (attempt,) = engine.store.attempts(job.id)
    assert attempt.end_reason is AttemptEnd.OVER_BUDGET
    (instance,) = engine.providers[attempt.pool.provider].describe(attempt.instance_ids)
    assert instance.ended


def test_unplaceable_job_waits_then_fails_on_timeout(tmp_path: Path) -> None:
    eng = build_engine(fast_settings(tmp_path, no_capacity_timeout_hours=0.5))
    try:
        job = eng.submit(spec(gpus=["B200"]))
        eng.tick()
        assert eng.store.get_job(job.id).status is JobStatus.PENDING
        decision = eng.placer.decide(eng.store.get_job(job.id))[2]
        assert decision.choice is None
        assert all(
            c.excluded is not None and c.excluded.kind is ExclusionKind.GPU_MODEL
            and "GPU" in c.excluded.detail
            for c in decision.candidates
        )  # fmt: skip
        job = run_until(eng, job.id, _terminal)  # 0.5 simulated hours: 3 real seconds
        assert job.failure is FailureCause.NO_CAPACITY
    finally:
        eng.store.close()


def test_crash_after_attempt_commit_launches_once(engine: Engine, tmp_path: Path) -> None:
    """The attempt row is committed but the daemon died before calling launch."""
    job = engine.submit(spec("import time; time.sleep(1)"))
    decision = engine.placer.decide(job)[2]
    assert decision.choice is not None
    from spotd.core.values import NewAttempt

    choice = decision.choice
    transition(
        engine.store,
        Transition(
            job.id, JobStatus.PENDING, JobStatus.PROVISIONING, EventCause.PLACED,
            open_attempt=NewAttempt(choice.offering.pool, choice.market, 1,
                                    choice.price_per_hour, None),
        ),
        now=engine.clock.now(),
    )
    job = run_until(engine, job.id, _terminal)
    assert job.status is JobStatus.SUCCEEDED
    (attempt,) = engine.store.attempts(job.id)
    launches = (tmp_path / "sim" / "launches.log").read_text().split()
    assert launches.count(attempt.client_token) == 1


def test_reaper_stops_instances_no_attempt_owns(engine: Engine) -> None:
    job = engine.submit(spec("import time; time.sleep(600)"))
    job = run_until(engine, job.id, lambda j: j.status is JobStatus.RUNNING)
    (attempt,) = engine.store.attempts(job.id)
    # Close the attempt behind the engine's back, as a crash after the
    # transition but before the terminate call would leave it.
    from spotd.core.values import AttemptClose

    transition(
        engine.store,
        Transition(job.id, JobStatus.RUNNING, JobStatus.CANCELLED, EventCause.CANCELLED,
                   close_attempt=AttemptClose(attempt.id, AttemptEnd.CANCELLED)),
        now=engine.clock.now(),
    )
    provider = engine.providers[attempt.pool.provider]
    assert not provider.describe(attempt.instance_ids)[0].ended
    assert engine.reap() == 1
    assert provider.describe(attempt.instance_ids)[0].ended
    assert engine.reap() == 0


class _AttemptsUnreadable:
    """The engine's store, with reads of attempts failing as a locked database does."""

    def __init__(self, store: object) -> None:
        self._store = store

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        raise StoreError("database is locked")

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


def test_reaper_leaves_running_instances_alone_when_their_attempts_cannot_be_read(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = fake
    _job, attempt = _running(eng)
    store = eng.store
    eng.store = _AttemptsUnreadable(store)  # type: ignore[assignment]
    assert eng.reap() == 0
    eng.store = store
    assert provider.terminated == []
    assert provider.states[attempt.instance_ids[0]] is InstanceState.RUNNING


class _CannotTerminate(FakeProvider):
    def terminate(self, instance_ids: Collection[str]) -> None:  # type: ignore[override]
        raise ThrottledError("slow down", provider=self.name)


def test_one_providers_failure_to_stop_orphans_does_not_stop_the_reaper(tmp_path: Path) -> None:
    stuck, fine = _CannotTerminate(name="stuck"), FakeProvider(name="fine")
    store = open_store(f"sqlite:///{tmp_path / 'r.db'}")
    eng = Engine(
        store, {"stuck": stuck, "fine": fine}, CheapestPolicy(), ManualClock(EPOCH),
        EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"),
    )  # fmt: skip
    orphan = {TAG_OWNER: "test", TAG_JOB: "j-gone", TAG_ATTEMPT: "1"}
    for provider in (stuck, fine):
        provider.states["i-1"] = InstanceState.RUNNING
        provider.tags["i-1"] = orphan
    assert eng.reap() == 1
    assert fine.terminated == ["i-1"]
    assert stuck.states["i-1"] is InstanceState.RUNNING  # the next reap tries again
    store.close()


class _DescribeBug(FakeProvider):
    def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        raise KeyError("State")  # an SDK reply the adapter failed to map


def test_an_unmapped_describe_error_stalls_only_that_providers_jobs(tmp_path: Path) -> None:
    buggy, fine = _DescribeBug(name="buggy"), FakeProvider(name="fine")
    store = open_store(f"sqlite:///{tmp_path / 'd.db'}")
    eng = Engine(
        store, {"buggy": buggy, "fine": fine}, CheapestPolicy(), ManualClock(EPOCH),
        EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"),
    )  # fmt: skip
    jobs = {name: eng.submit(spec(market={"providers": [name]})) for name in ("buggy", "fine")}
    eng.tick()
    for name, provider in (("buggy", buggy), ("fine", fine)):
        (attempt,) = eng.store.attempts(jobs[name].id)
        assert attempt.pool.provider == name
        provider.exit_codes[attempt.instance_ids[0]] = 0
        provider.states[attempt.instance_ids[0]] = InstanceState.EXITED
    eng.tick()
    assert eng.store.get_job(jobs["fine"].id).status is JobStatus.SUCCEEDED
    assert eng.store.get_job(jobs["buggy"].id).status is JobStatus.PROVISIONING  # waits
    store.close()


def _no_gcsfs() -> None:
    import importlib.util

    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed here: gs:// locations can be opened")


def test_a_checkpoint_location_the_daemon_cannot_open_is_refused_at_submit(
    fake: tuple[Engine, FakeProvider],
) -> None:
    _no_gcsfs()
    eng, _ = fake
    with pytest.raises(SubmitRefused, match=r"^checkpoint\.uri: gs://b/run: needs gcsfs, which"):
        eng.submit(spec(checkpoint={"uri": "gs://b/run"}))
    assert eng.store.list_jobs() == []


def test_a_checkpoint_location_on_proc_is_refused_at_submit_naming_the_field(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, _ = fake
    with pytest.raises(SubmitRefused) as err:
        eng.submit(spec(checkpoint={"uri": "/proc/spotd-ckpt"}))
    assert str(err.value) == (
        "checkpoint.uri: /proc/spotd-ckpt: /proc is on proc, a pseudo filesystem of the "
        "kernel, not storage"
    )
    assert eng.store.list_jobs() == []


def test_a_deadline_already_past_is_refused_at_submit_but_a_stored_one_still_loads(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, _ = fake
    now = eng.clock.now()
    past = spec(deadline={"compute_hours": 1, "finish_by": (now - timedelta(hours=3)).isoformat()})
    with pytest.raises(SubmitRefused) as err:
        eng.submit(past)
    # The daemon's clock has not moved since the line above: exactly 3 h before it.
    assert str(err.value) == (
        "deadline.finish_by: 2026-03-01T21:00:00Z has passed (3 h before now, "
        "2026-03-02T00:00:00Z on the daemon's clock): give a time ahead, or leave "
        "finish_by out"
    )
    assert eng.store.list_jobs() == []
    # A job stored before its deadline passed (a daemon restarted late) is still read,
    # and the engine ends it as it always did, by its deadline, not as a bad spec.
    stored = eng.store.create_job(past, now=now)
    assert eng.store.get_job(stored.id).spec == past
    eng.tick()
    assert eng.store.get_job(stored.id).failure is FailureCause.DEADLINE_IMPOSSIBLE


def test_gpus_no_provider_offers_are_refused_once_every_provider_has_answered(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, _ = fake
    early = eng.submit(spec(gpus=("A1OO",)))  # no poll yet: the market cannot tell
    eng.market.refresh_all()
    with pytest.raises(SubmitRefused) as err:
        eng.submit(spec(gpus=("A1OO", "H1OO")))
    assert str(err.value) == (
        "resources.gpus: no enabled provider offers A1OO, H1OO (offered: A100);"
        " did you mean A100?"
    )
    assert [j.id for j in eng.store.list_jobs()] == [early.id]
    assert eng.submit(spec(gpus=("H100", "A100"))).status is JobStatus.PENDING


def test_a_stored_job_whose_checkpoints_cannot_be_opened_fails_instead_of_waiting(
    fake: tuple[Engine, FakeProvider],
) -> None:
    _no_gcsfs()
    eng, provider = fake
    job = eng.store.create_job(spec(checkpoint={"uri": "gs://b/run"}), now=eng.clock.now())
    eng.tick()
    failed = eng.store.get_job(job.id)
    assert failed.status is JobStatus.FAILED and failed.failure is FailureCause.INVALID_SPEC
    (event,) = [e for e in eng.store.events(job.id) if e.to_status is JobStatus.FAILED]
    assert "gcsfs" in event.detail and provider.launched == []


def test_capacity_error_moves_to_another_pool(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    provider.launch_errors.append(CapacityError("no room", provider="fake"))
    job = eng.submit(spec())
    pass_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING)
    first, second = eng.store.attempts(job.id)
    assert first.end_reason is AttemptEnd.NO_CAPACITY
    assert first.pool.region == "r1"
    (refused,) = [e for e in eng.store.events(job.id) if e.cause is AttemptEnd.NO_CAPACITY]
    assert refused.facts == EventFacts(error_class="CapacityError",
                                       error_code="provider-capacity", provider="fake")  # fmt: skip
    assert second.pool.region == "r2", "the whole region of the failed pool cools down"
    excluded = {
        c.offering.pool.zone: c.excluded
        for c in eng.placer.decide(eng.store.get_job(job.id))[2].candidates
        if c.market is Market.SPOT
    }
    for zone in ("r1a", "r1b"):
        cooled = excluded[zone]
        assert cooled is not None and cooled.kind is ExclusionKind.COOLING_DOWN
        assert cooled.detail.startswith("pool cooling down: no-capacity in r1a")
    assert excluded["r2a"] is None


def test_throttling_defers_the_same_launch(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    provider.launch_errors.append(ThrottledError("slow down", provider="fake"))
    _job, attempt = _running(eng)
    assert [r.client_token for r in provider.launched] == [attempt.client_token]


def test_auth_error_ends_the_attempt_not_the_daemon(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    provider.launch_errors.append(AuthError("expired token", provider="fake"))
    job = eng.submit(spec())
    eng.tick()
    attempts = eng.store.attempts(job.id)
    assert attempts[0].end_reason is AttemptEnd.LAUNCH_FAILED
    assert eng.store.get_job(job.id).status is JobStatus.RECOVERING


def test_a_launch_request_no_pool_can_carry_fails_the_job_at_once(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = fake
    refused = InvalidRequestError("aws launch: the boot script would contain the daemon's token")
    provider.launch_errors.append(refused)
    job = eng.submit(spec())
    eng.tick()
    failed = eng.store.get_job(job.id)
    assert failed.status is JobStatus.FAILED and failed.failure is FailureCause.INVALID_SPEC
    (attempt,) = eng.store.attempts(job.id)
    assert attempt.end_reason is AttemptEnd.LAUNCH_FAILED
    eng.tick()
    assert len(eng.store.attempts(job.id)) == 1, "not placed again"


def test_preemption_recovers_elsewhere(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    job = eng.submit(spec())
    pass_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING)
    (first,) = eng.store.attempts(job.id)
    provider.states[first.instance_ids[0]] = InstanceState.NOTICE
    eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.CHECKPOINTING
    provider.states[first.instance_ids[0]] = InstanceState.PREEMPTED
    job = pass_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING)
    first, second = eng.store.attempts(job.id)
    assert first.end_reason is AttemptEnd.PREEMPTED
    assert second.pool != first.pool
    provider.states[second.instance_ids[0]] = InstanceState.EXITED
    provider.exit_codes[second.instance_ids[0]] = 0
    job = pass_until(eng, job.id, _terminal)
    assert job.status is JobStatus.SUCCEEDED


def test_instances_carry_job_tags(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    job = eng.submit(spec())
    eng.tick()
    (request,) = provider.launched
    assert request.tags == {TAG_JOB: job.id, TAG_ATTEMPT: "1", TAG_OWNER: "test"}
    assert request.env["SPOTD_JOB_ID"] == job.id
    assert request.env["SPOTD_CHECKPOINT_URI"].endswith(job.id)
    # Young's interval for the prior rate and a 1 GB checkpoint: a few minutes.
    assert 60 <= int(request.env["SPOTD_CHECKPOINT_INTERVAL_SECONDS"]) <= 3600
    assert os.path.isabs(request.env["SPOTD_CHECKPOINT_URI"])


def test_lease_lets_a_second_daemon_take_over(tmp_path: Path, store_url: str) -> None:
    """Two daemons on one database: one works a job; when it dies, the other takes over."""
    first = build_engine(fast_settings(tmp_path, db_url=store_url, owner="first"))
    second = build_engine(fast_settings(tmp_path, db_url=store_url, owner="second"))
    try:
        go = tmp_path / "go"  # the job runs until the test lets it end: after the takeover
        job = first.submit(spec(job_until_file(go)))
        run_until(first, job.id, lambda j: j.status is JobStatus.RUNNING)
        second.tick()  # the lease is first's: second must not touch the job
        assert first.store.get_job(job.id).owner == "first"
        assert len(first.store.attempts(job.id)) == 1
        # first stops ticking (dies); once its lease (60 real seconds on the database's
        # clock, whatever the simulated clock says) runs out, second claims.
        lease = first.settings.lease_seconds
        later = WALL.now() + timedelta(seconds=lease + 1)
        assert second.store.claim_jobs("second", now=later, lease_seconds=lease) == [job.id]
        go.touch()
        job = run_until(second, job.id, _terminal)
        assert job.status is JobStatus.SUCCEEDED and job.owner == "second"
        assert len(second.store.attempts(job.id)) == 1, "the running attempt was adopted"
    finally:
        first.store.close()
        second.store.close()


def test_a_node_missing_once_is_not_lost(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    job, attempt = _running(eng)
    state = provider.states.pop(attempt.instance_ids[0])
    eng.tick()
    eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.RUNNING, "two misses are not a loss"
    provider.states[attempt.instance_ids[0]] = state
    eng.tick()
    del provider.states[attempt.instance_ids[0]]
    eng.tick()
    eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.RUNNING, "the count restarts when seen"
    eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.RECOVERING
    assert eng.store.attempts(job.id)[0].end_reason is AttemptEnd.LOST


def test_a_node_stopped_by_someone_else_is_not_success(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = fake
    job, attempt = _running(eng)
    provider.states[attempt.instance_ids[0]] = InstanceState.TERMINATED
    eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.RECOVERING
    assert eng.store.attempts(job.id)[0].end_reason is AttemptEnd.LOST


def test_agent_reports_bring_notice_and_exit_code(fake: tuple[Engine, FakeProvider]) -> None:
    from spotd.core.values import InstanceReport

    eng, provider = fake
    job, attempt = _running(eng)
    iid = attempt.instance_ids[0]
    now = eng.clock.now()
    eng.store.save_report(InstanceReport(iid, "fake", job.id, 1, notice_at=now,
                                         notice_kind="preemption"))
    eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.CHECKPOINTING
    # The cloud only says the VM shut itself down; the agent says how the job ended.
    provider.states[iid] = InstanceState.EXITED
    assert provider.describe([iid])[0].exit_code is None
    eng.store.save_report(InstanceReport(iid, "fake", job.id, 1, exit_code=0, exited_at=now))
    eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.SUCCEEDED


def test_a_vm_that_shut_down_without_a_report_is_recovered(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = fake
    job, attempt = _running(eng)
    provider.states[attempt.instance_ids[0]] = InstanceState.EXITED
    eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.RECOVERING
    assert eng.store.attempts(job.id)[0].end_reason is AttemptEnd.LOST


def test_agent_exit_ends_the_job_while_the_vm_still_runs(
    fake: tuple[Engine, FakeProvider],
) -> None:
    """GCP and Azure show a finished VM as running or stopped: the agent's word decides."""
    from spotd.core.values import InstanceReport

    eng, provider = fake
    job, attempt = _running(eng)
    iid = attempt.instance_ids[0]
    eng.store.save_report(InstanceReport(iid, "fake", job.id, 1, exit_code=0,
                                         exited_at=eng.clock.now()))
    eng.tick()
    assert eng.store.get_job(job.id).status is JobStatus.SUCCEEDED
    assert provider.states[iid] is InstanceState.TERMINATED, "the finished VM is stopped"


def test_exit_after_a_notice_is_a_preemption(fake: tuple[Engine, FakeProvider]) -> None:
    from spotd.core.values import InstanceReport

    eng, provider = fake
    job, attempt = _running(eng)
    iid = attempt.instance_ids[0]
    now = eng.clock.now()
    eng.store.save_report(InstanceReport(iid, "fake", job.id, 1, notice_at=now,
                                         notice_kind="preemption"))
    eng.tick()
    eng.store.save_report(InstanceReport(iid, "fake", job.id, 1, exit_code=143, exited_at=now))
    provider.states[iid] = InstanceState.TERMINATED
    eng.tick()
    assert eng.store.get_job(job.id).status in (JobStatus.RECOVERING, JobStatus.PROVISIONING,
                                                JobStatus.RUNNING)
    assert eng.store.attempts(job.id)[0].end_reason is AttemptEnd.PREEMPTED


def _keep(
    eng: Engine, job: JobRecord, iid: str, code: int, *, noticed: bool = False,
    stopped: bool = False,
) -> None:  # fmt: skip
    """What the node's agent wrote beside the checkpoints when no daemon took its exit."""
    speaker = {"job_id": job.id, "attempt": 1, "instance_id": iid, "provider": "fake",
               "at": eng.clock.now()}  # fmt: skip
    notice = NoticeReport(kind="preemption", **speaker) if noticed else None
    kept = KeptExit(exit=ExitReport(exit_code=code, **speaker), notice=notice, stopped=stopped)
    keep_exit(checkpoint_uri(job, eng.settings), kept)


@pytest.mark.parametrize("state", [InstanceState.PREEMPTED, InstanceState.TERMINATED, None])
def test_a_job_that_finished_unheard_succeeds_whatever_became_of_its_node(
    fake: tuple[Engine, FakeProvider], state: InstanceState | None
) -> None:
    """The job ended with 0 while no daemon listened; then the market took the node
    back (or it was stopped, or it is gone). Its kept exit says it finished."""
    eng, provider = fake
    job, attempt = _running(eng)
    iid = attempt.instance_ids[0]
    _keep(eng, job, iid, 0)
    if state is None:
        del provider.states[iid]
    else:
        provider.states[iid] = state
    job = pass_until(eng, job.id, _terminal)
    assert job.status is JobStatus.SUCCEEDED, eng.store.events(job.id)
    (only,) = eng.store.attempts(job.id)
    assert only.end_reason is AttemptEnd.SUCCEEDED
    assert [r.exit_code for r in eng.store.reports(job.id)] == [0], "stored as if reported"


@pytest.mark.parametrize(
    ("state", "code", "noticed", "stopped", "end"),
    [
        (InstanceState.TERMINATED, 143, True, True, AttemptEnd.PREEMPTED),
        (InstanceState.TERMINATED, 3, False, False, AttemptEnd.USER_FAILED),
        # Killed by the node's own shutdown before its agent saw a notice.
        (InstanceState.PREEMPTED, 143, False, True, AttemptEnd.PREEMPTED),
        # Failed by itself, and only then was the node taken back.
        (InstanceState.PREEMPTED, 3, False, False, AttemptEnd.USER_FAILED),
    ],
)  # fmt: skip
def test_an_unheard_failure_or_preemption_counts_as_it_happened(
    fake: tuple[Engine, FakeProvider], state: InstanceState, code: int, noticed: bool,
    stopped: bool, end: AttemptEnd,
) -> None:  # fmt: skip
    eng, provider = fake
    job, attempt = _running(eng)
    iid = attempt.instance_ids[0]
    _keep(eng, job, iid, code, noticed=noticed, stopped=stopped)
    provider.states[iid] = state
    pass_until(eng, job.id, lambda j: j.status is not JobStatus.RUNNING)
    assert eng.store.attempts(job.id)[0].end_reason is end


def test_a_preempted_node_without_a_kept_exit_is_still_a_preemption(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = fake
    job, attempt = _running(eng)
    provider.states[attempt.instance_ids[0]] = InstanceState.PREEMPTED
    provider.exit_codes[attempt.instance_ids[0]] = 0  # the VM's own code says nothing
    pass_until(eng, job.id, lambda j: j.status is not JobStatus.RUNNING)
    assert eng.store.attempts(job.id)[0].end_reason is AttemptEnd.PREEMPTED


def test_a_job_left_unbilled_by_a_killed_daemon_is_billed_at_its_next_start(
    fake: tuple[Engine, FakeProvider],
) -> None:
    """The daemon recorded the job's end and died before stopping its node and billing
    it: the next daemon of its owner stops the node, bills the job and tells of its
    end, once."""
    eng, provider = fake
    job, attempt = _running(eng)
    iid = attempt.instance_ids[0]
    provider.states[iid], provider.exit_codes[iid] = InstanceState.EXITED, 0
    job = pass_until(eng, job.id, _terminal)
    billed = eng.store.ledger(job_id=job.id)
    assert billed, "the job's end is billed"
    eng.store.replace_ledger(job.id, [])  # as if the daemon died before its bill
    provider.states[iid] = InstanceState.RUNNING  # ...and before stopping its node
    restarted = Engine(eng.store, {"fake": provider}, CheapestPolicy(), eng.clock, eng.settings)
    ended: list[JobRecord] = []
    restarted.on_end = ended.append
    restarted.reap()
    restarted.reap()
    assert provider.states[iid] is InstanceState.TERMINATED
    assert [e.usd for e in eng.store.ledger(job_id=job.id)] == [e.usd for e in billed]
    assert [j.id for j in ended] == [job.id], "told once"
    assert eng.store.unbilled_jobs("test") == []


def test_running_job_moves_when_the_saving_pays(tmp_path: Path) -> None:
    from spotd_policies.balanced import BalancedPolicy

    provider = FakeProvider()
    store = open_store(f"sqlite:///{tmp_path / 'm.db'}")
    eng = Engine(
        store, {"fake": provider}, BalancedPolicy(), ManualClock(EPOCH),
        EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck", replan_seconds=0.0),
    )
    try:
        job = eng.submit(spec(deadline={"compute_hours": 100}))
        pass_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING)
        (first,) = store.attempts(job.id)
        eng.tick()
        assert len(store.attempts(job.id)) == 1, "no move while it is the best place"
        # The pool it runs in gets four times dearer: moving now pays.
        original = provider.offerings
        provider.offerings = lambda: [  # type: ignore[method-assign]
            replace(o, spot_price=4.0) if o.pool == first.pool else o for o in original()
        ]
        eng.market.refresh_all()
        pass_until(eng, job.id, lambda j: len(store.attempts(j.id)) == 2)
        moved = store.attempts(job.id)
        assert moved[0].end_reason is AttemptEnd.MIGRATED
        assert moved[1].pool != first.pool
        assert provider.states[first.instance_ids[0]] is InstanceState.TERMINATED
    finally:
        store.close()


def test_steady_passes_reuse_attempts_and_see_changes_made_elsewhere(
    fake: tuple[Engine, FakeProvider],
) -> None:
    """The engine keeps attempts between passes by job version; a write by another
    daemon or command bumps the version and is read on the next pass."""
    eng, _ = fake
    asked: list[list[str]] = []
    read = eng.store.attempts_for

    def counting(job_ids: Collection[str]) -> dict[str, list[AttemptRecord]]:
        asked.append(sorted(job_ids))
        return read(job_ids)

    eng.store.attempts_for = counting  # type: ignore[method-assign]
    job = eng.submit(spec())
    pass_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING)
    eng.tick()
    asked.clear()
    for _ in range(3):
        eng.tick()
    assert asked == [], "nothing changed, nothing read"

    (attempt,) = eng.store.attempts(job.id)
    eng.store.set_attempt_instances(attempt.id, ["i-gone"])  # not a VM the provider knows
    eng.tick()
    assert asked == [[job.id]]
    for _ in range(MISSING_BEFORE_LOST):
        eng.tick()
    (lost, *_) = eng.store.attempts(job.id)
    assert lost.end_reason is AttemptEnd.LOST, "the pass acted on the new instance list"


# -- gangs: what the agents' reports decide -----------------------------------------


def _report(attempt: AttemptRecord, iid: str, **fields: object) -> InstanceReport:
    return InstanceReport(instance_id=iid, provider=attempt.pool.provider, job_id=attempt.job_id,
                          attempt=attempt.seq, **fields)  # type: ignore[arg-type]  # fmt: skip


def _failed_preflight(check: str) -> str:
    return PreflightFigures(
        passed=False, reason=f"node 0: {check} failed",
        checks=(PreflightCheck(name=check, ok=False, detail="x"),),
    ).model_dump_json()  # fmt: skip


def test_a_failed_preflight_recovers_elsewhere_and_cools_the_pool(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, _ = fake
    job, attempt = _running(eng)
    eng.store.save_report(_report(attempt, attempt.instance_ids[0],
                                  preflight=_failed_preflight("allreduce_busbw")))  # fmt: skip
    job = pass_until(eng, job.id, lambda j: j.status is not JobStatus.RUNNING)
    first = eng.store.attempts(job.id)[0]
    assert first.end_reason is AttemptEnd.PREFLIGHT_FAILED
    assert job.status in (JobStatus.RECOVERING, JobStatus.PROVISIONING)
    assert first.pool in eng.context(job).cooldown


def test_an_unwritable_checkpoint_location_fails_the_job_not_the_pool(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, _ = fake
    job, attempt = _running(eng)
    eng.store.save_report(_report(attempt, attempt.instance_ids[0],
                                  preflight=_failed_preflight("checkpoint_writable")))  # fmt: skip
    job = pass_until(eng, job.id, _terminal)
    assert (job.status, job.failure) == (JobStatus.FAILED, FailureCause.INVALID_SPEC)
    assert eng.store.attempts(job.id)[0].end_reason is AttemptEnd.PREFLIGHT_FAILED


def test_an_agent_that_quit_before_the_command_is_no_user_failure(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = fake
    job, attempt = _running(eng)
    (iid,) = attempt.instance_ids
    # Its preflight figures never arrived; its exit (76, phase preflight) did.
    provider.states[iid] = InstanceState.EXITED
    provider.exit_codes[iid] = 76
    eng.store.save_report(_report(attempt, iid, exit_code=76, exit_phase="preflight",
                                  exited_at=eng.clock.now()))  # fmt: skip
    job = pass_until(eng, job.id, lambda j: j.status is not JobStatus.RUNNING)
    assert job.status is not JobStatus.FAILED
    assert eng.store.attempts(job.id)[0].end_reason is AttemptEnd.PREFLIGHT_FAILED


# -- one cost: the ledger's -----------------------------------------------------------


@dataclass
class PricedFake(FakeProvider):
    """The scripted provider with one offering at 3.6 USD/h: a thousandth of a USD a second."""

    def offerings(self) -> list[Offering]:
        return [replace(o, spot_price=3.6, on_demand_price=9.0) for o in super().offerings()[:1]]


def test_a_budget_is_enforced_at_the_ledgers_figure_not_price_times_time(
    tmp_path: Path,
) -> None:
    """Ten seconds at 3.6 USD/h are 0.01 USD by price x wall time, under the 0.05 USD
    budget; the provider bills a minute at least, 0.06 USD, and the ledger says so:
    the job is stopped at that figure, which is also the one its view, /metrics and
    the job-end hook (called once the last attempt is billed) see."""
    provider = PricedFake()
    clock = StepClock()
    store = open_store(f"sqlite:///{tmp_path / 'f.db'}")
    eng = Engine(store, {"fake": provider}, CheapestPolicy(), clock,
                 EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"))  # fmt: skip
    ended: list[tuple[JobStatus, float]] = []
    eng.on_end = lambda j: ended.append(
        (j.status, sum(e.usd for e in eng.store.ledger(job_id=j.id)))
    )
    try:
        job = eng.submit(spec(budget={"max_usd": 0.05}, deadline={"compute_hours": 0.001}))
        eng.tick()  # placed and launched
        (attempt,) = eng.store.attempts(job.id)
        assert attempt.instance_ids and attempt.price_per_node_hour == pytest.approx(3.6)
        assert eng.context(eng.store.get_job(job.id)).spent_usd == pytest.approx(0.06), (
            "a launched node owes its minute"
        )
        clock.at += timedelta(seconds=10)
        eng.tick()
        job = eng.store.get_job(job.id)
        assert (job.status, job.failure) == (JobStatus.FAILED, FailureCause.OVER_BUDGET)
        (attempt,) = eng.store.attempts(job.id)
        assert attempt.end_reason is AttemptEnd.OVER_BUDGET
        assert attempt.ended_at is not None
        wall = (attempt.ended_at - attempt.started_at).total_seconds() / 3600 * 3.6
        assert wall == pytest.approx(0.01), "price x wall time: under the budget"
        assert eng.store.events(job.id)[-1].detail == "spent 0.06 of 0.05 USD"
        ledger = eng.store.ledger(job_id=job.id)
        assert sum(e.usd for e in ledger) == pytest.approx(0.06)
        assert sum(e.billed_seconds for e in ledger) == pytest.approx(60.0)
        assert ended == [(JobStatus.FAILED, pytest.approx(0.06))], "on_end after the bill"
        assert provider.terminated == list(attempt.instance_ids)

        view = job_view(job, eng.store.attempts(job.id), clock.now(), ledger=ledger)
        assert view.cost_usd == pytest.approx(0.06)
        assert [a.cost_usd for a in view.attempts] == [pytest.approx(0.06)]
        totals = store_totals(eng)()
        assert totals.spent_usd == pytest.approx(0.06)
        # A minute on-demand at 9 USD/h would be 0.15 USD; but the job failed, and a failed
        # job's spend claims no saving (spotd.billing.savings).
        assert totals.savings_usd == pytest.approx(0.0)
        assert view.failure_reason == "over budget: spent 0.06 of 0.05 USD"
    finally:
        store.close()


def test_a_running_jobs_cost_is_its_billed_attempts_plus_the_open_one(tmp_path: Path) -> None:
    """A preempted attempt counts at its stored bill; the open one is billed to now by
    the same rules: its price at placement, a minute at least."""
    provider = FakeProvider()
    clock = StepClock()
    store = open_store(f"sqlite:///{tmp_path / 'f.db'}")
    eng = Engine(store, {"fake": provider}, CheapestPolicy(), clock,
                 EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"))  # fmt: skip
    try:
        job, first = _running(eng)
        assert first.price_per_node_hour == pytest.approx(1.0)
        clock.at += timedelta(minutes=30)
        provider.states[first.instance_ids[0]] = InstanceState.PREEMPTED
        job = pass_until(eng, job.id, lambda j: j.status is JobStatus.RUNNING)
        first, second = eng.store.attempts(job.id)
        assert second.price_per_node_hour == pytest.approx(1.2), "region r1 cools down"
        billed = eng.store.ledger(job_id=job.id)
        assert {e.attempt for e in billed} == {first.seq}
        assert sum(e.usd for e in billed) == pytest.approx(0.5)
        clock.at += timedelta(seconds=10)
        # 0.5 billed + the open attempt's minimum minute at 1.2 USD/h (price x time: 0.5033).
        assert eng.context(job).spent_usd == pytest.approx(0.52)
        view = job_view(job, eng.store.attempts(job.id), clock.now(), ledger=billed)
        assert [a.cost_usd for a in view.attempts] == [pytest.approx(0.5), pytest.approx(0.02)]
        assert view.cost_usd == pytest.approx(0.52)
    finally:
        store.close()


def test_the_launch_carries_the_jobs_max_run_hours(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    limited = eng.submit(spec(market={"max_run_hours": 1.5}))
    pass_until(eng, limited.id, lambda j: j.status is JobStatus.RUNNING)
    free = eng.submit(spec())
    pass_until(eng, free.id, lambda j: j.status is JobStatus.RUNNING)
    by_job = {r.tags[TAG_JOB]: r.max_run_seconds for r in provider.launched}
    assert by_job == {limited.id: 5400, free.id: None}


def test_a_misspelt_gpu_is_refused_even_beside_an_offered_one(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, _ = fake
    eng.market.refresh_all()  # the fake offers A100 only
    with pytest.raises(SubmitRefused) as err:
        eng.submit(spec(gpus=("h100s", "A100s")))
    # A plural or a letter for a digit points at the offered model, not a near one.
    assert "did you mean A100?" in str(err.value)
    with pytest.raises(SubmitRefused) as err:
        eng.submit(spec(gpus=("A1OOs", "A100")))
    assert str(err.value) == (
        "resources.gpus: no enabled provider offers A1OOS (did you mean A100?);"
        " correct or remove it"
    )
    assert eng.store.list_jobs() == []
    # A model no one offers today is still welcome beside one they do: it may come.
    assert eng.submit(spec(gpus=("B200", "A100"))).status is JobStatus.PENDING
