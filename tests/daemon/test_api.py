"""The daemon's HTTP API in process: what a submit that cannot be run gets back."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from engine_support import spec
from pydantic import TypeAdapter

from spotd.core.states import FailureCause, JobStatus, Transition
from spotd.core.values import AttemptEnd, EventFacts
from spotd.daemon import limits
from spotd.daemon.api import create_app
from spotd.daemon.limits import DEFAULT_MAX_BODY_BYTES
from spotd.daemon.views import EventFactsView, EventView
from spotd.daemon.wiring import build_reader
from spotd.engine.reconcile import Engine

TOKEN = "t" * 32


def post(engine: Engine, path: str, body: object) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(build_reader(engine), TOKEN))
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
    # One line that names the package to install, from fsspec's own registry.
    assert reply.json()["detail"] == (
        "checkpoint.uri: gs://b/run: needs gcsfs, which this daemon lacks; "
        "pip install gcsfs beside the daemon"
    )
    assert engine.store.list_jobs() == []
    ok = post(engine, "/v1/jobs", {"spec": spec().model_dump(mode="json")})
    assert ok.status_code == 201 and ok.json()["status"] == "pending"


@pytest.mark.parametrize(
    ("field", "value"),
    [("workdir", "src"), ("workdir", "./code/../src"), ("checkpoint.uri", "ckpt/run")],
)
def test_a_relative_path_through_the_api_is_a_422_naming_the_field(
    engine: Engine, field: str, value: str
) -> None:
    """The API has no job file to resolve against (docs/job-spec.md): refused, not
    stored relative to wherever the daemon or its nodes happen to run."""
    body = spec().model_dump(mode="json")
    if field == "workdir":
        body["workdir"] = value
    else:
        body["checkpoint"]["uri"] = value
    reply = post(engine, "/v1/jobs", {"spec": body})
    assert reply.status_code == 422, reply.text
    assert reply.json()["detail"] == (
        f"{field}: {value!r} is a relative path, and the daemon has no job file to "
        "resolve it against; send an absolute path (spotd submit resolves it against "
        "the job file's folder)"
    )
    assert engine.store.list_jobs() == []
    body["workdir"], body["checkpoint"]["uri"] = "/srv/train", "file:///srv/ckpt"
    stored = post(engine, "/v1/jobs", {"spec": body})
    assert stored.status_code == 201, stored.text
    (job,) = engine.store.list_jobs()
    assert (job.spec.workdir, job.spec.checkpoint.uri) == ("/srv/train", "file:///srv/ckpt")


def test_a_submit_that_would_fail_later_is_a_422_naming_the_field(engine: Engine) -> None:
    ckpt = spec(checkpoint={"uri": "/proc/spotd-ckpt"}).model_dump(mode="json")
    reply = post(engine, "/v1/jobs", {"spec": ckpt})
    assert reply.status_code == 422
    assert reply.json()["detail"].startswith("checkpoint.uri: /proc/spotd-ckpt: /proc is on proc")
    late = spec(deadline={"finish_by": "2020-01-01T00:00:00Z"}).model_dump(mode="json")
    reply = post(engine, "/v1/jobs", {"spec": late})
    assert reply.status_code == 422
    assert reply.json()["detail"].startswith(
        "deadline.finish_by: 2020-01-01T00:00:00Z has passed ("
    )
    assert engine.store.list_jobs() == []


def get(engine: Engine, path: str, **params: str) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(build_reader(engine), TOKEN))
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


def send(
    engine: Engine,
    method: str,
    path: str,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    **kw: object,
) -> httpx.Response:
    """One request through the app in process (``kw`` as httpx takes them)."""

    async def go() -> httpx.Response:
        app = create_app(build_reader(engine), TOKEN, max_body_bytes=max_body_bytes)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://spotd") as client:
            headers = {"Authorization": f"Bearer {TOKEN}", **kw.pop("headers", {})}  # type: ignore[dict-item]
            return await client.request(method, path, headers=headers, **kw)  # type: ignore[arg-type]

    return asyncio.run(go())


# -- body limit -------------------------------------------------------------------


def test_a_body_over_the_limit_with_a_content_length_is_413_and_nothing_is_stored(
    engine: Engine,
) -> None:
    big = b'{"spec": {"name": "' + b"x" * 5000 + b'"}}'
    reply = send(engine, "POST", "/v1/jobs", content=big, max_body_bytes=4096,
                 headers={"Content-Type": "application/json"})  # fmt: skip
    assert reply.status_code == 413
    assert reply.headers["content-type"] == "application/problem+json"
    assert reply.json()["code"] == "request-too-large"
    assert reply.json()["detail"].startswith(
        f"request body of {len(big):,} bytes is over this daemon's limit of 4,096 bytes "
        "([daemon] max_body_bytes)"
    )
    assert engine.store.list_jobs() == []
    # Under the limit the same route works.
    small = spec().model_dump(mode="json")
    ok = send(engine, "POST", "/v1/jobs", json={"spec": small}, max_body_bytes=4096)
    assert ok.status_code == 201


def test_a_streamed_body_over_the_limit_is_413_and_its_rest_dropped_as_it_comes(
    engine: Engine,
) -> None:
    chunk = b" " * 65536
    sent: list[int] = []

    async def body() -> AsyncIterator[bytes]:
        yield b'{"spec": {"name": "'
        for n in range(800):  # 50 MiB, were it all read
            sent.append(n)
            yield chunk

    reply = send(engine, "POST", "/v1/jobs", content=body(), max_body_bytes=1 << 20,
                 headers={"Content-Type": "application/json"})  # fmt: skip
    assert reply.status_code == 413
    assert reply.json()["code"] == "request-too-large"
    assert "over this daemon's limit of 1,048,576 bytes" in reply.json()["detail"]
    # Chunked: no Content-Length to refuse by. The rest is read to the end and
    # dropped (so a real client's connection is not reset under its 413), and
    # nothing of it is kept.
    assert len(sent) == 800
    assert engine.store.list_jobs() == []


def test_a_refused_body_is_drained_only_within_its_bound(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "DRAIN_BYTES", 4 << 20)
    sent: list[int] = []

    async def body() -> AsyncIterator[bytes]:
        yield b'{"spec": {"name": "'
        for n in range(800):
            sent.append(n)
            yield b" " * 65536

    reply = send(engine, "POST", "/v1/jobs", content=body(), max_body_bytes=1 << 20,
                 headers={"Content-Type": "application/json"})  # fmt: skip
    assert reply.status_code == 413
    # 1 MiB to the limit, then at most 4 MiB more dropped: 80 chunks, not 800.
    assert len(sent) <= 16 + 64 + 2


def test_a_real_server_answers_413_to_a_50_mb_chunked_body(engine: Engine) -> None:
    import socket
    import threading

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    app = create_app(build_reader(engine), TOKEN)
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            threading.Event().wait(0.02)
        port = sock.getsockname()[1]

        def body() -> Iterator[bytes]:
            yield b'{"spec": {"name": "'
            for _ in range(800):
                yield b" " * 65536

        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            reply = client.post("/v1/jobs", content=body(),
                                headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
            assert reply.status_code == 413
            assert "[daemon] max_body_bytes" in reply.json()["detail"]
            assert client.get("/v1/health").status_code == 200  # and it still serves
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert engine.store.list_jobs() == []


# -- listings ----------------------------------------------------------------------


def test_job_listing_pages_newest_first_with_filters(engine: Engine) -> None:
    jobs = [engine.store.create_job(spec(), now=engine.clock.now()) for _ in range(7)]
    gone = jobs[2]
    engine.request_cancel(gone.id)
    engine.step(engine.store.get_job(gone.id))  # that job alone: the others stay pending
    want = [j.id for j in sorted(jobs, key=lambda j: (j.submitted_at, j.id), reverse=True)]

    seen: list[str] = []
    cursor: str | None = None
    for _ in range(5):
        params: dict[str, object] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = send(engine, "GET", "/v1/jobs", params=params)
        assert page.status_code == 200, page.text
        seen += [j["id"] for j in page.json()["jobs"]]
        cursor = page.json()["next"]
        if cursor is None:
            break
    assert seen == want

    active = send(engine, "GET", "/v1/jobs", params={"status": "active"}).json()
    assert [j["id"] for j in active["jobs"]] == [i for i in want if i != gone.id]
    assert active["next"] is None
    ended = send(engine, "GET", "/v1/jobs", params={"status": ["cancelled", "failed"]}).json()
    assert [j["id"] for j in ended["jobs"]] == [gone.id]
    assert ended["jobs"][0]["status"] == "cancelled"


def test_job_listing_refuses_bad_parameters(engine: Engine) -> None:
    bad_status = send(engine, "GET", "/v1/jobs", params={"status": "sleeping"})
    assert bad_status.status_code == 422
    assert "'sleeping' is not one of active, ended, pending" in bad_status.json()["detail"]
    assert send(engine, "GET", "/v1/jobs", params={"limit": 1001}).status_code == 422
    assert send(engine, "GET", "/v1/jobs", params={"limit": 0}).status_code == 422
    cursor = send(engine, "GET", "/v1/jobs", params={"cursor": "nope"})
    assert cursor.status_code == 422 and "not a job listing cursor" in cursor.json()["detail"]


# -- idempotent submit -------------------------------------------------------------


def test_a_retried_submit_with_its_key_returns_the_first_job(engine: Engine) -> None:
    body = {"spec": spec().model_dump(mode="json")}
    key = {"Idempotency-Key": "3f1c-retry"}
    first = send(engine, "POST", "/v1/jobs", json=body, headers=key)
    again = send(engine, "POST", "/v1/jobs", json=body, headers=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert [j.id for j in engine.store.list_jobs()] == [first.json()["id"]]

    other = send(engine, "POST", "/v1/jobs", json=body, headers={"Idempotency-Key": "another"})
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    changed = {"spec": spec("print('other')").model_dump(mode="json")}
    clash = send(engine, "POST", "/v1/jobs", json=changed, headers=key)
    assert clash.status_code == 409
    assert f"was used for job {first.json()['id']}" in clash.json()["detail"]
    assert len(engine.store.list_jobs()) == 2


def test_a_keyed_submit_is_refused_as_an_unkeyed_one_is(engine: Engine) -> None:
    body = {"spec": spec(gpus=["Z900"]).model_dump(mode="json")}
    engine.market.refresh_all()
    keyed = send(engine, "POST", "/v1/jobs", json=body, headers={"Idempotency-Key": "k"})
    plain = send(engine, "POST", "/v1/jobs", json=body)
    assert keyed.status_code == plain.status_code == 422
    assert keyed.json()["detail"] == plain.json()["detail"]
    assert keyed.json()["detail"].startswith("resources.gpus: ")
    assert engine.store.list_jobs() == []


# -- intents -------------------------------------------------------------------------


def test_a_cancel_is_asked_with_202_and_carried_out_by_the_loop(engine: Engine) -> None:
    job = engine.store.create_job(spec(), now=engine.clock.now())
    asked = send(engine, "POST", f"/v1/jobs/{job.id}/cancel")
    assert asked.status_code == 202, asked.text
    body = asked.json()
    assert body["status"] == "pending", "answered from the store: not done yet"
    assert [a["kind"] for a in body["asked"]] == ["cancel"]
    again = send(engine, "POST", f"/v1/jobs/{job.name}/cancel")
    assert again.status_code == 202 and len(again.json()["asked"]) == 1, "asked once"
    engine.tick()
    done = send(engine, "GET", f"/v1/jobs/{job.id}").json()
    assert done["status"] == "cancelled" and done["asked"] == []


def test_a_priority_is_asked_with_202_and_given_by_the_loop(engine: Engine) -> None:
    job = engine.store.create_job(spec(), now=engine.clock.now())
    asked = send(engine, "POST", f"/v1/jobs/{job.id}/priority", json={"priority": 7})
    assert asked.status_code == 202, asked.text
    assert asked.json()["asked"] == [
        {"kind": "priority", "requested_at": asked.json()["asked"][0]["requested_at"],
         "priority": 7, "node": None}
    ]  # fmt: skip
    engine.step(engine.store.get_job(job.id))
    assert engine.store.get_job(job.id).spec.priority == 7
    events = send(engine, "GET", f"/v1/jobs/{job.id}/events").json()
    assert events[-1]["cause"] == "priority changed" and events[-1]["detail"] == "priority 0 -> 7"


@pytest.mark.parametrize(
    "body", [{}, {"priority": "high"}, {"priority": 10**7}, {"priority": 1, "x": 2}]
)
def test_a_priority_that_cannot_be_one_is_a_422(engine: Engine, body: object) -> None:
    job = engine.store.create_job(spec(), now=engine.clock.now())
    reply = send(engine, "POST", f"/v1/jobs/{job.id}/priority", json=body)
    assert reply.status_code == 422, reply.text
    assert engine.store.intents(job.id) == []


# -- events ------------------------------------------------------------------------


def test_events_carry_their_facts_as_typed_fields(engine: Engine) -> None:
    """The exit code, signal, node, rank and error of an event are fields of its view
    (``facts``), never to be parsed out of its detail; an event without any has all None,
    and the CLI's client reads them back as they were."""
    job = engine.store.create_job(spec(), now=engine.clock.now())
    facts = EventFacts(exit_code=137, signal=9, node="i-7", rank=1, provider="fake")
    engine.store.compare_and_set(
        Transition(job.id, JobStatus.PENDING, JobStatus.FAILED, AttemptEnd.USER_FAILED,
                   "command on i-7 exited with 137", failure=FailureCause.USER_COMMAND_FAILED,
                   facts=facts),
        now=engine.clock.now(),
    )  # fmt: skip
    reply = send(engine, "GET", f"/v1/jobs/{job.id}/events")
    assert reply.status_code == 200, reply.text
    submitted, failed = reply.json()
    assert set(submitted["facts"].values()) == {None}
    assert failed["cause"] == "user-failed"
    assert failed["facts"] == {
        "exit_code": 137, "signal": 9, "signal_name": "SIGKILL", "node": "i-7", "rank": 1,
        "error_class": None, "error_code": None, "provider": "fake", "provider_code": None,
        # Said from the code where the event names no cause of its own (an older one).
        "exit_cause": None, "oom_kills": None, "check": None,
        "process_ranks": None, "nodes": None, "drill": None,
        "exit_said": "killed by SIGKILL (exit 137)",
    }  # fmt: skip
    (parsed,) = TypeAdapter(list[EventView]).validate_python([failed])
    assert (parsed.facts.exit_code, parsed.facts.node, parsed.facts.rank) == (137, "i-7", 1)
    older = {k: v for k, v in failed.items() if k != "facts"}
    assert EventView.model_validate(older).facts == EventFactsView(), "an older daemon's event"
