"""Prometheus metrics: names and values over a real store (SQLite and PostgreSQL), checked
against the ledger, and the /metrics route."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import Depends, FastAPI, HTTPException
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event

from spotd.billing.ledger import ledger_so_far, totals
from spotd.core.agent_wire import PreflightFigures
from spotd.core.clock import ManualClock
from spotd.core.network import Fabric, Interconnect
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import (
    AttemptClose,
    AttemptEnd,
    AttemptRecord,
    InstanceReport,
    JobRecord,
    LedgerEntry,
    Market,
    NewAttempt,
    Offering,
    Pool,
    Transition,
)
from spotd.daemon.metrics import (
    NOTICE_BUCKETS,
    PLACEMENT_BUCKETS,
    RECENT_ENDED_MAX,
    FleetTotals,
    SpotdCollector,
    build_registry,
    create_metrics_router,
    placement_waits,
    render,
    store_totals,
)
from spotd.mail import Composed, Outbox
from spotd.market.cache import Snapshot
from spotd.store import SqlStore

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
S = timedelta(seconds=1)
WALL = 1_800_000_000.0
POOL = Pool("sim-aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
POOL_B = Pool("sim-gcp", "us-central1", "us-central1-a", "a2-highgpu-8g")


def make_spec(name: str, team: str | None = None) -> JobSpec:
    body: dict[str, object] = {
        "name": name,
        "command": ["true"],
        "resources": {"gpus": ["A100"], "gpus_per_node": 8},
    }
    if team is not None:
        body["team"] = team
    return JobSpec.model_validate(body)


class FakeClock:
    def now(self) -> datetime:
        return NOW

    def seconds_to_real(self, seconds: float) -> float:
        return seconds


@dataclass
class FakeMarket:
    snaps: dict[str, Snapshot]
    offerings: dict[Pool, Offering] = field(default_factory=dict)

    def snapshots(self) -> dict[str, Snapshot]:
        return dict(self.snaps)

    def find(self, pool: Pool) -> Offering | None:
        return self.offerings.get(pool)


@dataclass
class FakeEngine:
    """What the metrics read of an engine: a real store, a market cache and a clock."""

    store: SqlStore
    market: FakeMarket
    clock: FakeClock = field(default_factory=FakeClock)


def offering(pool: Pool, spot: float, on_demand: float) -> Offering:
    return Offering(pool, "A100", 8, 40, Interconnect(Fabric.EFA, 50.0), spot, on_demand)


class Jobs:
    """Writes jobs through the store's own transitions, at given times."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store

    def submit(self, name: str, at: datetime, team: str | None = None) -> JobRecord:
        return self.store.create_job(make_spec(name, team), now=at)

    def move(self, job: JobRecord, new: JobStatus, at: datetime, **kw: object) -> JobRecord:
        change = Transition(job.id, job.status, new, cause=f"to {new}", **kw)  # type: ignore[arg-type]
        return self.store.compare_and_set(change, now=at)

    def run(
        self,
        job: JobRecord,
        pool: Pool,
        start: datetime,
        running: datetime,
        *,
        price: float = 10.0,
        market: Market = Market.SPOT,
        nodes: int = 1,
    ) -> tuple[JobRecord, AttemptRecord]:
        """Place ``job`` at ``start`` and see every node running at ``running``."""
        placed = NewAttempt(
            pool=pool, market=market, nodes=nodes, price_per_node_hour=price, resume_from=None
        )
        job = self.move(job, JobStatus.PROVISIONING, start, open_attempt=placed)
        attempt = self.store.attempts(job.id)[-1]
        self.store.set_attempt_instances(
            attempt.id, [f"i-{job.name}-{attempt.seq}-{n}" for n in range(nodes)]
        )
        self.store.mark_attempt_running(attempt.id, at=running)
        job = self.move(job, JobStatus.RUNNING, running)
        return job, self.store.attempts(job.id)[-1]

    def end(
        self,
        job: JobRecord,
        attempt: AttemptRecord,
        new: JobStatus,
        reason: AttemptEnd,
        at: datetime,
    ) -> JobRecord:
        return self.move(job, new, at, close_attempt=AttemptClose(attempt.id, reason))

    def bill(self, job: JobRecord, *lines: tuple[AttemptRecord, float, float]) -> None:
        self.store.replace_ledger(job.id, [line(a, usd, od) for a, usd, od in lines])

    def report(self, attempt: AttemptRecord, node: int = 0, **fields: object) -> None:
        self.store.save_report(
            InstanceReport(
                instance_id=attempt.instance_ids[node],
                provider=attempt.pool.provider,
                job_id=attempt.job_id,
                attempt=attempt.seq,
                **fields,  # type: ignore[arg-type]
            )
        )


