"""The API at its edge: who is asked first, and what it bounds (issue 30, point 4).

In process (``httpx.ASGITransport``) for the order of the checks and the
refusals of the routes; against a real ``spotd daemon`` process on loopback,
with a raw socket, for what the HTTP server does with a request it cannot read:
a head too large, a body that never ends.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from daemon_support import Daemon, make_setup
from engine_support import run_until, spec

from spotd.core.agent_wire import agent_token
from spotd.core.states import JobStatus
from spotd.daemon.api import create_app
from spotd.daemon.limits import MAX_CURSOR, MAX_IDEMPOTENCY_KEY
from spotd.daemon.wiring import build_reader
from spotd.engine.reconcile import Engine

TOKEN = "t" * 32
AGENT_PATHS = ["heartbeat", "join", "preflight", "notice", "secrets", "exit", "orders"]


def send(engine: Engine, method: str, path: str, **kw: object) -> httpx.Response:
    """One request through the daemon's app in process; ``kw`` as httpx takes them."""

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(build_reader(engine), TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://spotd") as client:
            return await client.request(method, path, **kw)  # type: ignore[arg-type]

    return asyncio.run(go())


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def launched(engine: Engine) -> tuple[str, int, str]:
    """A job with a launched attempt: its id, the attempt's number and its agent token."""
    engine.market.refresh_all()
    job = engine.store.create_job(spec(), now=engine.clock.now())
    run_until(engine, job.id, lambda j: j.status is not JobStatus.PENDING)
    (attempt,) = engine.store.attempts(job.id)
    return job.id, attempt.seq, agent_token(TOKEN, attempt.client_token)


# -- 1. the token before the body -------------------------------------------------


BAD_BODIES: list[dict[str, object]] = [
    {},  # no body at all
    {"content": b'{"job_id": ', "headers": {"Content-Type": "application/json"}},  # not JSON
    {"json": {"job_id": "j-0000000001"}},  # no attempt: nobody to check the token against
    {"json": {"job_id": "j-0000000001", "attempt": 1}},  # an attempt, the rest missing
    {"json": ["not", "an", "object"]},
]


@pytest.mark.parametrize("body", BAD_BODIES, ids=["none", "not-json", "no-attempt", "short",
                                                  "a-list"])  # fmt: skip
@pytest.mark.parametrize("token", [None, "nope", TOKEN, "\u00e9t\u00e9"],
                         ids=["no-token", "wrong", "daemons", "latin-1"])  # fmt: skip
def test_an_agent_route_asks_for_the_token_before_it_reads_the_report(
    engine: Engine, body: dict[str, object], token: str | None
) -> None:
    """A caller without the attempt's token learns nothing of the report's fields."""
    kw: dict[str, object] = {**body}
    if token is not None:
        auth = {"Authorization": f"Bearer {token}".encode("latin-1")}
        kw["headers"] = {**auth, **body.get("headers", {})}  # type: ignore[dict-item]
    for path in AGENT_PATHS:
        reply = send(engine, "POST", f"/v1/agent/{path}", **kw)
        assert reply.status_code == 401, (path, reply.text)
        assert reply.headers["content-type"] == "application/problem+json"
        problem = reply.json()
        assert problem["code"] == "unauthorized" and isinstance(problem["detail"], str)
        assert "errors" not in problem and "field" not in problem
        assert "Field required" not in reply.text


def test_an_agent_with_its_token_gets_the_422_of_its_malformed_report(engine: Engine) -> None:
    job_id, seq, token = launched(engine)
    short = send(engine, "POST", "/v1/agent/notice", json={"job_id": job_id, "attempt": seq},
                 headers=bearer(token))  # fmt: skip
    assert short.status_code == 422, short.text
    assert short.json()["code"] == "invalid-request"
    fields = {e["field"] for e in short.json()["errors"]}
    assert {"instance_id", "provider", "at", "kind"} <= fields
    other = send(engine, "POST", "/v1/agent/notice", json={"job_id": job_id, "attempt": seq + 1},
                 headers=bearer(token))  # fmt: skip
    assert other.status_code == 401, "the token of one attempt is no token for another"
    good = {"job_id": job_id, "attempt": seq, "instance_id": "i-1", "provider": "fake",
            "at": "2026-01-01T00:00:00Z"}  # fmt: skip
    beat = send(engine, "POST", "/v1/agent/heartbeat", json=good, headers=bearer(token))
    assert beat.status_code == 204, beat.text
    assert send(engine, "POST", "/v1/agent/heartbeat", json=good).status_code == 401


def user_routes(engine: Engine) -> list[tuple[str, str]]:
    """Every (method, path) of the API that needs the daemon's token: the schema's
    and ``/metrics``, which is left out of it."""
    schema = create_app(build_reader(engine), TOKEN).openapi()["paths"]
    found = [("GET", "/metrics")] + [
        (method.upper(), path.replace("{ref}", "j-0000000001"))
        for path, operations in schema.items()
        for method in operations
        if not path.startswith("/v1/agent/") and path != "/v1/health"
    ]
    assert ("POST", "/v1/jobs") in found and ("POST", "/v1/jobs/j-0000000001/cancel") in found
    return found


@pytest.mark.parametrize("token", [None, "nope", "\u00e9t\u00e9"], ids=["no-token", "wrong",
                                                                    "latin-1"])  # fmt: skip
def test_every_user_route_asks_for_the_token_before_anything_else(
    engine: Engine, token: str | None
) -> None:
    """Broken JSON, out-of-range parameters and a bad key: 401 all the same."""
    headers: dict[str, str | bytes] = {"Content-Type": "application/json",
                                       "Idempotency-Key": "\x7fk" * 300}  # fmt: skip
    if token is not None:
        headers["Authorization"] = f"Bearer {token}".encode("latin-1")
    for method, path in user_routes(engine):
        reply = send(engine, method, path, content=b'{"spec": ', headers=headers,
                     params={"limit": "0", "cursor": "x" * 5000, "status": "sleeping"})  # fmt: skip
        assert reply.status_code == 401, (method, path, reply.text)
        assert reply.json() == {
            "type": "urn:spotd:problem:unauthorized", "title": "Unauthorized", "status": 401,
            "detail": "missing or wrong bearer token", "code": "unauthorized",
        }  # fmt: skip
        assert reply.headers["www-authenticate"] == "Bearer"


# -- 2. unknown fields of a submit ----------------------------------------------


def test_a_submit_with_an_unknown_top_level_field_is_refused_naming_it(engine: Engine) -> None:
    body = {"spec": spec().model_dump(mode="json"), "priority": 5}
    reply = send(engine, "POST", "/v1/jobs", json=body, headers=bearer(TOKEN))
    assert reply.status_code == 422, reply.text
    problem = reply.json()
    assert problem["code"] == "invalid-request" and problem["field"] == "priority"
    assert problem["errors"] == [{"field": "priority", "message": "Extra inputs are not permitted"}]
    assert problem["detail"] == "invalid request: priority: Extra inputs are not permitted"
    assert engine.store.list_jobs() == []
    del body["priority"]
    assert send(engine, "POST", "/v1/jobs", json=body, headers=bearer(TOKEN)).status_code == 201


# -- 3. Idempotency-Key ------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "why"),
    [
        (b"k" * (MAX_IDEMPOTENCY_KEY + 1), f"({MAX_IDEMPOTENCY_KEY + 1} characters) is too long"),
        (b"", "is empty"),
        (b"tab\there", "has a character other than"),
        (b"bell\x07", "has a character other than"),
        (b"del\x7f", "has a character other than"),
        ("cl\u00e9".encode(), "has a character other than"),
        (b"two words", "has a character other than"),
    ],
    ids=["long", "empty", "tab", "control", "del", "utf-8", "space"],
)
def test_an_idempotency_key_is_printable_ascii_of_a_bounded_length(
    engine: Engine, key: bytes, why: str
) -> None:
    body = {"spec": spec().model_dump(mode="json")}
    reply = send(engine, "POST", "/v1/jobs", json=body,
                 headers={**bearer(TOKEN), "Idempotency-Key": key})  # fmt: skip
    assert reply.status_code == 422, reply.text
    assert (reply.json()["code"], reply.json()["field"]) == ("invalid-request", "Idempotency-Key")
    detail = reply.json()["detail"]
    assert detail.startswith("Idempotency-Key: ") and why in detail, detail
    assert f"1 to {MAX_IDEMPOTENCY_KEY} characters" in detail
    assert len(detail) < 300, "a short prefix of the key at most"
    assert engine.store.list_jobs() == []


