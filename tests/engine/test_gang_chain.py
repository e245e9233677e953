"""Which attempts' placement objects a repaired gang lives in, and which gang a node repair's
launch joins (pure functions of the job's attempts)."""

from __future__ import annotations

from datetime import UTC, datetime

from spotd.core.values import AttemptEnd, AttemptRecord, GangRef, Market, Pool
from spotd.engine.launching import gang_ref
from spotd.engine.placements import gang_chain, joined
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB, TAG_OWNER

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
POOL = Pool("fake", "r1", "r1a", "x1.gpu")


def attempt(seq: int, *ids: str, open_: bool = False) -> AttemptRecord:
    return AttemptRecord(
        seq, "j-1", seq, POOL, Market.SPOT, 2, 1.0, f"j-1-a{seq}", ids, None, EPOCH, EPOCH,
        None if open_ else EPOCH, None if open_ else AttemptEnd.PREEMPTED,
    )  # fmt: skip


def test_a_chain_follows_the_kept_nodes_back_to_the_gangs_first_attempt() -> None:
    first = attempt(1, "a", "b")
    second = attempt(2, "a", "c")  # kept a, replaced b
    third = attempt(3, "d", "c", open_=True)  # kept c, replaced a
    attempts = [first, second, third]
    assert [a.seq for a in gang_chain(attempts, third)] == [3, 2, 1]
    # Every earlier attempt's objects still hold the open gang's nodes.
    assert joined(attempts, first) and joined(attempts, second)


def test_a_whole_new_gang_starts_its_own_chain() -> None:
    first = attempt(1, "a", "b")
    second = attempt(2, "c", "d", open_=True)  # restarted whole: nothing kept
    attempts = [first, second]
    assert gang_chain(attempts, second) == [second]
    assert not joined(attempts, first)
    assert joined(attempts, second)


def test_nothing_is_joined_once_the_gang_ended() -> None:
    attempts = [attempt(1, "a", "b"), attempt(2, "a", "c")]
    assert not any(joined(attempts, a) for a in attempts)


def test_a_repair_joins_the_placement_of_the_gangs_first_attempt() -> None:
    # The repair attempt is open with no nodes recorded yet; its kept node is c.
    attempts = [attempt(1, "a", "b"), attempt(2, "a", "c"), attempt(3, open_=True)]
    ref = gang_ref(attempts, attempts[2], ("c",), owner="me")
    assert ref == GangRef("j-1-a1", {TAG_JOB: "j-1", TAG_ATTEMPT: "1", TAG_OWNER: "me"}, ("c",))
