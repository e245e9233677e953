"""spotd.engine.hang through spotd.engine.judge: a running gang whose steps stopped
while its nodes are up ends ``hung``, named by its suspects; on a clock the test moves."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from spotd.core.clock import ManualClock
from spotd.core.ranks import RankReading, RankState, ranks_json
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    EventCause,
    EventFacts,
    FailureCause,
    Instance,
    InstanceReport,
    InstanceState,
    JobRecord,
    JobStatus,
    Market,
    Pool,
)
from spotd.engine import judge
from spotd.engine.gang import GangState
from spotd.engine.hang import GangProgress, gang_progress, next_check
from spotd.engine.verdicts import Checkpoint, End, Replan
from tests.engine_support import EPOCH, spec

POOL = Pool("sim", "r1", "r1-a", "gpu.1x")
TIMEOUT = timedelta(minutes=10)
S = InstanceState
R = RankState


def job(status: JobStatus = JobStatus.RUNNING, *, timeout: str | None = "10m",
        hangs: int = 3) -> JobRecord:  # fmt: skip
    gang = {"hang_timeout": timeout} if timeout else {}
    return JobRecord("j-1", "t", spec(gang=gang, retry={"hangs": hangs}), status, None, EPOCH,
                     EPOCH)  # fmt: skip


def attempt(seq: int = 1, nodes: int = 2, end: AttemptEnd | None = None) -> AttemptRecord:
    ids = tuple(f"i-{n}" for n in range(nodes))
    return AttemptRecord(seq, "j-1", seq, POOL, Market.SPOT, nodes, 1.0, f"tok-{seq}", ids, None,
                         EPOCH, EPOCH, EPOCH if end else None, end)  # fmt: skip


def ranks(*states_and_steps: tuple[RankState, int]) -> list[RankReading]:
    return [RankReading(rank=n, step=step, pid=1000 + n, state=state)
            for n, (state, step) in enumerate(states_and_steps)]  # fmt: skip


def reports(a: AttemptRecord, moved: datetime, heard: datetime,
            readings: list[RankReading]) -> list[InstanceReport]:  # fmt: skip
    """One report per node, the readings dealt out in rank order (one rank a node)."""
    return [
        InstanceReport(iid, "sim", "j-1", a.seq, step=r.step, ranks=ranks_json([r]),
                       progress_key="k", progress_at=moved, heard_at=heard)
        for iid, r in zip(a.instance_ids, readings, strict=True)
    ]  # fmt: skip


def facts(j: JobRecord, a: AttemptRecord, progress: GangProgress | None, now: datetime,
          *, states: tuple[InstanceState, ...] = (S.RUNNING, S.RUNNING),
          before: tuple[AttemptRecord, ...] = ()) -> judge.WatchFacts:  # fmt: skip
    instances = [Instance(iid, POOL, Market.SPOT, st) for iid, st in zip(a.instance_ids, states,
                                                                         strict=True)]  # fmt: skip
    return judge.WatchFacts(
        job=j, attempt=a, attempts=[*before, a], instances=instances,
        gang=GangState(joined=a.nodes, started=a.nodes, preflight=None), now=now, spent=0.0,
        real_per_second=1.0, unweighed_warning=False, progress=progress,
    )  # fmt: skip


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(EPOCH)


def stalled(clock: ManualClock, *readings: tuple[RankState, int], after: float) -> GangProgress:
    """Progress that last moved now; the clock then moves ``after`` seconds and a
    heartbeat says the same."""
    a = attempt()
    moved = clock.now()
    heard = clock.advance(after)
    found = gang_progress(a, reports(a, moved, heard, ranks(*readings)))
    assert found is not None
    return found


def test_no_hang_before_the_timeout_and_one_after(clock: ManualClock) -> None:
    a = attempt()
    early = stalled(clock, (R.RUNNING, 7), (R.STOPPED, 7), after=TIMEOUT.total_seconds() - 1)
    assert isinstance(judge.watch(facts(job(), a, early, clock.now())), Replan)
    late = stalled(clock, (R.RUNNING, 7), (R.STOPPED, 7), after=TIMEOUT.total_seconds())
    verdict = judge.watch(facts(job(), a, late, clock.now()))
    assert isinstance(verdict, End)
    assert (verdict.status, verdict.end, verdict.cause) == (
        JobStatus.RECOVERING,
        AttemptEnd.HUNG,
        EventCause.HANG,
    )
    assert verdict.attempt == a and verdict.failure is None
    # The stopped rank 1 on the second node: named in the facts and the detail.
    assert verdict.facts == EventFacts(node="i-1", rank=1, process_ranks=(1,), nodes=("i-1",))
    assert "rank 1 (pid 1001, stopped, step 7) on i-1" in verdict.detail
    assert "last checkpoint" in verdict.detail


def test_silence_is_no_hang(clock: ManualClock) -> None:
    """The clock passes the timeout but no heartbeat said the steps still stand (a
    daemon that was down, agents that could not reach it): not hung, looked at soon."""
    a = attempt()
    quiet = stalled(clock, (R.RUNNING, 7), (R.DEAD, 7), after=60)
    now = clock.advance(TIMEOUT.total_seconds() * 2)
    assert isinstance(judge.watch(facts(job(), a, quiet, now)), Replan)
    check = next_check(job(), quiet, now)
    assert check is not None and now < check <= now + TIMEOUT / 5


def test_a_job_that_never_reports_progress_is_not_watched(clock: ManualClock) -> None:
    a = attempt()
    now = clock.advance(86400)
    bare = [InstanceReport(iid, "sim", "j-1", 1, heartbeat_at=EPOCH) for iid in a.instance_ids]
    assert gang_progress(a, bare) is None
    assert isinstance(judge.watch(facts(job(), a, None, now)), Replan)
    assert next_check(job(), None, now) == now + TIMEOUT, "looked at again for a first report"


def test_a_checkpointing_job_or_one_without_a_timeout_is_not_judged_hung(
    clock: ManualClock,
) -> None:
    a = attempt()
    late = stalled(clock, (R.RUNNING, 7), (R.DEAD, 7), after=3600)
    now = clock.now()
    noticed = facts(job(), a, late, now, states=(S.RUNNING, S.NOTICE))
    assert isinstance(judge.watch(noticed), Checkpoint), "a notice comes first"
    checkpointing = facts(job(JobStatus.CHECKPOINTING), a, late, now)
    assert not isinstance(judge.watch(checkpointing), End)
    assert next_check(job(JobStatus.CHECKPOINTING), late, now) is None
    unwatched = facts(job(timeout=None), a, late, now)
    assert isinstance(judge.watch(unwatched), Replan)
    assert next_check(job(timeout=None), late, now) is None


@pytest.mark.parametrize(
    ("readings", "suspects"),
    [
        # A dead or stopped process before a step behind.
        (((R.RUNNING, 9), (R.DEAD, 9), (R.STOPPED, 9), (R.RUNNING, 8)), (1, 2)),
        # Every process lives (or cannot be seen): the one behind.
        (((R.UNKNOWN, 9), (R.UNKNOWN, 9), (R.UNKNOWN, 8), (R.UNKNOWN, 9)), (2,)),
        # Nothing stands out: a hang all the same, with no suspect named.
        (((R.RUNNING, 9), (R.RUNNING, 9), (R.RUNNING, 9), (R.RUNNING, 9)), ()),
    ],
)  # fmt: skip
def test_the_suspects(
    clock: ManualClock, readings: tuple[tuple[RankState, int], ...], suspects: tuple[int, ...]
) -> None:
    a = attempt(nodes=4)
    moved = clock.now()
    progress = gang_progress(a, reports(a, moved, clock.advance(3600), ranks(*readings)))
    states = (S.RUNNING,) * 4
    verdict = judge.watch(facts(job(), a, progress, clock.now(), states=states))
    assert isinstance(verdict, End) and verdict.end is AttemptEnd.HUNG
    if suspects:
        assert verdict.facts.process_ranks == suspects
        assert verdict.facts.node == f"i-{suspects[0]}" and verdict.facts.rank == suspects[0]
        assert verdict.facts.nodes == tuple(f"i-{n}" for n in suspects)
    else:
        assert verdict.facts == EventFacts()
        assert "no rank stands out" in verdict.detail


def test_the_progress_of_a_gang_is_its_latest_node(clock: ManualClock) -> None:
    """The gang moved when any node's progress did, and a heartbeat from any node says
    it still stands; a node that reports none (the single progress file is rank 0's)
    takes no part."""
    a = attempt(nodes=3)
    t0, t1, t2 = clock.now(), clock.advance(60), clock.advance(60)
    rows = [
        InstanceReport("i-0", "sim", "j-1", 1, progress_key="a", progress_at=t1, heard_at=t1),
        InstanceReport("i-1", "sim", "j-1", 1, progress_key="b", progress_at=t0, heard_at=t2),
        InstanceReport("i-2", "sim", "j-1", 1, heartbeat_at=t2),
        # Another attempt's node: not this gang's.
        InstanceReport("i-9", "sim", "j-1", 2, progress_key="c", progress_at=t2, heard_at=t2),
    ]
    assert gang_progress(a, rows) == GangProgress(moved_at=t1, heard_at=t2)


def test_a_job_that_hangs_wherever_it_runs_fails(clock: ManualClock) -> None:
    late = stalled(clock, (R.RUNNING, 7), (R.DEAD, 7), after=3600)
    hung_before = tuple(attempt(seq, end=AttemptEnd.HUNG) for seq in (1, 2))
    current = attempt(3)
    verdict = judge.watch(facts(job(hangs=2), current, late, clock.now(), before=hung_before))
    assert isinstance(verdict, End)
    assert (verdict.status, verdict.failure, verdict.end, verdict.cause) == (
        JobStatus.FAILED,
        FailureCause.HUNG,
        AttemptEnd.HUNG,
        EventCause.HANG,
    )
    assert "retry.hangs is 2" in verdict.detail
    # A preemption in between: the hangs are not in a row.
    broken = (hung_before[0], replace(attempt(2), end_reason=AttemptEnd.PREEMPTED,
                                      ended_at=EPOCH))  # fmt: skip
    again = judge.watch(facts(job(hangs=2), current, late, clock.now(), before=broken))
    assert isinstance(again, End) and again.status is JobStatus.RECOVERING


def test_the_next_check_follows_the_progress(clock: ManualClock) -> None:
    moving = stalled(clock, (R.RUNNING, 7), (R.RUNNING, 7), after=30)
    assert next_check(job(), moving, clock.now()) == moving.moved_at + TIMEOUT