def test_keys_of_every_printable_character_are_kept(engine: Engine) -> None:
    body = {"spec": spec().model_dump(mode="json")}
    visible = bytes(range(0x21, 0x7F))
    for key in (b"3f1c-retry", visible, b"k" * MAX_IDEMPOTENCY_KEY):
        first = send(engine, "POST", "/v1/jobs", json=body,
                     headers={**bearer(TOKEN), "Idempotency-Key": key})  # fmt: skip
        again = send(engine, "POST", "/v1/jobs", json=body,
                     headers={**bearer(TOKEN), "Idempotency-Key": key})  # fmt: skip
        assert (first.status_code, again.status_code) == (201, 200), first.text
    assert len(engine.store.list_jobs()) == 3


# -- 4. cursors --------------------------------------------------------------------


def raw_get(engine: Engine, path: str, query: bytes) -> tuple[int, bytes]:
    """A GET straight to the app's ASGI callable: httpx caps a URL at 64 KiB."""
    app = create_app(build_reader(engine), TOKEN)
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
        "root_path": "", "server": ("spotd", 80), "client": ("127.0.0.1", 1),
        "headers": [(b"host", b"spotd"), (b"authorization", f"Bearer {TOKEN}".encode())],
    }  # fmt: skip
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    body = b"".join(m.get("body", b"") for m in sent)  # type: ignore[misc]
    return int(sent[0]["status"]), body  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "cursor",
    ["A" * 100_000, "A" * (MAX_CURSOR + 1), "QUJD" * 40 + "!", "nope" * 40, "x y", ""],
    ids=["100-kb", "one-over", "not-base64", "not-a-cursor", "space", "empty"],
)
def test_a_bad_cursor_is_refused_and_quoted_by_its_start_only(engine: Engine, cursor: str) -> None:
    status, body = raw_get(engine, "/v1/jobs", b"cursor=" + quote(cursor).encode())
    assert status == 422, body[:200]
    assert (json.loads(body)["code"], json.loads(body)["field"]) == ("bad-cursor", "cursor")
    detail = json.loads(body)["detail"]
    assert isinstance(detail, str) and detail.startswith("cursor: "), detail[:200]
    assert len(body) < 400, "a short prefix, not the whole cursor"
    assert "pass back the `next` of a page" in detail


