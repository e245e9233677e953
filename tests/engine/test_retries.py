"""Bounded retries: failed launches per job and per pool, restarts on application errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import FakeProvider, run_until, spec

from spotd import checkpoints as ck
from spotd.core.errors import CapacityError, ProviderError
from spotd.core.spec import JobSpec
from spotd.core.states import FailureCause, JobStatus
from spotd.core.values import AttemptEnd, InstanceReport, InstanceState, JobRecord
from spotd.daemon.views import job_view
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[Engine, FakeProvider]]:
    """An engine on the scripted provider, with no cooldown: every pool is asked again
    at once, so only the retry bounds stop a job whose launches fail."""
    from spotd_sim import SimClock

    provider = FakeProvider()
    store = open_store(f"sqlite:///{tmp_path / 'f.db'}")
    clock = SimClock(tmp_path / "clock", 3600.0)
    settings = EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck", cooldown_hours=0.0)
    eng = Engine(store, {"fake": provider}, CheapestPolicy(), clock, settings)
    yield eng, provider
    store.close()


def _ended(job: JobRecord) -> bool:
    return job.status.terminal


def _failed_launch() -> ProviderError:
    return ProviderError("the image is not there", provider="fake", code="ImageNotFound")


def _running(eng: Engine, job_spec: JobSpec, attempts: int = 1) -> JobRecord:
    """Submit (or wait for) the job until its ``attempts``-th attempt runs."""
    job = eng.submit(job_spec)
    return _until_running(eng, job.id, attempts)


def _until_running(eng: Engine, job_id: str, attempts: int) -> JobRecord:
    def done(j: JobRecord) -> bool:
        return j.status is JobStatus.RUNNING and len(eng.store.attempts(j.id)) == attempts

    return run_until(eng, job_id, done, timeout=10)


def _exit(provider: FakeProvider, eng: Engine, job_id: str, code: int) -> None:
    """The open attempt's command exits with ``code``, as the provider sees it."""
    (iid,) = eng.store.attempts(job_id)[-1].instance_ids
    provider.states[iid] = InstanceState.EXITED
    provider.exit_codes[iid] = code


def _checkpoint(eng: Engine, job_id: str, step: int) -> str:
    """A complete checkpoint of the job in the daemon's folder; returns its URI."""
    folder = eng.settings.checkpoints_dir / job_id / ck.checkpoint_name(step)
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"w")
    (folder / ck.MARKER).write_bytes(b"")
    latest = ck.latest_complete(str(eng.settings.checkpoints_dir / job_id))
    assert latest is not None and latest.step == step
    return latest.uri


# -- failed launches ----------------------------------------------------------------


