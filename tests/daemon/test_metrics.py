"""Prometheus metrics: names and values for a small fake engine state, and the /metrics route."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import Depends, FastAPI, HTTPException
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from spotd.core.network import Fabric, Interconnect
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    JobRecord,
    LedgerEntry,
    Market,
    Offering,
    Pool,
)
from spotd.daemon.metrics import (
    FleetTotals,
    SpotdCollector,
    build_registry,
    create_metrics_router,
    render,
    store_totals,
)
from spotd.mail import Composed, Outbox
from spotd.market.cache import Snapshot

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
WALL = 1_800_000_000.0
POOL = Pool("sim-aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
SPEC = JobSpec.model_validate(
    {"name": "t", "command": ["true"], "resources": {"gpus": ["A100"], "gpus_per_node": 8}}
)


def job(job_id: str, status: JobStatus) -> JobRecord:
    return JobRecord(job_id, job_id, SPEC, status, None, NOW, NOW)


def attempt(job_id: str, seq: int, hours: float, price: float, *, market: Market = Market.SPOT,
            end: AttemptEnd | None = None, nodes: int = 1) -> AttemptRecord:
    started = NOW - timedelta(hours=hours)
    return AttemptRecord(
        id=seq, job_id=job_id, seq=seq, pool=POOL, market=market, nodes=nodes,
        price_per_node_hour=price, client_token=f"{job_id}-{seq}",
        instance_ids=tuple(f"i-{job_id}-{seq}-{n}" for n in range(nodes)),
        resume_from=None, started_at=started, running_at=started,
        ended_at=NOW if end else None, end_reason=end,
    )


class FakeClock:
    def now(self) -> datetime:
        return NOW

    def seconds_to_real(self, seconds: float) -> float:
        return seconds


@dataclass
class FakeStore:
    jobs: list[JobRecord]
    attempts: dict[str, list[AttemptRecord]] = field(default_factory=dict)
    lines: list[LedgerEntry] = field(default_factory=list)
    """The stored ledger."""

    def list_jobs(self, statuses: Collection[JobStatus] | None = None) -> list[JobRecord]:
        return [j for j in self.jobs if statuses is None or j.status in statuses]

    def attempts_for(self, job_ids: Collection[str]) -> dict[str, list[AttemptRecord]]:
        return {i: list(self.attempts.get(i, [])) for i in job_ids}

    def ledger(self, *, since: datetime | None = None, until: datetime | None = None,
               job_id: str | None = None) -> list[LedgerEntry]:
        return [e for e in self.lines if job_id is None or e.job_id == job_id]


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
    store: FakeStore
    market: FakeMarket
    clock: FakeClock = field(default_factory=FakeClock)


def offering(spot: float, on_demand: float) -> Offering:
    return Offering(POOL, "A100", 8, 40, Interconnect(Fabric.EFA, 50.0), spot, on_demand)


def small_engine() -> FakeEngine:
    store = FakeStore(
        jobs=[job("a", JobStatus.RUNNING), job("b", JobStatus.RUNNING),
              job("c", JobStatus.PENDING), job("d", JobStatus.SUCCEEDED)],
        attempts={
            # 2 h preempted + 3 h running, at 10 USD/node-hour spot; on-demand lists 30.
            "a": [attempt("a", 1, 2.0, 10.0, end=AttemptEnd.PREEMPTED),
                  attempt("a", 2, 3.0, 10.0)],
            # 1 h on-demand at 30 USD on 2 nodes: no savings.
            "b": [attempt("b", 1, 1.0, 30.0, market=Market.ON_DEMAND, nodes=2)],
            "d": [attempt("d", 1, 1.0, 10.0, end=AttemptEnd.PREEMPTED),
                  attempt("d", 2, 1.0, 10.0, end=AttemptEnd.SUCCEEDED)],
        },
    )
    market = FakeMarket(
        snaps={
            "sim-aws": Snapshot((), fetched_at=WALL - 42.0),
            "gcp": Snapshot((), fetched_at=WALL - 900.0, error="ProviderUnavailable: 503",
                            failures=3),
            "azure": Snapshot((), fetched_at=0.0),
        },
        offerings={POOL: offering(10.0, 30.0)},
    )
    return FakeEngine(store, market)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
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
    registry.register(SpotdCollector(
        engine, spend_fn or store_totals(engine), outbox=outbox,  # type: ignore[arg-type]
        wall_clock=lambda: WALL,
    ))
    return render(registry).decode()


def test_build_registry_is_fresh_each_time() -> None:
    engine = small_engine()
    one, two = build_registry(engine), build_registry(engine)  # type: ignore[arg-type]
    assert one is not two
    assert "spotd_spend_usd 130.0" in render(one).decode()


def test_metrics_text_has_every_metric_with_its_value() -> None:
    text = scrape(small_engine())
    got = samples(text)
    # Spend: a 20 + 30, b 60, d 10 + 10.
    assert got[("spotd_spend_usd", ())] == pytest.approx(130.0)
    # Savings: spot hours a 5 h and d 2 h, at 30 - 10 USD each.
    assert got[("spotd_savings_usd", ())] == pytest.approx(140.0)
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


def test_spend_fn_overrides_the_store_totals() -> None:
    got = samples(scrape(small_engine(), spend_fn=lambda: FleetTotals(1.5, 0.25, 7)))
    assert got[("spotd_spend_usd", ())] == 1.5
    assert got[("spotd_savings_usd", ())] == 0.25
    assert got[("spotd_preemptions_total", ())] == 7


def test_store_totals_without_market_prices_claims_no_savings() -> None:
    engine = small_engine()
    engine.market.offerings.clear()
    totals = store_totals(engine)()  # type: ignore[arg-type]
    assert totals == FleetTotals(spent_usd=pytest.approx(130.0), savings_usd=0.0, preemptions=2)


def billed(a: AttemptRecord, usd: float, on_demand: float) -> LedgerEntry:
    return LedgerEntry(
        job_id=a.job_id, attempt=a.seq, provider=a.pool.provider, region=a.pool.region,
        zone=a.pool.zone, instance_type=a.pool.instance_type, gpu="A100", gpus=8, nodes=1,
        fabric="efa", market=str(a.market), kind="compute", start=a.started_at,
        end=a.ended_at or NOW, billed_seconds=3600.0, usd=usd, on_demand_usd=on_demand,
        job_status="succeeded",
    )


def test_spend_and_savings_are_the_stored_ledgers() -> None:
    # Job d's two attempts ran 1 h each at 10 USD/h (20 by price x time); the ledger
    # billed them 7.5 and 8.0 (the prices in force), with 30 on-demand each.
    engine = small_engine()
    first, second = engine.store.attempts["d"]
    engine.store.lines = [billed(first, 7.5, 30.0), billed(second, 8.0, 30.0)]
    got = samples(scrape(engine))
    # a 20 + 30 (open, priced to now), b 60, d 15.5 by the ledger.
    assert got[("spotd_spend_usd", ())] == pytest.approx(125.5)
    # a 5 h at 30 - 10; d 60 - 15.5; b on-demand, nothing saved.
    assert got[("spotd_savings_usd", ())] == pytest.approx(100.0 + 44.5)


def test_a_failing_section_leaves_the_others(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> FleetTotals:
        raise RuntimeError("database gone")

    with caplog.at_level(logging.ERROR, logger="spotd.daemon.metrics"):
        got = samples(scrape(small_engine(), spend_fn=broken))
    assert ("spotd_spend_usd", ()) not in got
    assert got[("spotd_active_jobs", (("status", "running"),))] == 2
    assert ("spotd_price_poll_age_seconds", (("provider", "gcp"),)) in got
    assert "reading totals failed" in caplog.text


def test_outbox_size(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    for i in range(2):
        outbox.put(Composed(f"m{i}", "t").message("a@example.com", ["b@example.com"]))
    got = samples(scrape(small_engine(), outbox=outbox))
    assert got[("spotd_outbox_messages", ())] == 2


def test_registries_do_not_clash() -> None:
    one, two = small_engine(), small_engine()
    two.store.jobs.append(job("e", JobStatus.RECOVERING))
    assert samples(scrape(one))[("spotd_active_jobs", (("status", "recovering"),))] == 0
    assert samples(scrape(two))[("spotd_active_jobs", (("status", "recovering"),))] == 1


def get(app: FastAPI, path: str) -> httpx.Response:
    """GET ``path`` from the ASGI app in process (httpx's transport, no server; it runs
    no lifespan hooks, which the metrics router has none of)."""
    async def fetch() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://spotd") as client:
            return await client.get(path)

    return asyncio.run(fetch())


def test_metrics_route() -> None:
    app = FastAPI()
    app.include_router(create_metrics_router(small_engine()))  # type: ignore[arg-type]
    reply = get(app, "/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=")
    for name in ("spotd_spend_usd", "spotd_savings_usd", "spotd_active_jobs",
                 "spotd_preemptions_total", "spotd_price_poll_age_seconds"):
        assert f"\n{name}" in reply.text


def test_metrics_route_can_require_auth() -> None:
    def deny() -> None:
        raise HTTPException(status_code=401, detail="no")

    app = FastAPI()
    app.include_router(
        create_metrics_router(small_engine(), dependencies=[Depends(deny)])  # type: ignore[arg-type]
    )
    assert get(app, "/metrics").status_code == 401