def line(a: AttemptRecord, usd: float, on_demand: float) -> LedgerEntry:
    end = a.ended_at or NOW
    return LedgerEntry(
        job_id=a.job_id,
        attempt=a.seq,
        provider=a.pool.provider,
        region=a.pool.region,
        zone=a.pool.zone,
        instance_type=a.pool.instance_type,
        gpu="A100",
        gpus=8,
        nodes=a.nodes,
        fabric="efa",
        market=str(a.market),
        kind="compute",
        start=a.started_at,
        end=end,
        billed_seconds=(end - a.started_at).total_seconds(),
        usd=usd,
        on_demand_usd=on_demand,
        job_status="succeeded",
    )


def preflight(passed: bool, busbw: float | None) -> str:
    return PreflightFigures(passed=passed, busbw_gbps=busbw, world_size=2).model_dump_json()


def fill(store: SqlStore) -> None:
    """The fleet every test reads, on both backends:

    - ``a`` (team nlp) running: attempt 1 preempted after 2 h and billed 20 USD (60 on
      demand); attempt 2 running for 3 h, priced to now. Its node's agent reported the
      notice 25 s before the job exited.
    - ``b`` running on demand in another pool, 2 nodes, whose gang preflight measured
      180 GB/s.
    - ``c`` pending.
    - ``d`` succeeded 2 h ago (no series of its own): attempt 1 preempted (notice, killed
      before the job exited; preflight failed at 12.5 GB/s), attempt 2 succeeded, both
      billed.
    - ``e`` cancelled half an hour ago while pending.
    """
    w = Jobs(store)
    a = w.submit("a", NOW - 6 * H, team="nlp")
    a, a1 = w.run(a, POOL, NOW - 5 * H, NOW - 5 * H + 600 * S)
    w.report(
        a1,
        notice_at=NOW - 3 * H - 60 * S,
        notice_kind="preemption",
        exited_at=NOW - 3 * H - 35 * S,
        exit_code=0,
    )
    a = w.end(a, a1, JobStatus.RECOVERING, AttemptEnd.PREEMPTED, NOW - 3 * H)
    a1 = store.attempts(a.id)[0]
    w.bill(a, (a1, 20.0, 60.0))
    a, _ = w.run(a, POOL, NOW - 3 * H, NOW - 3 * H + 300 * S)

    b = w.submit("b", NOW - 2 * H)
    b, b1 = w.run(b, POOL_B, NOW - H, NOW - H, price=30.0, market=Market.ON_DEMAND, nodes=2)
    for node in (0, 1):
        w.report(b1, node, preflight=preflight(True, 180.0))

    w.submit("c", NOW - H)

    d = w.submit("d", NOW - 5 * H)
    d, d1 = w.run(d, POOL, NOW - 4 * H, NOW - 4 * H + 120 * S)
    w.report(
        d1,
        notice_at=NOW - 3 * H - 30 * S,
        notice_kind="preemption",
        preflight=preflight(False, 12.5),
    )
    d = w.end(d, d1, JobStatus.RECOVERING, AttemptEnd.PREEMPTED, NOW - 3 * H)
    d, d2 = w.run(d, POOL, NOW - 3 * H, NOW - 3 * H + 60 * S)
    d = w.end(d, d2, JobStatus.SUCCEEDED, AttemptEnd.SUCCEEDED, NOW - 2 * H)
    d1, d2 = store.attempts(d.id)
    w.bill(d, (d1, 7.5, 30.0), (d2, 8.0, 30.0))

    e = w.submit("e", NOW - 40 * 60 * S)
    w.move(e, JobStatus.CANCELLED, NOW - 30 * 60 * S)


def market() -> FakeMarket:
    return FakeMarket(
        snaps={
            "sim-aws": Snapshot((), fetched_at=WALL - 42.0),
            "gcp": Snapshot(
                (), fetched_at=WALL - 900.0, error="ProviderUnavailable: 503", failures=3
            ),
            "azure": Snapshot((), fetched_at=0.0),
        },
        offerings={POOL: offering(POOL, 10.0, 30.0), POOL_B: offering(POOL_B, 30.0, 30.0)},
    )


