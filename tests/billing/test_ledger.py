"""The cost ledger: billing, prices over time, egress, on-demand equivalent, store, sim bill."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from engine_support import fast_settings, run_until, spec

from spotd.billing.ledger import (
    PriceHistory,
    build_ledger,
    ledger_so_far,
    record_ledger,
    spend_by_attempt,
    spend_so_far,
    totals,
)
from spotd.core.states import JobStatus
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    JobRecord,
    LedgerEntry,
    Market,
    NodeUsage,
    Pool,
    PricePoint,
)
from spotd.daemon.wiring import build_engine
from spotd.market.catalog import billed_seconds
from spotd.store import SqlStore, open_store
from spotd_sim import SimProvider

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
AWS_E1 = Pool("aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
AWS_W2 = Pool("aws", "us-west-2", "us-west-2b", "p4d.24xlarge")
AWS_E1C = Pool("aws", "us-east-1", "us-east-1c", "p4d.24xlarge")
GCP_C1 = Pool("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g")


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job(size_gb: float = 1.0, status: JobStatus = JobStatus.SUCCEEDED) -> JobRecord:
    return JobRecord(
        id="j-0123456789", name="train", spec=spec(checkpoint={"size_gb": size_gb}),
        status=status, failure=None, submitted_at=T0, updated_at=T0,
    )  # fmt: skip


def attempt(
    seq: int = 1,
    pool: Pool = AWS_E1,
    *,
    start: float = 0,
    running: float | None = 300,
    end: float | None = 3600,
    price: float = 2.0,
    nodes: int = 1,
    market: Market = Market.SPOT,
    resume_from: str | None = None,
    reason: AttemptEnd | None = AttemptEnd.SUCCEEDED,
) -> AttemptRecord:
    return AttemptRecord(
        id=seq, job_id="j-0123456789", seq=seq, pool=pool, market=market, nodes=nodes,
        price_per_node_hour=price, client_token=f"tok-{seq}",
        instance_ids=tuple(f"i-{seq}-{n}" for n in range(nodes)), resume_from=resume_from,
        started_at=s(start), running_at=None if running is None else s(running),
        ended_at=None if end is None else s(end), end_reason=reason if end is not None else None,
    )  # fmt: skip


def history(*points: tuple[Pool, Market, float, float]) -> PriceHistory:
    """A price history of (pool, market, price, at seconds) points."""
    known = [PricePoint(p, m, price, None, s(sec)) for p, m, price, sec in points]

    def read(pool: Pool, market: Market, since: datetime) -> list[PricePoint]:
        return [k for k in known if k.pool == pool and k.market is market and k.at >= since]

    return read


NO_HISTORY = history()


def of(entries: Sequence[LedgerEntry], kind: str) -> list[LedgerEntry]:
    return [e for e in entries if e.kind == kind]


# -- billing granularity -----------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "seconds", "billed"),
    [
        ("aws", 59, 60), ("aws", 61.5, 62), ("aws", 0, 60), ("aws", 3600, 3600),
        ("gcp", 30, 60), ("gcp", 61.2, 62), ("gcp", 3600.0000001, 3600),
        ("azure", 61, 120), ("azure", 30, 60), ("azure", 120, 120), ("azure", 3599, 3600),
        ("sim-aws", 59, 60), ("sim-gcp", 61.5, 62), ("sim-azure", 61, 120),
    ],
)  # fmt: skip
def test_billing_granularity_per_provider(provider: str, seconds: float, billed: float) -> None:
    assert billed_seconds(provider, seconds) == billed


def test_each_node_is_billed_with_the_minimum() -> None:
    a = attempt(pool=Pool("azure", "eastus", "eastus-1", "Standard_ND96asr_v4"), nodes=2,
                start=0, running=10, end=61, price=36.0)  # fmt: skip
    entries = build_ledger(job(), [a], NO_HISTORY, s(4000))
    assert sum(e.billed_seconds for e in entries) == 2 * 120
    assert sum(e.usd for e in entries) == pytest.approx(2 * 36.0 * 120 / 3600)


# -- changeover and compute --------------------------------------------------------------


def test_launch_to_running_is_changeover_the_rest_compute() -> None:
    entries = build_ledger(job(), [attempt(nodes=2)], NO_HISTORY, s(9000))
    (change,) = of(entries, "changeover")
    (compute,) = of(entries, "compute")
    assert change.billed_seconds == 2 * 300 and compute.billed_seconds == 2 * 3300
    assert (change.start, change.end) == (s(0), s(300))
    assert (compute.start, compute.end) == (s(300), s(3600))
    assert change.usd == pytest.approx(2 * 2.0 * 300 / 3600)
    assert compute.usd == pytest.approx(2 * 2.0 * 3300 / 3600)
    # p4d.24xlarge: 8 A100 per node over EFA.
    assert (compute.gpu, compute.gpus, compute.nodes, compute.fabric) == ("A100", 16, 2, "efa")
    assert compute.gpu_hours == pytest.approx(16 * 3300 / 3600)
    assert change.wall_hours == pytest.approx(300 / 3600)
    assert {e.job_status for e in entries} == {"succeeded"}


def test_an_attempt_that_never_ran_is_all_changeover_with_the_minimum() -> None:
    a = attempt(pool=GCP_C1, running=None, end=20, reason=AttemptEnd.PREEMPTED)
    entries = build_ledger(job(), [a], NO_HISTORY, s(9000))
    assert [e.kind for e in entries] == ["changeover"]
    assert entries[0].billed_seconds == 60


def test_rounding_up_is_billed_as_compute() -> None:
    a = attempt(start=0, running=10, end=30.5)
    entries = build_ledger(job(), [a], NO_HISTORY, s(9000))
    assert of(entries, "changeover")[0].billed_seconds == 10
    assert of(entries, "compute")[0].billed_seconds == 50


def test_open_attempt_is_billed_up_to_now_and_launch_failures_not_at_all() -> None:
    running = attempt(end=None)
    failed = replace(
        attempt(seq=2, end=5, reason=AttemptEnd.LAUNCH_FAILED, running=None), instance_ids=()
    )
    entries = build_ledger(job(), [failed, running], NO_HISTORY, s(1800))
    assert {e.attempt for e in entries} == {1}
    assert sum(e.billed_seconds for e in entries) == 1800


def test_an_attempt_over_midnight_is_split_by_day() -> None:
    start = datetime(2026, 3, 2, 23, 0, tzinfo=UTC)
    a = replace(attempt(), started_at=start, running_at=start,
                ended_at=start + timedelta(hours=2))  # fmt: skip
    entries = build_ledger(job(), [a], NO_HISTORY, start + timedelta(hours=3))
    compute = of(entries, "compute")
    assert [e.start.day for e in compute] == [2, 3]
    assert [e.billed_seconds for e in compute] == [3600, 3600]
    assert sum(e.usd for e in compute) == pytest.approx(4.0)


# -- prices over time ----------------------------------------------------------------------


def test_prices_in_force_are_integrated_piecewise() -> None:
    prices = history(
        (AWS_E1, Market.SPOT, 1.0, -7200),  # in force at the start
        (AWS_E1, Market.SPOT, 3.0, 1800),  # changes half way
        (AWS_E1, Market.ON_DEMAND, 10.0, -7200),
        (AWS_W2, Market.SPOT, 99.0, 0),  # another pool: ignored
    )
    entries = build_ledger(job(), [attempt(running=0, price=2.0)], prices, s(9000))
    spend, on_demand = totals(entries)
    assert spend == pytest.approx(0.5 * 1.0 + 0.5 * 3.0)
    assert on_demand == pytest.approx(10.0)


def test_without_history_the_attempt_price_holds_until_the_first_point() -> None:
    prices = history((AWS_E1, Market.SPOT, 4.0, 2700))
    entries = build_ledger(job(), [attempt(running=0, price=2.0)], prices, s(9000))
    assert totals(entries)[0] == pytest.approx(0.75 * 2.0 + 0.25 * 4.0)
    assert totals(build_ledger(job(), [attempt(price=2.0)], NO_HISTORY, s(9000)))[0] == (
        pytest.approx(2.0)
    )


def test_simulated_providers_bill_the_attempt_price_and_node_usage_wins() -> None:
    sim_pool = Pool("sim-aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
    prices = history((sim_pool, Market.SPOT, 50.0, 0))
    entries = build_ledger(job(), [attempt(pool=sim_pool, running=0)], prices, s(9000))
    assert totals(entries)[0] == pytest.approx(2.0), "a sim price is fixed at launch"
    usage = {"i-1-0": NodeUsage("i-1-0", s(10), s(1810), price_per_hour=3.0)}
    entries = build_ledger(job(), [attempt(running=0)], prices, s(9000), usage=usage)
    assert sum(e.billed_seconds for e in entries) == 1800
    assert totals(entries)[0] == pytest.approx(1.5)


# -- egress ----------------------------------------------------------------------------------


def test_checkpoint_egress_across_regions_and_providers() -> None:
    attempts = [
        attempt(1, AWS_E1, start=0, end=600, reason=AttemptEnd.PREEMPTED),
        attempt(2, AWS_E1C, start=600, end=1200, resume_from="ck/1"),  # same region: free
        attempt(3, AWS_W2, start=1200, end=1800, resume_from="ck/2"),  # inter-region
        attempt(4, GCP_C1, start=1800, end=2400, resume_from="ck/3"),  # aws -> gcp
        attempt(5, AWS_E1, start=2400, end=3000, resume_from=None),  # nothing to move
    ]
    entries = build_ledger(job(size_gb=50), attempts, NO_HISTORY, s(9000))
    egress = of(entries, "egress")
    assert [e.attempt for e in egress] == [3, 4]
    assert egress[0].usd == pytest.approx(50 * 0.02)
    assert egress[1].usd == pytest.approx(50 * 0.09), "the source provider's internet egress"
    assert all(e.on_demand_usd == 0 and e.billed_seconds == 0 for e in egress)


def test_egress_comes_from_the_last_attempt_that_ran() -> None:
    attempts = [
        attempt(1, AWS_E1, start=0, end=600, reason=AttemptEnd.PREEMPTED),
        attempt(
            2,
            AWS_W2,
            start=600,
            running=None,
            end=700,
            reason=AttemptEnd.PREEMPTED,
            resume_from="ck/1",
        ),
        attempt(3, AWS_E1C, start=700, end=1800, resume_from="ck/1"),
    ]
    egress = of(build_ledger(job(size_gb=10), attempts, NO_HISTORY, s(9000)), "egress")
    assert [e.attempt for e in egress] == [2], "attempt 3 is back where the checkpoint is"


# -- on-demand equivalent ----------------------------------------------------------------------


def test_on_demand_equivalent_sources() -> None:
    a = attempt(running=0, price=2.0)
    by_history = history((AWS_E1, Market.ON_DEMAND, 8.0, -60))
    assert totals(build_ledger(job(), [a], by_history, s(9000)))[1] == pytest.approx(8.0)
    fallback = {AWS_E1: 6.0}
    od = totals(build_ledger(job(), [a], NO_HISTORY, s(9000), on_demand_prices=fallback))[1]
    assert od == pytest.approx(6.0)
    assert totals(build_ledger(job(), [a], NO_HISTORY, s(9000)))[1] == pytest.approx(2.0), (
        "no on-demand price known: no saving claimed"
    )
    on_demand = attempt(running=0, price=7.0, market=Market.ON_DEMAND)
    spend, od = totals(build_ledger(job(), [on_demand], by_history, s(9000)))
    assert spend == od == pytest.approx(8.0), "on-demand pays the on-demand prices in force"
    spend, od = totals(build_ledger(job(), [on_demand], NO_HISTORY, s(9000)))
    assert spend == od == pytest.approx(7.0)


def test_only_the_first_boot_has_an_on_demand_equivalent() -> None:
    """An on-demand run boots once: the changeovers of recoveries are spot's own overhead."""
    first = attempt(1, end=3600, reason=AttemptEnd.PREEMPTED)
    second = attempt(2, start=3700, running=4000, end=7200)
    entries = build_ledger(job(), [first, second], NO_HISTORY, s(9000),
                           on_demand_prices={AWS_E1: 6.0})  # fmt: skip
    changes = {e.attempt: e for e in of(entries, "changeover")}
    assert changes[1].on_demand_usd == pytest.approx(6.0 * 300 / 3600)
    assert changes[2].on_demand_usd == 0.0
    assert changes[2].usd > 0, "the recovery's changeover is still paid"


