"""The API's drill route, in process: a drill asked is an intent the next pass sends, and
what cannot be drilled now is refused with its code."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_support import FakeProvider, spec

from spotd.core.states import JobStatus
from spotd.daemon.api import create_app
from spotd.daemon.wiring import build_reader
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy
from spotd_sim import SimClock

TOKEN = "t" * 32


@dataclass
class DrilledFake(FakeProvider):
    """A scripted provider that takes drills and records them."""

    drilled: list[str] = field(default_factory=list)

    def drill(self, instance_id: str) -> None:
        self.drilled.append(instance_id)


@pytest.fixture
def drills(tmp_path: Path, sqlite_url: str) -> Iterator[tuple[Engine, DrilledFake]]:
    store = open_store(sqlite_url)
    provider = DrilledFake()
    yield Engine(
        store, {"fake": provider}, CheapestPolicy(), SimClock(tmp_path / "c", 3600.0),
        EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"),
    ), provider  # fmt: skip
    store.close()


def send(engine: Engine, method: str, path: str, **kw: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(build_reader(engine), TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://spotd") as client:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            return await client.request(method, path, headers=headers, **kw)

    return asyncio.run(go())


def running(engine: Engine) -> str:
    job = engine.submit(spec())
    for _ in range(5):
        engine.tick()
    assert engine.store.get_job(job.id).status is JobStatus.RUNNING
    return job.id


def test_a_drill_is_asked_then_sent_by_the_next_pass(
    drills: tuple[Engine, DrilledFake],
) -> None:
    engine, provider = drills
    job_id = running(engine)
    asked = send(engine, "POST", f"/v1/jobs/{job_id}/drill", json={"node": 0})
    assert asked.status_code == 202, asked.text
    (intent,) = asked.json()["asked"]
    assert (intent["kind"], intent["node"]) == ("drill", 0)
    assert provider.drilled == []  # asked, not done: the loop does it
    engine.tick()
    (node,) = engine.store.attempts(job_id)[-1].instance_ids
    assert provider.drilled == [node]
    events = send(engine, "GET", f"/v1/jobs/{job_id}/events").json()
    (drill,) = [e for e in events if e["cause"] == "drill"]
    assert drill["facts"]["node"] == node
    assert send(engine, "GET", f"/v1/jobs/{job_id}").json()["asked"] == []


def test_a_drill_without_a_body_drills_node_0(drills: tuple[Engine, DrilledFake]) -> None:
    engine, _ = drills
    job_id = running(engine)
    asked = send(engine, "POST", f"/v1/jobs/{job_id}/drill")
    assert asked.status_code == 202, asked.text
    assert asked.json()["asked"][0]["node"] == 0


def test_what_cannot_be_drilled_now_is_refused(drills: tuple[Engine, DrilledFake]) -> None:
    engine, _ = drills
    pending = engine.store.create_job(spec(), now=engine.clock.now())
    refused = send(engine, "POST", f"/v1/jobs/{pending.id}/drill", json={"node": 0})
    assert refused.status_code == 409
    assert (refused.json()["code"], refused.json()["job_id"]) == ("drill-refused", pending.id)
    job_id = running(engine)
    beyond = send(engine, "POST", f"/v1/jobs/{job_id}/drill", json={"node": 1})
    assert beyond.status_code == 422
    assert (beyond.json()["code"], beyond.json()["field"]) == ("invalid-request", "node")
    negative = send(engine, "POST", f"/v1/jobs/{job_id}/drill", json={"node": -1})
    assert negative.status_code == 422
    assert send(engine, "POST", "/v1/jobs/j-nope/drill", json={}).status_code == 404
    assert engine.store.open_intents([job_id]) == {}


def test_a_provider_without_drills_is_a_409(engine: Engine) -> None:
    job_id = running(engine)
    refused = send(engine, "POST", f"/v1/jobs/{job_id}/drill", json={"node": 0})
    assert refused.status_code == 409 and refused.json()["code"] == "drill-refused"
    assert "cannot preempt a node on purpose" in refused.json()["detail"]
