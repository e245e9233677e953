"""The daemon's HTTP API in process: what a submit that cannot be run gets back."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from engine_support import FakeProvider, spec

from spotd.daemon.api import create_app
from spotd.engine.reconcile import Engine, EngineSettings
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy
from spotd_sim import SimClock

TOKEN = "t" * 32


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    yield Engine(
        store, {"fake": FakeProvider()}, CheapestPolicy(), SimClock(tmp_path / "c", 3600.0),
        EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"),
    )  # fmt: skip
    store.close()


def post(engine: Engine, path: str, body: object) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(engine, TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://spotd") as client:
            return await client.post(path, json=body, headers={"Authorization": f"Bearer {TOKEN}"})

    return asyncio.run(send())


def test_a_checkpoint_location_the_daemon_cannot_open_is_a_422_naming_the_field(
    engine: Engine,
) -> None:
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed here: gs:// locations can be opened")
    body = spec(checkpoint={"uri": "gs://b/run"}).model_dump(mode="json")
    reply = post(engine, "/v1/jobs", {"spec": body})
    assert reply.status_code == 422
    assert reply.json()["detail"].startswith("checkpoint.uri: gs://b/run: this daemon cannot")
    assert engine.store.list_jobs() == []
    ok = post(engine, "/v1/jobs", {"spec": spec().model_dump(mode="json")})
    assert ok.status_code == 201 and ok.json()["status"] == "pending"


def get(engine: Engine, path: str, **params: str) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(engine, TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://spotd") as client:
            return await client.get(
                path, params=params, headers={"Authorization": f"Bearer {TOKEN}"}
            )

    return asyncio.run(send())


def test_the_plan_of_a_submitted_job_is_the_plan_view(engine: Engine) -> None:
    from spotd.daemon.planning import PlanView

    engine.market.refresh_all()
    job = engine.store.create_job(spec(), now=engine.clock.now())
    reply = get(engine, f"/v1/jobs/{job.id}/plan")
    assert reply.status_code == 200, reply.text
    view = PlanView.model_validate(reply.json())
    assert view.policy == "cheapest" and view.job == job.name
    assert view.choice is not None and view.choice.provider == "fake"
    assert {c.excluded_kind for c in view.candidates} == {None}, "the fake market all fits"
    other = get(engine, f"/v1/jobs/{job.name}/plan", policy="on-demand")
    assert other.status_code == 200 and other.json()["choice"]["market"] == "on-demand"
    assert get(engine, "/v1/jobs/j-nope/plan").status_code == 404
    assert get(engine, f"/v1/jobs/{job.id}/plan", policy="nope").status_code == 409