# -- so far: the one cost of a running job -------------------------------------------------------


def test_so_far_keeps_the_bills_of_closed_attempts_and_bills_the_rest_to_now() -> None:
    # Attempt 1 billed 7.0 (say, the prices in force); 2 closed with no bill stored yet;
    # 3 open and moved to another region (egress), 2 nodes, 10 s old: a minute each.
    one = attempt(1, AWS_E1, start=0, end=600, reason=AttemptEnd.PREEMPTED)
    two = attempt(2, AWS_E1C, start=600, end=1200, reason=AttemptEnd.PREEMPTED)
    three = attempt(3, AWS_W2, start=1200, end=None, nodes=2, price=36.0, resume_from="ck/2")
    stored = [replace(e, usd=3.5) for e in build_ledger(job(), [one], NO_HISTORY, s(600))]
    stale = build_ledger(job(), [one, two, three], NO_HISTORY, s(1205))  # an old line of 3
    now = s(1210)
    assert len(stored) == 2, "changeover and compute, 3.5 each"
    stale = [*stored, *of(stale, "compute")[2:]]
    entries = ledger_so_far(job(), [one, two, three], stale, now)
    by_attempt = spend_by_attempt(entries)
    assert by_attempt[1] == pytest.approx(7.0), "the stored bill"
    assert by_attempt[2] == pytest.approx(600 / 3600 * 2.0), "closed, not billed: by the rules"
    assert by_attempt[3] == pytest.approx(2 * 60 / 3600 * 36.0 + 1.0 * 0.02), (
        "open: a stored line of it is stale; a minute per node and the checkpoint's move"
    )
    for billed in ([], stored, stale):
        assert spend_so_far(job(), [one, two, three], billed, now) == pytest.approx(
            totals(ledger_so_far(job(), [one, two, three], billed, now))[0]
        )
    # Every attempt closed and billed: the stored ledger is the figure, as it is.
    assert ledger_so_far(job(), [one], stored, s(99999)) == stored