@pytest.fixture(scope="module")
def fleet(module_store: SqlStore) -> FakeEngine:
    """The filled store, once per backend (the tests only read it)."""
    fill(module_store)
    return FakeEngine(module_store, market())


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(
    engine: FakeEngine,
    spend_fn: Callable[[], FleetTotals] | None = None,
    outbox: Outbox | None = None,
) -> str:
    registry = CollectorRegistry()
    # The poll ages read the wall clock: pin it.
    registry.register(
        SpotdCollector(
            engine,
            spend_fn,
            outbox=outbox,
            wall=ManualClock(datetime.fromtimestamp(WALL, UTC)),
        )
    )
    return render(registry).decode()


def ledger_of(engine: FakeEngine, job: JobRecord) -> list[LedgerEntry]:
    """The reference: the job's ledger so far, as ``spotd status`` reads it."""
    attempts = engine.store.attempts(job.id)
    prices = {
        a.pool: o.on_demand_price
        for a in attempts
        if (o := engine.market.find(a.pool)) is not None and o.on_demand_price is not None
    }
    return ledger_so_far(
        job, attempts, engine.store.ledger(job_id=job.id), NOW, on_demand_prices=prices
    )


def by_name(engine: FakeEngine) -> dict[str, JobRecord]:
    return {j.name: j for j in engine.store.list_jobs()}


def job_labels(job: JobRecord) -> tuple[tuple[str, str], ...]:
    return (("job_id", job.id), ("job_name", job.name), ("team", job.spec.team or ""))


def pool_labels(pool: Pool, **more: str) -> tuple[tuple[str, str], ...]:
    labels = {
        "provider": pool.provider,
        "region": pool.region,
        "zone": pool.zone,
        "instance_type": pool.instance_type,
        **more,
    }
    return tuple(sorted(labels.items()))


# -- fleet -------------------------------------------------------------------------


def test_build_registry_is_fresh_each_time(fleet: FakeEngine) -> None:
    one, two = build_registry(fleet), build_registry(fleet)  # type: ignore[arg-type]
    assert one is not two
    assert "spotd_spend_usd " in render(one).decode()


def test_fleet_totals_are_the_ledgers_of_every_job(fleet: FakeEngine) -> None:
    text = scrape(fleet)
    got = samples(text)
    ledgers = [ledger_of(fleet, j) for j in fleet.store.list_jobs()]
    spend = sum(totals(entries)[0] for entries in ledgers)
    on_demand = sum(totals(entries)[1] for entries in ledgers)
    # a 20 + 3 h at 10, b 1 h at 30 on 2 nodes, d 7.5 + 8 by its stored ledger.
    assert spend == pytest.approx(20 + 30 + 60 + 15.5)
    assert got[("spotd_spend_usd", ())] == pytest.approx(spend)
    assert got[("spotd_savings_usd", ())] == pytest.approx(on_demand - spend)
    assert got[("spotd_preemptions_total", ())] == 2
    assert got[("spotd_active_jobs", (("status", "running"),))] == 2
    assert got[("spotd_active_jobs", (("status", "pending"),))] == 1
    for idle in ("provisioning", "checkpointing", "recovering"):
        assert got[("spotd_active_jobs", (("status", idle),))] == 0
    assert ("spotd_active_jobs", (("status", "succeeded"),)) not in got
    assert got[("spotd_price_poll_age_seconds", (("provider", "sim-aws"),))] == pytest.approx(42)
    assert got[("spotd_price_poll_age_seconds", (("provider", "gcp"),))] == pytest.approx(900)
    assert math.isinf(got[("spotd_price_poll_age_seconds", (("provider", "azure"),))])
    assert got[("spotd_price_poll_failures", (("provider", "gcp"),))] == 3
    assert got[("spotd_price_poll_failures", (("provider", "sim-aws"),))] == 0
    assert "# TYPE spotd_preemptions_total counter" in text
    assert "# TYPE spotd_spend_usd gauge" in text


def test_store_totals_agree_with_the_scrape(fleet: FakeEngine) -> None:
    got = samples(scrape(fleet))
    t = store_totals(fleet)()  # type: ignore[arg-type]
    assert t.spent_usd == pytest.approx(got[("spotd_spend_usd", ())])
    assert t.savings_usd == pytest.approx(got[("spotd_savings_usd", ())])
    assert t.preemptions == 2


