"""A node kept from one attempt to the next (a gang whose lost node was replaced) is
billed once over its life: each attempt bills its share, and the sum is the node's bill."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from engine_support import spec

from spotd.billing.ledger import build_ledger, ledger_so_far, node_spans, spend_so_far, totals
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd, AttemptRecord, JobRecord, Market, NodeUsage, Pool

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
POOL = Pool("aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
JOB = JobRecord("j-1", "t", spec(), JobStatus.SUCCEEDED, None, T0, T0)


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def attempt(seq: int, ids: tuple[str, ...], start: float, end: float | None) -> AttemptRecord:
    return AttemptRecord(
        id=seq, job_id="j-1", seq=seq, pool=POOL, market=Market.SPOT, nodes=2,
        price_per_node_hour=3.6, client_token=f"j-1-a{seq}", instance_ids=ids,
        resume_from=None, started_at=s(start), running_at=s(start + 300),
        ended_at=None if end is None else s(end),
        end_reason=None if end is None else AttemptEnd.PREEMPTED,
    )  # fmt: skip


# Node "k" lives 0 -> 7200 s across both attempts; "a" dies at 3600; "b" boots at 3610.
FIRST = attempt(1, ("k", "a"), 0, 3600)
SECOND = attempt(2, ("k", "b"), 3610, 7200)
USAGE = {
    "k": NodeUsage("k", s(0), s(7200.5)),
    "a": NodeUsage("a", s(0), s(3601)),
    "b": NodeUsage("b", s(3610), s(7200.5)),
}


def test_only_nodes_of_several_attempts_have_spans() -> None:
    assert node_spans([FIRST, SECOND]) == {(1, "k"): (None, s(3610)), (2, "k"): (s(3610), None)}
    assert node_spans([FIRST]) == {}


def test_a_kept_node_is_billed_once_across_its_attempts() -> None:
    entries = build_ledger(JOB, [FIRST, SECOND], lambda *_: (), s(8000), usage=USAGE)
    by_attempt = {seq: sum(e.billed_seconds for e in entries if e.attempt == seq)
                  for seq in (1, 2)}  # fmt: skip
    # The kept node's life is rounded up once (7200.5 s -> 7201 s) and cut at the next
    # attempt's start; the others are billed as always.
    assert by_attempt == {1: 3610 + 3601, 2: 7201 - 3610 + 3591}
    assert sum(by_attempt.values()) == 7201 + 3601 + 3591
    assert totals(entries)[0] == pytest.approx((7201 + 3601 + 3591) / 3600 * 3.6)


def test_the_running_figure_does_not_bill_the_kept_node_twice() -> None:
    second = attempt(2, ("k", "b"), 3610, None)
    billed = build_ledger(JOB, [FIRST], lambda *_: (), s(3610), usage=USAGE)
    now = s(5410)
    so_far = ledger_so_far(JOB, [FIRST, second], billed, now)
    fresh = [e for e in so_far if e.attempt == 2]
    assert sum(e.billed_seconds for e in fresh) == 2 * 1800  # both nodes from 3610 only
    assert spend_so_far(JOB, [FIRST, second], billed, now) == pytest.approx(totals(so_far)[0])