def test_so_far_reads_no_price_history() -> None:
    def unread(pool: Pool, market: Market, since: datetime) -> list[PricePoint]:
        raise AssertionError("the price history was read")

    a = attempt(end=None, price=3.6)
    assert spend_so_far(job(), [a], [], s(30)) == pytest.approx(0.06), "60 s at 3.6 USD/h"
    with pytest.raises(AssertionError):
        build_ledger(job(), [a], unread, s(30))  # the final bill does read it


# -- store -------------------------------------------------------------------------------------


def _entries() -> list[LedgerEntry]:
    attempts = [
        attempt(1, AWS_E1, start=0, end=600, reason=AttemptEnd.PREEMPTED),
        attempt(2, GCP_C1, start=600, end=90000, resume_from="ck/1"),
    ]
    return build_ledger(job(size_gb=20), attempts, NO_HISTORY, s(99999),
                        on_demand_prices={AWS_E1: 30.0, GCP_C1: 3.5})  # fmt: skip


def test_ledger_round_trip(store: SqlStore) -> None:
    entries = _entries()
    store.replace_ledger("j-0123456789", entries)
    store.replace_ledger("j-other", [replace(e, job_id="j-other") for e in entries[:1]])
    assert store.ledger(job_id="j-0123456789") == entries
    assert len(store.ledger()) == len(entries) + 1
    next_day = datetime(2026, 3, 3, tzinfo=UTC)
    assert store.ledger(since=next_day, job_id="j-0123456789") == [
        e for e in entries if e.start >= next_day
    ]
    assert store.ledger(until=next_day) == sorted(
        [e for e in entries if e.start < next_day] + [replace(entries[0], job_id="j-other")],
        key=lambda e: (e.start, e.job_id),
    )
    store.replace_ledger("j-0123456789", entries[:2])
    assert store.ledger(job_id="j-0123456789") == entries[:2], "replaced, not added"
    assert len(store.ledger(job_id="j-other")) == 1