def test_spend_fn_overrides_the_store_totals(fleet: FakeEngine) -> None:
    got = samples(scrape(fleet, spend_fn=lambda: FleetTotals(1.5, 0.25, 7)))
    assert got[("spotd_spend_usd", ())] == 1.5
    assert got[("spotd_savings_usd", ())] == 0.25
    assert got[("spotd_preemptions_total", ())] == 7


def test_without_market_prices_the_running_attempts_claim_no_savings(fleet: FakeEngine) -> None:
    bare = FakeEngine(fleet.store, FakeMarket(snaps={}))
    t = store_totals(bare)()  # type: ignore[arg-type]
    spend, on_demand = totals([e for j in fleet.store.list_jobs() for e in ledger_of(bare, j)])
    assert t.savings_usd == pytest.approx(on_demand - spend)
    # The stored lines' savings (a's first attempt 60 - 20, d's 60 - 15.5), less a's
    # recovery: its 300 s boot is spot's own overhead, no on-demand run would pay it.
    assert t.savings_usd == pytest.approx(40.0 + 44.5 - 300 / 3600 * 10)


def test_a_failing_section_leaves_the_others(
    fleet: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> FleetTotals:
        raise RuntimeError("database gone")

    with caplog.at_level(logging.ERROR, logger="spotd.daemon.metrics"):
        got = samples(scrape(fleet, spend_fn=broken))
    assert ("spotd_spend_usd", ()) not in got
    assert got[("spotd_active_jobs", (("status", "running"),))] == 2
    assert ("spotd_price_poll_age_seconds", (("provider", "gcp"),)) in got
    assert "reading totals failed" in caplog.text


def test_an_unreadable_store_leaves_the_daemons_own_series(
    fleet: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    class Gone:
        def list_jobs(self, statuses: object = None) -> list[JobRecord]:
            raise RuntimeError("database gone")

    broken = FakeEngine(Gone(), fleet.market)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="spotd.daemon.metrics"):
        got = samples(scrape(broken))
    assert not any(name.startswith(("spotd_job_", "spotd_pool_", "spotd_spend")) for name, _ in got)
    assert ("spotd_price_poll_age_seconds", (("provider", "gcp"),)) in got
    assert "reading the store failed" in caplog.text


def test_outbox_size(fleet: FakeEngine, tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    for i in range(2):
        outbox.put(Composed(f"m{i}", "t").message("a@example.com", ["b@example.com"]))
    got = samples(scrape(fleet, outbox=outbox))
    assert got[("spotd_outbox_messages", ())] == 2


def test_registries_do_not_clash(fleet: FakeEngine, store: SqlStore) -> None:
    other = FakeEngine(store, market())
    Jobs(store).submit("x", NOW - H)
    assert samples(scrape(fleet))[("spotd_active_jobs", (("status", "pending"),))] == 1
    assert samples(scrape(other))[("spotd_active_jobs", (("status", "pending"),))] == 1
    assert samples(scrape(other))[("spotd_active_jobs", (("status", "running"),))] == 0


# -- per job -------------------------------------------------------------------------


def test_per_job_series_for_active_and_recently_ended_jobs(fleet: FakeEngine) -> None:
    got = samples(scrape(fleet))
    jobs = by_name(fleet)
    shown = {dict(labels)["job_name"] for name, labels in got if name == "spotd_job_spend_usd"}
    # d ended 2 h ago: past the hour an ended job keeps its series.
    assert shown == {"a", "b", "c", "e"}
    for name in shown:
        job = jobs[name]
        spend = totals(ledger_of(fleet, job))[0]
        assert got[("spotd_job_spend_usd", job_labels(job))] == pytest.approx(spend), name
        status = (*job_labels(job), ("status", str(job.status)))
        assert got[("spotd_job_status", tuple(sorted(status)))] == 1
    a = jobs["a"]
    assert dict(job_labels(a))["team"] == "nlp"
    assert got[("spotd_job_spend_usd", job_labels(a))] == pytest.approx(50.0)
    reason = tuple(sorted((*job_labels(a), ("reason", "preempted"))))
    assert got[("spotd_job_attempts_total", reason)] == 1
    # Its latest placement: the recovery, 300 s from the preemption to running.
    assert got[("spotd_job_placement_seconds", job_labels(a))] == pytest.approx(300.0)
    assert got[("spotd_job_notice_to_checkpoint_seconds", job_labels(a))] == pytest.approx(25.0)
    b = jobs["b"]
    assert got[("spotd_job_preflight_bus_bandwidth_bytes_per_second", job_labels(b))] == (
        pytest.approx(180e9)
    )
    assert ("spotd_job_placement_seconds", job_labels(jobs["c"])) not in got, "never ran"
    assert ("spotd_job_notice_to_checkpoint_seconds", job_labels(b)) not in got


def test_placement_waits_count_from_submission_or_recovery(fleet: FakeEngine) -> None:
    jobs = by_name(fleet)
    a, d = jobs["a"], jobs["d"]
    assert placement_waits(a, fleet.store.attempts(a.id)) == [4200.0, 300.0]
    assert placement_waits(d, fleet.store.attempts(d.id)) == [3720.0, 60.0]


def test_recently_ended_jobs_are_bounded(store: SqlStore) -> None:
    w = Jobs(store)
    for i in range(RECENT_ENDED_MAX + 5):
        w.move(w.submit(f"j{i}", NOW - H), JobStatus.CANCELLED, NOW - 60 * S + i * S)
    got = samples(scrape(FakeEngine(store, market())))
    shown = sorted(dict(labels)["job_name"] for name, labels in got if name == "spotd_job_status")
    assert len(shown) == RECENT_ENDED_MAX
    assert "j0" not in shown and f"j{RECENT_ENDED_MAX + 4}" in shown, "the latest ended"


# -- per pool ------------------------------------------------------------------------


def test_pool_spend_adds_up_to_the_fleet_spend(fleet: FakeEngine) -> None:
    got = samples(scrape(fleet))
    spot = got[("spotd_pool_spend_usd", pool_labels(POOL, market="spot"))]
    on_demand = got[("spotd_pool_spend_usd", pool_labels(POOL_B, market="on-demand"))]
    assert spot == pytest.approx(20 + 30 + 15.5)
    assert on_demand == pytest.approx(60.0)
    assert spot + on_demand == pytest.approx(got[("spotd_spend_usd", ())])


def test_pool_attempts_by_end_reason(fleet: FakeEngine) -> None:
    got = samples(scrape(fleet))
    assert (
        got[("spotd_pool_attempts_total", pool_labels(POOL, market="spot", reason="preempted"))]
        == 2
    )
    assert (
        got[("spotd_pool_attempts_total", pool_labels(POOL, market="spot", reason="succeeded"))]
        == 1
    )
    assert not any(
        name == "spotd_pool_attempts_total" and dict(labels)["zone"] == POOL_B.zone
        for name, labels in got
    ), "b's attempt is still open"


def test_placement_histogram_per_pool(fleet: FakeEngine) -> None:
    got = samples(scrape(fleet))
    # POOL: a 4200 and 300, d 3720 and 60 s; POOL_B: b 3600 s (submitted 2 h ago, ran 1 h ago).
    expected = {60: 1, 300: 2, 600: 2, 1800: 2, 3600: 2, 7200: 4, 21600: 4, 86400: 4}
    assert set(expected) == set(PLACEMENT_BUCKETS)
    for bound, count in expected.items():
        key = ("spotd_pool_placement_seconds_bucket", pool_labels(POOL, le=repr(float(bound))))
        assert got[key] == count, bound
    assert got[("spotd_pool_placement_seconds_bucket", pool_labels(POOL, le="+Inf"))] == 4
    assert got[("spotd_pool_placement_seconds_count", pool_labels(POOL))] == 4
    assert got[("spotd_pool_placement_seconds_sum", pool_labels(POOL))] == pytest.approx(8280)
    assert got[("spotd_pool_placement_seconds_sum", pool_labels(POOL_B))] == pytest.approx(3600)
    le_3600 = pool_labels(POOL_B, le="3600.0")
    assert got[("spotd_pool_placement_seconds_bucket", le_3600)] == 1


def test_notice_to_checkpoint_per_pool(fleet: FakeEngine) -> None:
    got = samples(scrape(fleet))
    assert got[("spotd_pool_preemption_notices_total", pool_labels(POOL))] == 2
    # a's node exited 25 s after its notice; d's was killed first: not observed.
    assert got[("spotd_pool_notice_to_checkpoint_seconds_count", pool_labels(POOL))] == 1
    assert got[("spotd_pool_notice_to_checkpoint_seconds_sum", pool_labels(POOL))] == (
        pytest.approx(25.0)
    )
    below = [b for b in NOTICE_BUCKETS if b < 25]
    for bound in NOTICE_BUCKETS:
        key = (
            "spotd_pool_notice_to_checkpoint_seconds_bucket",
            pool_labels(POOL, le=repr(float(bound))),
        )
        assert got[key] == (0 if bound in below else 1), bound


def test_preflights_per_pool(fleet: FakeEngine) -> None:
    got = samples(scrape(fleet))
    # b's two nodes report one verdict: one attempt.
    assert got[("spotd_pool_preflights_total", pool_labels(POOL_B, result="passed"))] == 1
    assert got[("spotd_pool_preflights_total", pool_labels(POOL_B, result="failed"))] == 0
    assert got[("spotd_pool_preflights_total", pool_labels(POOL, result="failed"))] == 1
    bandwidth = "spotd_pool_preflight_bus_bandwidth_bytes_per_second"
    assert got[(bandwidth, pool_labels(POOL_B))] == pytest.approx(180e9)
    assert got[(bandwidth, pool_labels(POOL))] == pytest.approx(12.5e9)


def test_the_latest_preflight_is_the_pools_figure(store: SqlStore) -> None:
    w = Jobs(store)
    for i, busbw in enumerate((100.0, 150.0, None)):
        _, attempt = w.run(
            w.submit(f"g{i}", NOW - 5 * H), POOL, NOW - (4 - i) * H, NOW - (4 - i) * H
        )
        w.report(attempt, preflight=preflight(True, busbw))
    got = samples(scrape(FakeEngine(store, market())))
    assert got[("spotd_pool_preflight_bus_bandwidth_bytes_per_second", pool_labels(POOL))] == (
        pytest.approx(150e9)
    ), "the latest attempt that measured one"
    assert got[("spotd_pool_preflights_total", pool_labels(POOL, result="passed"))] == 3


# -- cost -------------------------------------------------------------------------


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_scrape_makes_as_many_queries_for_many_jobs_as_for_few(store: SqlStore) -> None:
    """The per-job figures are read for every shown job at once; the rest is aggregated:
    ten times the jobs, the same statements."""
    statements: list[str] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    def queries_for(jobs: int) -> int:
        w = Jobs(store)
        for i in range(jobs):
            job, attempt = w.run(w.submit(f"n{i}", NOW - 6 * H), POOL, NOW - 5 * H, NOW - 4 * H)
            if i % 2:  # ended long ago, and never billed: priced by the scrape too
                w.end(job, attempt, JobStatus.SUCCEEDED, AttemptEnd.SUCCEEDED, NOW - 3 * H)
        statements.clear()
        scrape(FakeEngine(store, market()))
        return len(statements)

    few = queries_for(10)
    assert queries_for(90) == few


# -- the route ---------------------------------------------------------------------


def get(app: FastAPI, path: str) -> httpx.Response:
    """GET ``path`` from the ASGI app in process (httpx's transport, no server; it runs
    no lifespan hooks, which the metrics router has none of)."""

    async def fetch() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://spotd") as client:
            return await client.get(path)

    return asyncio.run(fetch())


def test_metrics_route(fleet: FakeEngine) -> None:
    app = FastAPI()
    app.include_router(create_metrics_router(fleet))  # type: ignore[arg-type]
    reply = get(app, "/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=")
    for name in (
        "spotd_spend_usd",
        "spotd_savings_usd",
        "spotd_active_jobs",
        "spotd_preemptions_total",
        "spotd_price_poll_age_seconds",
        "spotd_job_spend_usd",
        "spotd_pool_spend_usd",
        "spotd_pool_placement_seconds_bucket",
    ):
        assert f"\n{name}" in reply.text


def test_metrics_route_can_require_auth(fleet: FakeEngine) -> None:
    def deny() -> None:
        raise HTTPException(status_code=401, detail="no")

    app = FastAPI()
    app.include_router(
        create_metrics_router(fleet, dependencies=[Depends(deny)])  # type: ignore[arg-type]
    )
    assert get(app, "/metrics").status_code == 401


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_history_scans_are_served_again_for_a_while(store: SqlStore) -> None:
    fill(store)
    engine = FakeEngine(store, market())
    statements: list[str] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement)

    def scraped(collector: SpotdCollector) -> Samples:
        registry = CollectorRegistry()
        registry.register(collector)
        return samples(render(registry).decode())

    cached = SpotdCollector(engine)  # type: ignore[arg-type]
    live = SpotdCollector(engine, history_seconds=0)  # type: ignore[arg-type]
    first = scraped(cached)
    statements.clear()
    assert scraped(cached) == first
    served = [q for q in statements if q.startswith("SELECT")]
    statements.clear()
    assert scraped(live) == first
    again = [q for q in statements if q.startswith("SELECT")]
    assert len(again) == len(served) + 3, "placements, notices and preflights read again"


# -- a daemon, scraped over HTTP -----------------------------------------------------------


def test_a_daemon_serves_the_ledgers_figures_over_http(tmp_path: Path, store_url: str) -> None:
    """A daemon on the simulated market runs a job through a preemption; /metrics, fetched
    over loopback with the API token and parsed as Prometheus does, agrees with the ledger."""
    from engine_support import fast_settings, job_until_file, spec
    from webhook_support import api

    from spotd.daemon.process import Daemon

    settings = fast_settings(tmp_path / "spotd", db_url=store_url)
    daemon = Daemon(settings)
    daemon.start()
    try:
        store = daemon.engine.store
        token = settings.token_file.read_text().strip()
        go = tmp_path / "go"  # each attempt runs until the test lets it end
        body = {"spec": spec(job_until_file(go), team="vision").model_dump(mode="json")}
        job_id = api(daemon.port, token, "POST", "/v1/jobs", body)["id"]
        wait(lambda: store.get_job(job_id).status is JobStatus.RUNNING)
        (first,) = store.attempts(job_id)
        daemon.engine.providers[first.pool.provider].reclaim(first.instance_ids[0])  # type: ignore[attr-defined]
        wait(lambda: store.attempts(job_id)[0].ended_at is not None)
        go.touch()  # the first attempt was preempted: the second may end
        wait(lambda: store.get_job(job_id).status is JobStatus.SUCCEEDED, timeout=90)
        attempts = store.attempts(job_id)
        # The engine bills right after the end: wait for every attempt's lines.
        wait(
            lambda: (
                {e.attempt for e in store.ledger(job_id=job_id)}
                >= {a.seq for a in attempts if a.instance_ids}
            )
        )
        got = samples(api(daemon.port, token, "GET", "/metrics"))
        reply = httpx.get(f"http://127.0.0.1:{daemon.port}/metrics")
        assert reply.status_code == 401, "the token is required"
    finally:
        daemon.stop()

    spend = sum(e.usd for e in store_ledger(store_url, job_id))
    assert spend > 0
    assert got[("spotd_spend_usd", ())] == pytest.approx(spend)
    labels = (("job_id", job_id), ("job_name", "t"), ("team", "vision"))
    assert got[("spotd_job_spend_usd", labels)] == pytest.approx(spend), "ended just now: shown"
    assert got[("spotd_job_status", tuple(sorted((*labels, ("status", "succeeded")))))] == 1
    reasons: dict[str, float] = {}
    for (name, lab), value in got.items():
        if name == "spotd_pool_attempts_total":
            reason = dict(lab)["reason"]
            reasons[reason] = reasons.get(reason, 0) + value
    assert reasons == {"preempted": 1, "succeeded": 1}
    assert got[("spotd_preemptions_total", ())] == 1
    placements = sum(
        v for (name, _), v in got.items() if name == "spotd_pool_placement_seconds_count"
    )
    assert placements == len([a for a in attempts if a.running_at is not None]) == 2
    pools = {a.pool for a in attempts}
    pool_spend = sum(v for (name, lab), v in got.items() if name == "spotd_pool_spend_usd")
    assert pool_spend == pytest.approx(spend)
    assert {dict(lab)["zone"] for (name, lab) in got if name == "spotd_pool_spend_usd"} == {
        p.zone for p in pools
    }


def wait(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    import time

    limit = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < limit, "timed out"
        time.sleep(0.05)


def store_ledger(url: str, job_id: str) -> list[LedgerEntry]:
    from spotd.store import open_store

    store = open_store(url)
    try:
        return store.ledger(job_id=job_id)
    finally:
        store.close()