def test_failed_launches_are_bounded_per_job(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    provider.launch_errors = [_failed_launch() for _ in range(10)]
    job = eng.submit(spec(retry={"launch_failures": 2, "launch_failures_per_pool": 100}))
    job = run_until(eng, job.id, _ended, timeout=10)
    assert job.status is JobStatus.FAILED
    assert job.failure is FailureCause.LAUNCH_FAILED
    attempts = eng.store.attempts(job.id)
    # Two failed launches are placed again; the third fails the job: no fourth launch.
    assert [a.end_reason for a in attempts] == [AttemptEnd.LAUNCH_FAILED] * 3
    assert len(provider.launch_errors) == 7 and not provider.launched
    last = eng.store.events(job.id)[-1]
    assert last.to_status is JobStatus.FAILED
    assert "3 failed launches, retry.launch_failures is 2" in last.detail
    assert (last.facts.error_class, last.facts.error_code) == ("ProviderError", "provider-error")
    assert (last.facts.provider, last.facts.provider_code) == ("fake", "ImageNotFound")


def test_no_capacity_counts_as_a_failed_launch(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    provider.launch_errors = [
        CapacityError("no spot capacity", provider="fake"),
        _failed_launch(),
        CapacityError("no spot capacity", provider="fake"),
    ]
    job = eng.submit(spec(retry={"launch_failures": 1, "launch_failures_per_pool": 100}))
    job = run_until(eng, job.id, _ended, timeout=10)
    assert job.failure is FailureCause.LAUNCH_FAILED
    ends = [a.end_reason for a in eng.store.attempts(job.id)]
    assert ends == [AttemptEnd.NO_CAPACITY, AttemptEnd.LAUNCH_FAILED]


def test_a_pool_past_its_bound_is_not_used_again(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    provider.launch_errors = [_failed_launch(), _failed_launch()]
    job = _running(eng, spec(retry={"launch_failures": 10, "launch_failures_per_pool": 1}), 3)
    attempts = eng.store.attempts(job.id)
    # The cheapest pool first, then each next cheapest once the one before failed once:
    # without the bound (and no cooldown) the job would ask the cheapest pool again.
    zones = [a.pool.zone for a in attempts]
    assert zones == ["r1a", "r1b", "r2a"]
    assert [a.end_reason for a in attempts[:2]] == [AttemptEnd.LAUNCH_FAILED] * 2
    assert provider.launched[0].offering.pool.zone == "r2a"
    recovering = [e for e in eng.store.events(job.id) if e.cause == "launch-failed"]
    assert "fake/r1a/x1.gpu is not used for this job again" in recovering[0].detail
    assert "9 more failed launch(es) allowed" in recovering[0].detail
    # Now that it runs, the pools that failed before may serve it again (a later
    # recovery starts the count afresh): the plan offers the cheapest one again.
    choice = eng.placer.decide(job)[2].choice
    assert choice is not None and choice.offering.pool.zone == "r1a"


def test_a_job_fails_when_every_pool_it_can_use_is_spent(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = fake
    provider.launch_errors = [_failed_launch() for _ in range(5)]
    job = eng.submit(spec(retry={"launch_failures": 10, "launch_failures_per_pool": 1}))
    job = run_until(eng, job.id, _ended, timeout=10)
    assert job.status is JobStatus.FAILED
    assert job.failure is FailureCause.LAUNCH_FAILED
    # Three pools, one failed launch each: nothing is left, so the job does not wait
    # forever for a pool it may no longer use.
    assert len(eng.store.attempts(job.id)) == 3
    assert len(provider.launch_errors) == 2
    last = eng.store.events(job.id)[-1]
    assert last.cause == "launch failed everywhere"
    assert "retry.launch_failures_per_pool" in last.detail


def test_a_run_starts_the_count_again(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    provider.launch_errors = [_failed_launch()]
    job = _running(eng, spec(retry={"launch_failures": 1, "launch_failures_per_pool": 1}), 2)
    # Preempted after it ran: one more failed launch is allowed, and the pool that
    # failed before the run may serve it again.
    provider.launch_errors = [_failed_launch()]
    (iid,) = eng.store.attempts(job.id)[-1].instance_ids
    provider.states[iid] = InstanceState.PREEMPTED
    job = _until_running(eng, job.id, 4)
    ends = [a.end_reason for a in eng.store.attempts(job.id)]
    assert ends == [AttemptEnd.LAUNCH_FAILED, AttemptEnd.PREEMPTED, AttemptEnd.LAUNCH_FAILED, None]
    assert eng.store.attempts(job.id)[2].pool.zone == "r1a"


def test_throttled_launches_are_not_counted(fake: tuple[Engine, FakeProvider]) -> None:
    from spotd.core.errors import ThrottledError

    eng, provider = fake
    provider.launch_errors = [ThrottledError("slow down", provider="fake") for _ in range(3)]
    job = _running(eng, spec(retry={"launch_failures": 0}))
    # A throttled launch is retried with the same attempt: it never failed.
    (attempt,) = eng.store.attempts(job.id)
    assert attempt.end_reason is None and not provider.launch_errors


# -- restarts on application errors ------------------------------------------------


def test_a_listed_exit_code_restarts_from_the_checkpoint(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = fake
    retry = {"max_restarts_on_errors": 2, "restart_on_exit_codes": [137, 134]}
    job = _running(eng, spec(retry=retry))
    uri = _checkpoint(eng, job.id, 40)
    _exit(provider, eng, job.id, 137)
    job = _until_running(eng, job.id, 2)
    first, second = eng.store.attempts(job.id)
    assert first.end_reason is AttemptEnd.USER_FAILED
    # The RECOVERING path resumes the job from its last checkpoint.
    assert second.resume_from == uri
    assert provider.launched[-1].env["SPOTD_RESUME_FROM"] == uri
    restart = [e for e in eng.store.events(job.id) if e.cause == "user-failed"]
    assert restart[0].to_status is JobStatus.RECOVERING
    assert "restart 1 of 2, from the last checkpoint" in restart[0].detail
    view = job_view(job, eng.store.attempts(job.id), eng.clock.now())
    assert (view.restarts, view.max_restarts) == (1, 2)

    _exit(provider, eng, job.id, 134)
    job = _until_running(eng, job.id, 3)
    _exit(provider, eng, job.id, 137)
    job = run_until(eng, job.id, _ended, timeout=10)
    # Two restarts allowed: the third error exit fails the job.
    assert job.status is JobStatus.FAILED
    assert job.failure is FailureCause.USER_COMMAND_FAILED
    assert [a.end_reason for a in eng.store.attempts(job.id)] == [AttemptEnd.USER_FAILED] * 3
    assert "restarted 2 time(s)" in eng.store.events(job.id)[-1].detail
    view = job_view(job, eng.store.attempts(job.id), eng.clock.now())
    assert (view.restarts, view.max_restarts) == (2, 2)


def test_an_unlisted_exit_code_fails_at_once(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    job = _running(eng, spec(retry={"max_restarts_on_errors": 3, "restart_on_exit_codes": [137]}))
    _exit(provider, eng, job.id, 1)
    job = run_until(eng, job.id, _ended, timeout=10)
    assert job.status is JobStatus.FAILED
    assert job.failure is FailureCause.USER_COMMAND_FAILED
    assert len(eng.store.attempts(job.id)) == 1
    last = eng.store.events(job.id)[-1]
    assert "not restarted: retry.restart_on_exit_codes is 137" in last.detail


def test_no_restart_by_default(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    job = _running(eng, spec())
    _exit(provider, eng, job.id, 137)
    job = run_until(eng, job.id, _ended, timeout=10)
    assert job.failure is FailureCause.USER_COMMAND_FAILED
    assert len(eng.store.attempts(job.id)) == 1
    assert job_view(job, eng.store.attempts(job.id), eng.clock.now()).restarts == 0


def test_without_a_list_any_error_exit_restarts(fake: tuple[Engine, FakeProvider]) -> None:
    eng, provider = fake
    job = _running(eng, spec(retry={"max_restarts_on_errors": 1}))
    _exit(provider, eng, job.id, 3)
    job = _until_running(eng, job.id, 2)
    assert eng.store.attempts(job.id)[0].end_reason is AttemptEnd.USER_FAILED
    # A success after the restart ends the job as any success does.
    _exit(provider, eng, job.id, 0)
    job = run_until(eng, job.id, _ended, timeout=10)
    assert job.status is JobStatus.SUCCEEDED


def test_status_shows_the_restarts_and_the_exit_code(fake: tuple[Engine, FakeProvider]) -> None:
    from spotd.cli.render.jobs import restart_line

    eng, provider = fake
    job = _running(eng, spec(retry={"max_restarts_on_errors": 3, "restart_on_exit_codes": [137]}))
    view = job_view(job, eng.store.attempts(job.id), eng.clock.now())
    assert restart_line(view) == "restarts: 0 of 3"
    # A cloud node's agent reports the code: the view carries it.
    (attempt,) = eng.store.attempts(job.id)
    (iid,) = attempt.instance_ids
    eng.store.save_report(InstanceReport(iid, "fake", job.id, attempt.seq, exit_code=137))
    job = _until_running(eng, job.id, 2)
    view = job_view(job, eng.store.attempts(job.id), eng.clock.now(), eng.store.reports(job.id))
    assert (view.restarts, view.last_exit_code) == (1, 137)
    assert restart_line(view) == "restarts: 1 of 3 (exit 137)"
    # Without an agent's report (the simulated market) the attempt keeps the code.
    _exit(provider, eng, job.id, 137)
    job = _until_running(eng, job.id, 3)
    attempts = eng.store.attempts(job.id)
    assert [a.exit_code for a in attempts if a.end_reason is AttemptEnd.USER_FAILED] == [137, 137]
    bare = job_view(job, attempts, eng.clock.now())
    assert bare.last_exit_code == 137
    assert restart_line(bare) == "restarts: 2 of 3 (exit 137)"


def test_a_job_without_restarts_shows_no_line(fake: tuple[Engine, FakeProvider]) -> None:
    from spotd.cli.render.jobs import restart_line

    eng, _ = fake
    job = eng.submit(spec())
    assert restart_line(job_view(job, [], eng.clock.now())) is None


def test_retry_fields_are_validated() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        spec(retry={"launch_failures_per_pool": 0})
    with pytest.raises(ValidationError):
        spec(retry={"max_restarts_on_errors": -1})
    with pytest.raises(ValidationError):
        spec(retry={"restart_on_exit_codes": ["137"]})
    defaults = spec().retry
    assert (defaults.launch_failures, defaults.launch_failures_per_pool) == (20, 3)
    assert (defaults.max_restarts_on_errors, defaults.restart_on_exit_codes) == (0, ())