def test_claim_notification_once(store: SqlStore) -> None:
    assert store.claim_notification("budget:j-1:80", at=T0) is True
    assert store.claim_notification("budget:j-1:80", at=s(60)) is False
    assert store.claim_notification("budget:j-1:100", at=s(60)) is True


def test_claim_notification_under_two_concurrent_stores(store_url: str) -> None:
    stores = [open_store(store_url), open_store(store_url)]
    keys = [f"k{n}" for n in range(25)]
    won: dict[int, list[str]] = defaultdict(list)
    barrier = threading.Barrier(2)

    def claim_all(n: int) -> None:
        barrier.wait()
        won[n].extend(k for k in keys if stores[n].claim_notification(k, at=T0))

    threads = [threading.Thread(target=claim_all, args=(n,)) for n in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        for st in stores:
            st.close()
    assert sorted(won[0] + won[1]) == sorted(keys), "every key claimed exactly once"


# -- acceptance: the ledger equals the simulated provider's bill ------------------------------


def test_ledger_equals_the_simulated_providers_bill(tmp_path: Path) -> None:
    engine = build_engine(fast_settings(tmp_path))
    try:
        submitted = engine.submit(spec("import time; time.sleep(2)"))
        run_until(engine, submitted.id, lambda j: j.status is JobStatus.RUNNING)
        (first,) = engine.store.attempts(submitted.id)
        sim = engine.providers[first.pool.provider]
        assert isinstance(sim, SimProvider)
        sim.reclaim(first.instance_ids[0])
        done = run_until(engine, submitted.id, lambda j: j.status.terminal, timeout=60)
        assert done.status is JobStatus.SUCCEEDED
        attempts = engine.store.attempts(submitted.id)
        assert attempts[0].end_reason is AttemptEnd.PREEMPTED and len(attempts) >= 2

        usage: dict[str, NodeUsage] = {}
        sims: dict[str, SimProvider] = {}
        for a in attempts:
            provider = engine.providers[a.pool.provider]
            assert isinstance(provider, SimProvider)
            sims[provider.name] = provider
            usage.update(provider.usage(a.instance_ids))
        od = {o.pool: o.on_demand_price for o in engine.market.offerings() if o.on_demand_price}
        entries = record_ledger(engine.store, done, engine.clock.now(), usage=usage,
                                on_demand_prices=od)  # fmt: skip
        assert engine.store.ledger(job_id=done.id) == entries

        metered = [e for e in entries if e.kind != "egress"]
        for a in attempts:
            mine = sum(e.usd for e in metered if e.attempt == a.seq)
            assert round(mine, 2) == sims[a.pool.provider].bill(a.instance_ids), a
        by_provider: dict[str, list[str]] = defaultdict(list)
        for a in attempts:
            by_provider[a.pool.provider].extend(a.instance_ids)
        bill = sum(sims[p].bill(ids) for p, ids in by_provider.items())
        assert round(sum(e.usd for e in metered), 2) == pytest.approx(bill, abs=1e-9)
        assert bill > 0
        assert totals(entries)[1] > totals(entries)[0], "spot was cheaper than on-demand"
    finally:
        for provider in engine.providers.values():
            provider.terminate([i.id for i in provider.list_instances({}) if not i.ended])
        engine.store.close()
