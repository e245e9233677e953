"""spotd.engine.judge: a job's facts to a verdict, with no store, provider or clock."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from spotd.core.agent_wire import PreflightCheck, PreflightFigures
from spotd.core.errors import CapacityError, InvalidRequestError, ProviderError, ThrottledError
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    EventCause,
    EventFacts,
    ExitCause,
    FailureCause,
    Instance,
    InstanceState,
    JobRecord,
    JobStatus,
    Market,
    Pool,
)
from spotd.engine import judge
from spotd.engine.gang import GangState
from spotd.engine.verdicts import Checkpoint, Defer, End, Replan, Running, Stay
from tests.engine_support import EPOCH, spec

POOL = Pool("sim", "r1", "r1-a", "gpu.1x")
OTHER = Pool("sim", "r2", "r2-a", "gpu.1x")
S = InstanceState


def job(status: JobStatus = JobStatus.RUNNING, **extra: object) -> JobRecord:
    return JobRecord("j-1", "t", spec(**extra), status, None, EPOCH, EPOCH)


def attempt(nodes: int = 1, **fields: object) -> AttemptRecord:
    ids = tuple(f"i-{n}" for n in range(nodes))
    base = AttemptRecord(1, "j-1", 1, POOL, Market.SPOT, nodes, 1.0, "tok", ids, None,
                         EPOCH, None, None, None)  # fmt: skip
    return replace(base, **fields)  # type: ignore[arg-type]


def node(n: int, state: InstanceState, exit_code: int | None = None) -> Instance:
    return Instance(f"i-{n}", POOL, Market.SPOT, state, exit_code=exit_code)


def facts(
    status: JobStatus,
    *instances: Instance | None,
    gang: GangState | None = None,
    spent: float = 0.0,
    **job_fields: object,
) -> judge.WatchFacts:
    a = attempt(len(instances))
    return judge.WatchFacts(
        job=job(status, **job_fields), attempt=a, attempts=[a], instances=instances,
        gang=gang or GangState(joined=len(instances), started=len(instances), preflight=None),
        now=EPOCH + timedelta(minutes=5), spent=spent, real_per_second=1.0,
        unweighed_warning=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("instances", "status", "end"),
    [
        ((node(0, S.EXITED, 0),), JobStatus.SUCCEEDED, AttemptEnd.SUCCEEDED),
        ((node(0, S.PREEMPTED),), JobStatus.RECOVERING, AttemptEnd.PREEMPTED),
        ((None,), JobStatus.RECOVERING, AttemptEnd.LOST),
        ((node(0, S.TERMINATED),), JobStatus.RECOVERING, AttemptEnd.LOST),
        ((node(0, S.EXITED, 3),), JobStatus.FAILED, AttemptEnd.USER_FAILED),
        # A gang's other node exits non-zero while one is under notice: the preemption.
        ((node(0, S.NOTICE), node(1, S.EXITED, 1)), JobStatus.RECOVERING, AttemptEnd.PREEMPTED),
        ((node(0, S.EXITED, 0), node(1, S.EXITED, 0)), JobStatus.SUCCEEDED, AttemptEnd.SUCCEEDED),
    ],
)  # fmt: skip
def test_how_an_attempt_ends(
    instances: tuple[Instance | None, ...], status: JobStatus, end: AttemptEnd
) -> None:
    verdict = judge.watch(facts(JobStatus.RUNNING, *instances))
    assert isinstance(verdict, End)
    assert (verdict.status, verdict.end, verdict.cause) == (status, end, end)
    assert verdict.attempt is not None and (verdict.failure is not None) == (
        status is JobStatus.FAILED
    )


def test_a_gang_waits_for_nodes_still_running_when_some_finished() -> None:
    verdict = judge.watch(facts(JobStatus.RUNNING, node(0, S.EXITED, 0), node(1, S.RUNNING)))
    assert verdict == Stay()


def test_running_jobs_checkpoint_on_a_notice_and_replan_otherwise() -> None:
    assert isinstance(judge.watch(facts(JobStatus.RUNNING, node(0, S.NOTICE))), Checkpoint)
    assert isinstance(judge.watch(facts(JobStatus.RUNNING, node(0, S.RUNNING))), Replan)


def test_a_provisioning_job_runs_once_every_node_is_up_and_the_gang_assembled() -> None:
    up = facts(JobStatus.PROVISIONING, node(0, S.RUNNING))
    verdict = judge.watch(up)
    assert isinstance(verdict, Running) and verdict.calm
    booting = facts(JobStatus.PROVISIONING, node(0, S.RUNNING), node(1, S.PENDING))
    assert judge.watch(booting) == Stay()
    half = GangState(joined=2, started=1, preflight=None)
    assembling = facts(JobStatus.PROVISIONING, node(0, S.RUNNING), node(1, S.RUNNING), gang=half)
    assert judge.watch(assembling) == Stay()


def test_the_budget_comes_before_everything_else() -> None:
    verdict = judge.watch(facts(JobStatus.RUNNING, node(0, S.EXITED, 0), spent=5.0,
                                budget={"max_usd": 4.0}))  # fmt: skip
    assert isinstance(verdict, End)
    assert (verdict.status, verdict.failure, verdict.end) == (
        JobStatus.FAILED, FailureCause.OVER_BUDGET, AttemptEnd.OVER_BUDGET)
    assert verdict.cause is EventCause.OVER_BUDGET


def test_a_setup_failure_is_placed_again_within_its_allowance() -> None:
    gang = GangState(joined=0, started=0, preflight=None, gave_up="setup")
    verdict = judge.watch(facts(JobStatus.PROVISIONING, node(0, S.EXITED, 1), gang=gang))
    assert isinstance(verdict, End)
    assert (verdict.status, verdict.end) == (JobStatus.RECOVERING, AttemptEnd.SETUP_FAILED)


@pytest.mark.parametrize(
    ("retry", "exit_code", "status"),
    [
        ({"max_restarts_on_errors": 1}, 3, JobStatus.RECOVERING),
        ({"max_restarts_on_errors": 0}, 3, JobStatus.FAILED),
        ({"max_restarts_on_errors": 2, "restart_on_exit_codes": [7]}, 3, JobStatus.FAILED),
        ({"max_restarts_on_errors": 2, "restart_on_exit_codes": [7]}, 7, JobStatus.RECOVERING),
    ],
)
def test_a_failed_command_restarts_as_its_retry_rules_say(
    retry: dict[str, object], exit_code: int, status: JobStatus
) -> None:
    verdict = judge.watch(facts(JobStatus.RUNNING, node(0, S.EXITED, exit_code), retry=retry))
    assert isinstance(verdict, End) and verdict.status is status
    assert verdict.end is AttemptEnd.USER_FAILED and f"exited with {exit_code}" in verdict.detail


@pytest.mark.parametrize(
    ("exc", "kind", "status", "end"),
    [
        (ThrottledError("slow down"), Defer, None, None),
        (CapacityError("none left"), End, JobStatus.RECOVERING, AttemptEnd.NO_CAPACITY),
        (ProviderError("bad"), End, JobStatus.RECOVERING, AttemptEnd.LAUNCH_FAILED),
        (InvalidRequestError("never"), End, JobStatus.FAILED, AttemptEnd.LAUNCH_FAILED),
    ],
)
def test_a_failed_launch(
    exc: ProviderError, kind: type, status: JobStatus | None, end: AttemptEnd | None
) -> None:
    a = attempt()
    verdict = judge.launch_failure(job(JobStatus.PROVISIONING), a, [a], exc)
    assert isinstance(verdict, kind)
    if isinstance(verdict, End):
        assert (verdict.status, verdict.end, verdict.attempt) == (status, end, a)


@pytest.mark.parametrize(
    ("instances", "expected"),
    [
        pytest.param((node(0, S.RUNNING), node(1, S.EXITED, 137)),
                     EventFacts(exit_code=137, signal=9, node="i-1", rank=1,
                                exit_cause=ExitCause.SIGNAL), id="killed"),
        pytest.param((node(0, S.EXITED, 0), node(1, S.EXITED, 0)),
                     EventFacts(exit_code=0), id="succeeded"),
        pytest.param((node(0, S.RUNNING), node(1, S.PREEMPTED)),
                     EventFacts(node="i-1", rank=1), id="preempted"),
        pytest.param((node(0, S.RUNNING), None), EventFacts(node="i-1", rank=1), id="lost"),
        pytest.param((node(0, S.TERMINATED), node(1, S.RUNNING)),
                     EventFacts(node="i-0", rank=0), id="terminated"),
    ],
)  # fmt: skip
def test_a_gang_attempts_end_names_its_node_and_rank(
    instances: tuple[Instance | None, ...], expected: EventFacts
) -> None:
    """The node that ended the attempt, its rank (its place in the attempt's ids) and its
    exit code (a signal N reads from 128 + N) go with the verdict as facts."""
    verdict = judge.watch(facts(JobStatus.RUNNING, *instances))
    assert isinstance(verdict, End) and verdict.facts == expected


def test_a_notice_names_the_noticed_node() -> None:
    verdict = judge.watch(facts(JobStatus.RUNNING, node(0, S.RUNNING), node(1, S.NOTICE)))
    assert isinstance(verdict, Checkpoint) and verdict.facts == EventFacts(node="i-1", rank=1)


def test_a_failed_launch_carries_the_error_class() -> None:
    a = attempt()
    exc = CapacityError("none left", provider="aws", code="InsufficientInstanceCapacity")
    verdict = judge.launch_failure(job(JobStatus.PROVISIONING), a, [a], exc)
    assert isinstance(verdict, End)
    assert verdict.facts == EventFacts(
        error_class="CapacityError", error_code="provider-capacity", provider="aws",
        provider_code="InsufficientInstanceCapacity",
    )  # fmt: skip
    refused = judge.launch_failure(job(JobStatus.PROVISIONING), a, [a], InvalidRequestError("x"))
    assert isinstance(refused, End) and refused.cause is EventCause.LAUNCH_REFUSED
    assert refused.facts.error_class == "InvalidRequestError"
    assert refused.facts.provider == "sim", "the pool's provider where the error names none"


def test_launch_failures_past_the_allowance_fail_the_job() -> None:
    failed = [attempt(id=n, seq=n, ended_at=EPOCH, end_reason=AttemptEnd.LAUNCH_FAILED)
              for n in range(1, 4)]  # fmt: skip
    now = attempt(id=4, seq=4)
    verdict = judge.launch_failure(job(JobStatus.PROVISIONING, retry={"launch_failures": 3}),
                                   now, [*failed, now], ProviderError("bad"))  # fmt: skip
    assert isinstance(verdict, End)
    assert (verdict.status, verdict.failure) == (JobStatus.FAILED, FailureCause.LAUNCH_FAILED)


def test_moves() -> None:
    a = attempt()
    assert judge.move(a, (POOL, Market.SPOT), deadline_controlled=False) == Stay()
    assert judge.move(a, None, deadline_controlled=False) == Stay()
    moved = judge.move(a, (OTHER, Market.SPOT), deadline_controlled=False)
    assert isinstance(moved, End) and moved.end is AttemptEnd.MIGRATED
    waits = judge.move(a, None, deadline_controlled=True)
    assert isinstance(waits, End) and "waiting for spot" in waits.detail


def test_limits_of_a_pending_job() -> None:
    late = job(JobStatus.PENDING, deadline={"finish_by": (EPOCH + timedelta(hours=1)).isoformat(),
                                            "compute_hours": 2})  # fmt: skip
    ended = judge.deadline_impossible(late, EPOCH)
    assert ended is not None and ended.failure is FailureCause.DEADLINE_IMPOSSIBLE
    assert judge.deadline_impossible(late, EPOCH - timedelta(hours=2)) is None
    waiting = job(JobStatus.PENDING)
    assert judge.waited_too_long(waiting, EPOCH + timedelta(hours=1), 2.0) is None
    timed_out = judge.waited_too_long(waiting, EPOCH + timedelta(hours=3), 2.0)
    assert timed_out is not None and timed_out.failure is FailureCause.NO_CAPACITY
    assert judge.waited_too_long(waiting, EPOCH + timedelta(days=9), None) is None


def test_the_same_facts_give_the_same_verdict() -> None:
    f = facts(JobStatus.RUNNING, node(0, S.NOTICE), node(1, S.EXITED, 1))
    assert judge.watch(f) == judge.watch(f)


def test_a_node_the_oom_killer_hit_fails_its_job_out_of_memory_on_that_evidence_only() -> None:
    """The agent's count of OOM kills is the evidence: with it, exit 137 is out of memory;
    without it, the same exit is a SIGKILL from anyone, and said as such."""
    oom = replace(node(0, S.EXITED, 137), oom_kills=1)
    verdict = judge.watch(facts(JobStatus.RUNNING, oom))
    assert isinstance(verdict, End) and verdict.failure is FailureCause.USER_COMMAND_FAILED
    assert (verdict.facts.exit_cause, verdict.facts.oom_kills) == (ExitCause.OUT_OF_MEMORY, 1)
    killed = judge.watch(facts(JobStatus.RUNNING, node(0, S.EXITED, 137)))
    assert isinstance(killed, End) and killed.facts.exit_cause is ExitCause.SIGNAL
    lost = judge.watch(facts(JobStatus.RUNNING, node(0, S.EXITED, 127)))
    assert isinstance(lost, End) and lost.facts.exit_cause is ExitCause.NOT_FOUND


def test_a_failed_preflight_names_its_failed_check_the_jobs_own_first() -> None:
    checks = (PreflightCheck(name="gpu_count", ok=False, detail="1 of 8"),
              PreflightCheck(name="checkpoint_writable", ok=False, detail="read-only"))  # fmt: skip
    failed = PreflightFigures(passed=False, checks=checks, reason="the nodes cannot write")
    gang = GangState(joined=1, started=0, preflight=failed)
    verdict = judge.watch(facts(JobStatus.PROVISIONING, node(0, S.RUNNING), gang=gang))
    assert isinstance(verdict, End) and verdict.failure is FailureCause.INVALID_SPEC
    assert verdict.facts.check == "checkpoint_writable"
    pool_only = PreflightFigures(passed=False, checks=checks[:1], reason="a GPU is missing")
    gang = GangState(joined=1, started=0, preflight=pool_only)
    verdict = judge.watch(facts(JobStatus.PROVISIONING, node(0, S.RUNNING), gang=gang))
    assert isinstance(verdict, End) and verdict.status is JobStatus.RECOVERING
    assert verdict.facts.check == "gpu_count"