def test_a_real_cursor_still_pages(engine: Engine) -> None:
    for _ in range(3):
        engine.store.create_job(spec(), now=engine.clock.now())
    first = send(engine, "GET", "/v1/jobs", params={"limit": 2}, headers=bearer(TOKEN)).json()
    assert len(first["next"]) <= MAX_CURSOR
    rest = send(engine, "GET", "/v1/jobs", params={"limit": 2, "cursor": first["next"]},
                headers=bearer(TOKEN))  # fmt: skip
    assert rest.status_code == 200 and len(rest.json()["jobs"]) == 1


# -- 5., 6. a real daemon's HTTP server --------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """A ``spotd daemon`` process that waits half a second for a body: its port and token."""
    setup = make_setup(tmp_path_factory.mktemp("edge"), seed=1)
    text = setup.config.read_text().replace("[daemon]\n", "[daemon]\nbody_timeout_seconds = 0.5\n")
    setup.config.write_text(text)
    process = Daemon(setup)
    try:
        port = json.loads((setup.root / "daemon.json").read_text())["port"]
        yield port, (setup.root / "token").read_text().strip()
    finally:
        assert process.stop() == 0


def exchange(port: int, request: bytes, *, wait: float = 20.0) -> bytes:
    """Send ``request`` on a fresh connection and read until the server closes it.

    ``wait`` is a generous bound for a loaded machine, not a figure the test
    passes by: a server that never answers fails it.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_a_1_mb_header_gets_431_not_a_reset(daemon: tuple[int, str]) -> None:
    port, token = daemon
    head = (b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + token.encode() + b"\r\nX-Big: " + b"a" * 1_048_576 + b"\r\n\r\n")  # fmt: skip
    try:
        answer = exchange(port, head)
    except ConnectionError as exc:
        pytest.fail(f"the connection was cut with no status: {exc!r}")
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large", answer[:300]
    assert b"content-type: application/problem+json\r\n" in rest.lower()
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert body["code"] == "request-head-too-large" and body["status"] == 431
    assert "request head over this daemon's limit of 16,384 bytes" in body["detail"]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=bearer(token)) as client:
        assert client.get("/v1/jobs", headers={"X-Fits": "a" * 8000}).status_code == 200
        assert client.get("/v1/health").status_code == 200  # and it still serves


def test_a_malformed_request_gets_a_400_in_the_apis_shape(daemon: tuple[int, str]) -> None:
    port, _ = daemon
    answer = exchange(port, b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nNo colon here\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer[:300]
    assert b"content-type: application/problem+json" in answer.lower()
    problem = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert (problem["code"], problem["status"]) == ("bad-request", 400)
    assert problem["detail"].startswith("malformed HTTP")


def test_a_body_shorter_than_its_length_gets_408_and_the_connection_closed(
    daemon: tuple[int, str],
) -> None:
    port, token = daemon
    head = (f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n").encode()  # fmt: skip
    started = time.monotonic()
    try:
        answer = exchange(port, head + b'{"spec": ')
    except TimeoutError:
        pytest.fail("the server held the connection past the test's bound")
    took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:300]
    assert b"content-type: application/problem+json" in answer.lower()
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["code"] == "request-timeout"
    detail = json.loads(answer.partition(b"\r\n\r\n")[2])["detail"]
    assert "within 0.5 s ([daemon] body_timeout_seconds)" in detail
    assert took >= 0.4, "answered before the body's time was up"


# -- 7. the CLI across a restart -----------------------------------------------------


def test_the_cli_finds_a_daemon_restarted_after_it_read_the_address_file(
    tmp_path: Path,
) -> None:
    """Killed, then started again on another port: the client waits for the new one."""
    from spotd.cli.client import Client
    from spotd.daemon.config import load_settings

    setup = make_setup(tmp_path, seed=2)
    first = Daemon(setup)
    client = Client.from_settings(load_settings(setup.config), restart_wait=60)
    first.kill()  # its address file stays behind, naming a port nobody listens on
    second: list[Daemon] = []
    starting = threading.Thread(target=lambda: second.append(Daemon(setup)))
    starting.start()
    try:
        page = client.jobs()
        assert page.jobs == []
    finally:
        starting.join()
        client.close()
        assert second and second[0].stop() == 0
    assert not (setup.root / "daemon.json").exists(), "a clean stop removes its address file"
