"""spotd.engine.repair: whether a gang that lost a node keeps the others (pure judgement)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from spotd.core.agent_wire import PreflightCheckName as Check
from spotd.core.agent_wire import PreflightFailure as Why
from spotd.core.agent_wire import PreflightFigures
from spotd.core.network import Fabric, Interconnect
from spotd.core.rejoin import RejoinStep
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    Instance,
    InstanceReport,
    InstanceState,
    JobRecord,
    JobStatus,
    Market,
    Offering,
    Pool,
)
from spotd.engine import judge, repair
from spotd.engine.gang import GangState
from spotd.engine.repair import Refusal, RepairFacts
from spotd.engine.verdicts import Checkpoint, End, Repair, Stay
from tests.engine_support import EPOCH, spec

POOL = Pool("sim", "r1", "r1-a", "gpu.1x")
S = InstanceState
NOW = EPOCH + timedelta(minutes=30)
OFFERING = Offering(POOL, "A100", 1, 80, Interconnect(Fabric.ETHERNET, 25), spot_price=1.0,
                    on_demand_price=3.0, capacity=1.0)  # fmt: skip


def gang_spec(on_node_failure: str = "auto", nodes: int = 2) -> dict[str, object]:
    return {"resources": {"gpus": ["A100"], "gpus_per_node": 1, "nodes": nodes},
            "gang": {"on_node_failure": on_node_failure}}  # fmt: skip


def job(status: JobStatus = JobStatus.CHECKPOINTING, mode: str = "auto") -> JobRecord:
    return JobRecord("j-1", "t", spec(**gang_spec(mode)), status, None, EPOCH, EPOCH)


def attempt(nodes: int = 2, **fields: object) -> AttemptRecord:
    ids = tuple(f"i-{n}" for n in range(nodes))
    base = AttemptRecord(1, "j-1", 1, POOL, Market.SPOT, nodes, 1.0, "j-1-a1", ids, None,
                         EPOCH, EPOCH, None, None)  # fmt: skip
    return replace(base, **fields)  # type: ignore[arg-type]


def node(n: int, state: InstanceState, exit_code: int | None = None) -> Instance:
    return Instance(f"i-{n}", POOL, Market.SPOT, state, exit_code=exit_code)


def facts(status: JobStatus, *instances: Instance | None, mode: str = "auto") -> judge.WatchFacts:
    a = attempt(len(instances))
    return judge.WatchFacts(
        job=job(status, mode), attempt=a, attempts=[a], instances=instances,
        gang=GangState(joined=len(instances), started=len(instances), preflight=None),
        now=NOW, spent=0.0, real_per_second=1.0, unweighed_warning=False,
    )  # fmt: skip


def standing_by(n: int, at: datetime = NOW) -> InstanceReport:
    """The report of a node whose command exited and that asked what next since."""
    return InstanceReport(f"i-{n}", "sim", "j-1", 1, exit_code=143, exit_phase="command",
                          exited_at=at - timedelta(seconds=5), heartbeat_at=at)  # fmt: skip


def noticed(n: int, at: datetime) -> InstanceReport:
    return InstanceReport(f"i-{n}", "sim", "j-1", 1, notice_at=at, notice_kind="preemption")


def seen(
    *reports: InstanceReport, alive: tuple[str, ...] = ("i-0",), **more: object
) -> RepairFacts:
    base = RepairFacts(alive=frozenset(alive), reports={r.instance_id: r for r in reports},
                       offering=OFFERING)  # fmt: skip
    return replace(base, **more)  # type: ignore[arg-type]


def ended(f: judge.WatchFacts) -> End:
    verdict = judge.watch(f)
    assert isinstance(verdict, End)
    found = repair.candidate(verdict, f.job)
    assert found is not None
    return found


# Node 1 was preempted (its notice and exit came); node 0 exited with the agreed stop.
PREEMPTED = (node(0, S.EXITED, 143), node(1, S.PREEMPTED, 143))


def test_a_preempted_node_is_replaced_when_the_other_stands_by() -> None:
    f = facts(JobStatus.CHECKPOINTING, *PREEMPTED)
    verdict = repair.judge_repair(ended(f), f, seen(standing_by(0), noticed(1, NOW)))
    assert isinstance(verdict, Repair)
    assert verdict.kept == ("i-0", None)
    assert verdict.kept_ids == ("i-0",) and verdict.lost_ids == ("i-1",)
    assert verdict.end is AttemptEnd.PREEMPTED
    assert verdict.facts.node == "i-1" and verdict.facts.rank == 1
    assert verdict.detail.endswith("; node 1 replaced, node 0 kept")


def test_ranks_are_kept_where_they_were_in_a_gang_of_four() -> None:
    instances = (node(0, S.PREEMPTED, 143), node(1, S.EXITED, 143), node(2, S.PREEMPTED, 143),
                 node(3, S.EXITED, 143))  # fmt: skip
    f = facts(JobStatus.CHECKPOINTING, *instances)
    verdict = repair.judge_repair(ended(f), f, seen(standing_by(1), standing_by(3),
                                                    alive=("i-1", "i-3")))  # fmt: skip
    assert isinstance(verdict, Repair)
    assert verdict.kept == (None, "i-1", None, "i-3")
    assert "nodes 0, 2 replaced, nodes 1, 3 kept" in verdict.detail


def test_the_others_get_time_to_stand_by_then_the_gang_restarts() -> None:
    f = facts(JobStatus.CHECKPOINTING, node(0, S.RUNNING), node(1, S.PREEMPTED, 143))
    end = ended(f)
    # Noticed a minute ago: node 0 is still checkpointing.
    assert repair.judge_repair(end, f, seen(noticed(1, NOW - timedelta(minutes=1)))) == Stay()
    late = NOW - timedelta(seconds=repair.STANDBY_WAIT_SECONDS + 1)
    verdict = repair.judge_repair(end, f, seen(noticed(1, late)))
    assert isinstance(verdict, End) and verdict.status is JobStatus.RECOVERING
    assert verdict.detail.endswith(f"the whole gang restarts: {Refusal.NOT_STANDING_BY}")


def test_a_node_seen_preempted_while_running_checkpoints_the_others_first() -> None:
    f = facts(JobStatus.RUNNING, node(0, S.RUNNING), node(1, S.PREEMPTED, 143))
    verdict = repair.judge_repair(ended(f), f, seen(noticed(1, NOW)))
    assert isinstance(verdict, Checkpoint)
    assert verdict.facts.node == "i-1"


def test_a_node_lost_without_notice_is_replaced_only_if_the_others_stand_by_already() -> None:
    f = facts(JobStatus.RUNNING, node(0, S.RUNNING), None)
    end = ended(f)
    assert end.end is AttemptEnd.LOST
    verdict = repair.judge_repair(end, f, seen())
    assert isinstance(verdict, End)
    assert Refusal.NOT_STANDING_BY in verdict.detail
    f = facts(JobStatus.RUNNING, node(0, S.EXITED, 0), None)
    assert isinstance(repair.judge_repair(end, f, seen(standing_by(0))), Repair)


@pytest.mark.parametrize(
    ("more", "why"),
    [
        ({"offering": None}, Refusal.NOT_OFFERED),
        ({"offering": replace(OFFERING, spot_price=None)}, Refusal.NOT_OFFERED),
        ({"offering": replace(OFFERING, capacity=0.0)}, Refusal.NO_CAPACITY),
        ({"policy_moves": True}, Refusal.POLICY_MOVES),
    ],
)
def test_the_whole_gang_restarts_when_the_pool_cannot_take_the_node_back(
    more: dict[str, object], why: Refusal
) -> None:
    f = facts(JobStatus.CHECKPOINTING, *PREEMPTED)
    verdict = repair.judge_repair(ended(f), f, seen(standing_by(0), **more))
    assert isinstance(verdict, End) and verdict.end is AttemptEnd.PREEMPTED
    assert verdict.detail.endswith(f"the whole gang restarts: {why}")


def test_replace_asked_for_replaces_where_the_policy_would_move() -> None:
    f = facts(JobStatus.CHECKPOINTING, *PREEMPTED, mode="replace")
    assert isinstance(repair.judge_repair(ended(f), f, seen(standing_by(0), policy_moves=True)),
                      Repair)  # fmt: skip


@pytest.mark.parametrize("mode", ["restart", "move"])
def test_restart_and_move_never_repair(mode: str) -> None:
    f = facts(JobStatus.CHECKPOINTING, *PREEMPTED, mode=mode)
    assert repair.candidate(judge.watch(f), f.job) is None


def test_what_is_no_candidate() -> None:
    one = facts(JobStatus.CHECKPOINTING, node(0, S.PREEMPTED, 143))
    assert repair.candidate(judge.watch(one), one.job) is None  # one node: no gang
    failed = facts(JobStatus.RUNNING, node(0, S.EXITED, 1), node(1, S.EXITED, 1))
    assert repair.candidate(judge.watch(failed), failed.job) is None  # the user's failure
    booting = facts(JobStatus.PROVISIONING, node(0, S.RUNNING), node(1, S.PREEMPTED))
    booting = replace(booting, attempt=attempt(running_at=None))
    assert repair.candidate(judge.watch(booting), booting.job) is None  # never ran


def test_nothing_is_kept_of_a_gang_that_went_whole_or_of_a_noticed_node() -> None:
    f = facts(JobStatus.CHECKPOINTING, node(0, S.PREEMPTED, 143), node(1, S.PREEMPTED, 143))
    end = ended(f)
    assert repair.judge_repair(end, f, seen(alive=())) is end
    # Node 0's VM still runs, but it had a notice of its own: it is going too.
    f = facts(JobStatus.CHECKPOINTING, node(0, S.EXITED, 143), node(1, S.PREEMPTED, 143))
    going = replace(standing_by(0), notice_at=NOW, notice_kind="preemption")
    assert repair.judge_repair(end, f, seen(going)) is end


def test_standing_by_is_an_ask_after_the_commands_exit() -> None:
    assert repair.standing_by(standing_by(0))
    assert not repair.standing_by(None)
    assert not repair.standing_by(replace(standing_by(0), heartbeat_at=NOW - timedelta(minutes=1)))
    assert not repair.standing_by(replace(standing_by(0), exit_code=None))
    # After a preflight another node failed, as after the command; not before either.
    assert repair.standing_by(replace(standing_by(0), exit_phase="preflight"))
    assert not repair.standing_by(replace(standing_by(0), exit_phase="rendezvous"))


# -- a node that fails its own preflight checks ------------------------------------------


def preflight_facts(figures: PreflightFigures) -> judge.WatchFacts:
    """A 2-node gang that never ran: both nodes up, its preflight failed as ``figures``."""
    f = facts(JobStatus.PROVISIONING, node(0, S.RUNNING), node(1, S.RUNNING))
    return replace(f, attempt=attempt(running_at=None),
                   gang=GangState(joined=2, started=0, preflight=figures))  # fmt: skip


def failed_on(rank: int | None, check: Check, why: Why) -> PreflightFigures:
    return PreflightFigures(passed=False, world_size=2, reason="failed", failed_rank=rank,
                            failed_check=check, failed_reason=why)  # fmt: skip


def stood_by_after_preflight(n: int) -> InstanceReport:
    return replace(standing_by(n), exit_code=76, exit_phase="preflight")


def test_a_node_that_fails_its_own_gpu_check_is_replaced_alone() -> None:
    f = preflight_facts(failed_on(1, Check.GPU_COUNT, Why.GPU_COUNT))
    end = ended(f)
    assert end.end is AttemptEnd.PREFLIGHT_FAILED and repair.node_at_fault(end) == "i-1"
    # Both VMs still run: node 1 is replaced for its check, not for being gone.
    verdict = repair.judge_repair(end, f, seen(stood_by_after_preflight(0),
                                               alive=("i-0", "i-1")))  # fmt: skip
    assert isinstance(verdict, Repair)
    assert verdict.kept == ("i-0", None) and verdict.lost_ids == ("i-1",)
    assert verdict.end is AttemptEnd.PREFLIGHT_FAILED
    assert verdict.detail.endswith("; node 1 replaced, node 0 kept")


def test_the_passing_node_gets_time_to_stand_by_after_a_failed_preflight() -> None:
    f = preflight_facts(failed_on(1, Check.TORCH_GPUS, Why.NO_GPU))
    failing = replace(stood_by_after_preflight(1), exited_at=NOW - timedelta(seconds=10))
    assert repair.judge_repair(ended(f), f, seen(failing, alive=("i-0", "i-1"))) == Stay()
    late = replace(failing, exited_at=NOW - timedelta(seconds=repair.STANDBY_WAIT_SECONDS + 1))
    verdict = repair.judge_repair(ended(f), f, seen(late, alive=("i-0", "i-1")))
    assert isinstance(verdict, End)
    assert verdict.detail.endswith(f"the whole gang restarts: {Refusal.NOT_STANDING_BY}")


@pytest.mark.parametrize(
    ("rank", "check", "why"),
    [
        (None, Check.BANDWIDTH, Why.BELOW_FLOOR),  # the gang's, naming no node
        (None, Check.PROCESS_GROUP, Why.TIMED_OUT),
        (1, Check.PROCESS_GROUP, Why.PROCESS_GROUP_FAILED),  # not the node's own check
    ],
)
def test_a_preflight_the_gang_failed_restarts_the_gang(
    rank: int | None, check: Check, why: Why
) -> None:
    f = preflight_facts(failed_on(rank, check, why))
    verdict = judge.watch(f)
    assert isinstance(verdict, End) and verdict.end is AttemptEnd.PREFLIGHT_FAILED
    assert repair.candidate(verdict, f.job) is None


def test_a_preflight_the_job_failed_is_no_repair() -> None:
    f = preflight_facts(failed_on(1, Check.TORCH, Why.TORCH_MISSING))
    verdict = judge.watch(f)
    assert isinstance(verdict, End) and verdict.status is JobStatus.FAILED
    assert repair.candidate(verdict, f.job) is None


# -- what a standing-by node is told ----------------------------------------------------


def test_a_node_waits_until_the_next_attempt_holds_it_then_rejoins() -> None:
    first = attempt()
    assert repair.next_step(JobStatus.CHECKPOINTING, [first], 1, "i-0") == (RejoinStep.WAIT, None)
    closed = replace(first, ended_at=NOW, end_reason=AttemptEnd.PREEMPTED)
    assert repair.next_step(JobStatus.RECOVERING, [closed], 1, "i-0") == (RejoinStep.WAIT, None)
    opened = attempt(id=2, seq=2, instance_ids=(), client_token="j-1-a2")
    attempts = [closed, opened]
    assert repair.next_step(JobStatus.PROVISIONING, attempts, 1, "i-0") == (RejoinStep.WAIT, None)
    kept = replace(opened, instance_ids=("i-0", "i-9"))
    assert repair.next_step(JobStatus.PROVISIONING, [closed, kept], 1, "i-0") == (
        RejoinStep.REJOIN, kept)  # fmt: skip
    assert repair.next_step(JobStatus.PROVISIONING, [closed, kept], 1, "i-1") == (
        RejoinStep.LEAVE, None)  # fmt: skip


def test_a_node_leaves_a_job_that_ended_or_went_on_without_it() -> None:
    first = replace(attempt(), ended_at=NOW, end_reason=AttemptEnd.SUCCEEDED)
    assert repair.next_step(JobStatus.SUCCEEDED, [first], 1, "i-0") == (RejoinStep.LEAVE, None)
    refused = attempt(id=2, seq=2, ended_at=NOW, end_reason=AttemptEnd.NO_CAPACITY,
                      instance_ids=("i-0",))  # fmt: skip
    closed = replace(attempt(), ended_at=NOW, end_reason=AttemptEnd.PREEMPTED)
    assert repair.next_step(JobStatus.RECOVERING, [closed, refused], 1, "i-0") == (
        RejoinStep.LEAVE, None)  # fmt: skip


# -- ``move`` ----------------------------------------------------------------------------


def test_a_move_job_leaves_the_pool_its_gang_lost_a_node_in_until_it_ran_again() -> None:
    move = spec(**gang_spec("move"))
    lost = replace(attempt(), ended_at=NOW, end_reason=AttemptEnd.PREEMPTED)
    assert repair.moved_from(move, [lost]) == POOL
    assert repair.moved_from(spec(**gang_spec("restart")), [lost]) is None
    failed = attempt(id=2, seq=2, running_at=None, ended_at=NOW,
                     end_reason=AttemptEnd.NO_CAPACITY)  # fmt: skip
    assert repair.moved_from(move, [lost, failed]) == POOL
    ran = attempt(id=2, seq=2, pool=Pool("sim", "r2", "r2-a", "gpu.1x"))
    assert repair.moved_from(move, [lost, ran]) is None
    done = replace(attempt(), ended_at=NOW, end_reason=AttemptEnd.SUCCEEDED)
    assert repair.moved_from(move, [done]) is None
