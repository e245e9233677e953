"""The CLI's HTTP client against a loopback server that answers what a daemon might."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from spotd.cli.client import Client, daemon_alive
from spotd.core.errors import (
    ApiError,
    FieldProblem,
    IllegalTransition,
    JobNotFound,
    RequestInvalid,
    SpotdError,
    StoreUnavailable,
    SubmitRefused,
)
from spotd.core.spec import JobSpec
from spotd.daemon.config import DaemonSettings, Settings
from spotd.daemon.problems import invalid, problem_of
from spotd.daemon.views import JobView


def _problem(exc: SpotdError) -> tuple[int, bytes]:
    """What the daemon answers for ``exc``."""
    sent = problem_of(exc)
    return sent.status, sent.body()


REPLIES: dict[str, tuple[int, bytes]] = {
    "/v1/jobs/j-cut": (200, b'{"id": "j-cut", "na'),
    "/v1/jobs/j-other": (200, b'{"id": "j-other", "status": 3}'),
    "/v1/jobs/j-gone/cancel": (409, b'{"detail": "job j-gone already cancelled"}'),
    "/v1/prices": (500, b"Internal Server Error"),
    "/v1/jobs/j-missing": _problem(JobNotFound("no job 'j-missing'", job_id="j-missing")),
    "/v1/jobs/j-ended/cancel": _problem(
        IllegalTransition("job j-ended already cancelled", job_id="j-ended")
    ),
    "/v1/jobs/j-full/events": _problem(
        StoreUnavailable(
            "the store is unavailable: database or disk is full",
            cause="database or disk is full",
        )
    ),
    "/v1/jobs?limit=0": _problem(
        invalid(
            [
                FieldProblem("limit", "Input should be greater than or equal to 1"),
                FieldProblem("status", "'x' is not one of active, ended"),
            ]
        )
    ),
    "/v1/jobs": _problem(
        SubmitRefused("resources.gpus: no provider offers Z900", field="resources.gpus")
    ),
}


class _Daemon(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        status, body = REPLIES.get(self.path, (404, b'{"detail": "no such job"}'))
        self.send_response(status)
        kind = "application/problem+json" if b'"code"' in body else "application/json"
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


@pytest.fixture
def client() -> Iterator[Client]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Daemon)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    c = Client(f"http://{host!s}:{port}", "token", timeout=5)
    yield c
    c.close()
    server.shutdown()
    server.server_close()


def test_a_reply_cut_short_is_an_api_error(client: Client) -> None:
    with pytest.raises(ApiError, match="GET /v1/jobs/j-cut: the daemon's reply is not JSON"):
        client.job("j-cut")


def test_a_reply_of_another_shape_names_the_field_and_suggests_a_version_skew(
    client: Client,
) -> None:
    with pytest.raises(ApiError, match=r"does not read as this CLI expects \(name: ") as err:
        client.job("j-other")
    assert "another version of spotd" in str(err.value)


def test_a_refusal_reads_as_the_daemon_put_it_and_a_failure_says_whose(client: Client) -> None:
    with pytest.raises(ApiError) as refused:
        client.cancel("j-gone")
    assert str(refused.value) == "job j-gone already cancelled"
    with pytest.raises(ApiError) as failed:
        client.prices()
    assert str(failed.value) == "the daemon failed (500): Internal Server Error"


def test_a_problem_is_raised_as_its_own_class_with_its_detail(client: Client) -> None:
    with pytest.raises(JobNotFound) as missing:
        client.job("j-missing")
    assert str(missing.value) == "no job 'j-missing'" and missing.value.job_id == "j-missing"
    with pytest.raises(IllegalTransition, match=r"^job j-ended already cancelled$"):
        client.cancel("j-ended")
    with pytest.raises(StoreUnavailable) as full:
        client.events("j-full")
    assert str(full.value) == "the store is unavailable: database or disk is full"
    with pytest.raises(RequestInvalid) as invalid_page:
        client.jobs(limit=0)
    assert [p.field for p in invalid_page.value.problems] == ["limit", "status"]
    assert str(invalid_page.value).startswith("invalid request: limit: Input should be")


def test_a_refused_submit_is_a_submit_refused_naming_the_field(client: Client) -> None:
    with pytest.raises(SubmitRefused) as refused:
        client.submit(_spec())
    assert str(refused.value) == "resources.gpus: no provider offers Z900"
    assert refused.value.field == "resources.gpus"


def test_a_cli_error_of_several_fields_lists_them(
    client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    from spotd.cli.errors import render_problem

    with pytest.raises(RequestInvalid) as invalid_page:
        client.jobs(limit=0)
    render_problem(invalid_page.value)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("error: invalid request: limit: Input should be")
    assert lines[1:] == [
        "  limit: Input should be greater than or equal to 1",
        "  status: 'x' is not one of active, ended",
    ]
    render_problem(ApiError("one line"))
    assert capsys.readouterr().err == "error: one line\n"


def test_a_daemon_on_a_port_of_its_choosing_that_is_not_running_is_named(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    settings = Settings(data_dir=tmp_path, daemon=DaemonSettings(port=0))
    with pytest.raises(ApiError, match="no spotd daemon is running with data_dir"):
        Client.from_settings(settings)


def test_the_client_outwaits_the_stores_lock_wait() -> None:
    from spotd.cli.client import TIMEOUT_SECONDS
    from spotd.store.base import SQLITE_BUSY_TIMEOUT_MS

    # A daemon whose store waits its whole lock wait still answers (503) in time.
    assert TIMEOUT_SECONDS >= SQLITE_BUSY_TIMEOUT_MS / 1000 + 10


class _SlowSubmit(BaseHTTPRequestHandler):
    """Takes longer than the client waits for every submit, and keeps their keys."""

    keys: ClassVar[list[str | None]] = []
    answer_on: ClassVar[int] = 99  # the try (0-based) that gets an answer in time

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # the health probe
        self._reply(200, b'{"status": "ok"}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        tries = len(self.keys)
        self.keys.append(self.headers.get("Idempotency-Key"))
        if tries < self.answer_on:
            time.sleep(2.0)  # past the client's timeout, however slow the machine
            return
        job = SUBMITTED.model_copy(update={"id": "j-0000000001"})
        self._reply(200, job.model_dump_json().encode())

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


SUBMITTED = JobView(
    id="j-x", name="t", status="pending", failure=None, submitted_at=datetime.now(UTC),
    updated_at=datetime.now(UTC), preemptions=0, providers=[], cost_usd=0.0, attempts=[],
    spec={},
)  # fmt: skip


@pytest.fixture
def slow() -> Iterator[tuple[Client, type[_SlowSubmit]]]:
    handler = type("Handler", (_SlowSubmit,), {"keys": [], "answer_on": 99})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    # Long enough for an answer on loopback on a loaded machine, short beside 2 s.
    c = Client(f"http://{host!s}:{port}", "token", timeout=0.8)
    yield c, handler
    c.close()
    server.shutdown()
    server.server_close()


def _spec() -> JobSpec:
    return JobSpec.model_validate(
        {"name": "t", "command": ["true"], "resources": {"gpus": ["A100"], "gpus_per_node": 1}}
    )


def test_a_timed_out_submit_is_retried_once_with_the_same_key(
    slow: tuple[Client, type[_SlowSubmit]],
) -> None:
    client, handler = slow
    handler.answer_on = 1
    job = client.submit(_spec())
    assert job.id == "j-0000000001"
    assert len(handler.keys) == 2 and handler.keys[0] == handler.keys[1]
    assert str(uuid.UUID(str(handler.keys[0]))) == handler.keys[0], "a UUID per submit"
    client.submit(_spec())
    assert handler.keys[2] != handler.keys[0], "the next submit has a key of its own"


def test_a_submit_that_times_out_twice_says_what_happened_and_how_to_retry_safely(
    slow: tuple[Client, type[_SlowSubmit]],
) -> None:
    client, handler = slow
    with pytest.raises(ApiError) as failed:
        client.submit(_spec(), idempotency_key="key-1")
    message = str(failed.value)
    assert handler.keys == ["key-1", "key-1"]
    assert message.startswith(
        f"the spotd daemon at {client._http.base_url} did not answer the submit within 0.8 s"
    )
    assert "the job may have been stored: `spotd status` shows it" in message
    assert "`--idempotency-key key-1` is safe" in message
    assert "start it" not in message


def test_a_timeout_is_no_reason_to_start_a_daemon(slow: tuple[Client, type[_SlowSubmit]]) -> None:
    client, _ = slow
    with pytest.raises(ApiError) as failed:
        client._call("POST", "/v1/jobs/j-1/cancel", json={})
    assert "did not answer POST /v1/jobs/j-1/cancel within 0.8 s" in str(failed.value)
    assert "spotd daemon`" not in str(failed.value)


def test_an_unreachable_daemon_is_told_by_its_address_file(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free, and nobody listens once closed
    address = tmp_path / "daemon.json"
    url = f"http://127.0.0.1:{port}"

    gone = Client(url, "t", timeout=2, address_file=address)
    with pytest.raises(ApiError, match=r"cannot reach a spotd daemon at .*start it with `spotd"):
        gone.job("j-1")

    address.write_text(json.dumps({"host": "127.0.0.1", "port": port, "pid": os.getpid()}))
    stuck = Client(url, "t", timeout=2, address_file=address)
    with pytest.raises(ApiError) as failed:
        stuck.job("j-1")
    assert f"is running (its pid is in {address})" in str(failed.value)
    assert "start it" not in str(failed.value)
    assert daemon_alive(address) is True
    address.write_text(json.dumps({"host": "127.0.0.1", "port": port, "pid": 2**22 + 1}))
    assert daemon_alive(address) is False
    assert daemon_alive(tmp_path / "missing.json") is None


# -- a daemon restarting under the client ------------------------------------------

DEAD_PID = 2**22 + 1
"""Over Linux's largest pid_max: no process has it."""


class _Restarted(BaseHTTPRequestHandler):
    """The daemon after its restart: knows one job."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = SUBMITTED.model_copy(update={"id": "j-1"}).model_dump_json().encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.do_GET()


@pytest.fixture
def restarted() -> Iterator[int]:
    """A server standing for the restarted daemon: its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Restarted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nobody listens once it is closed


def _settings(root: Path, *, port: int | None, pid: int) -> Settings:
    (root / "token").write_text("t")
    if port is not None:
        _write_address(root / "daemon.json", port, pid)
    return Settings(data_dir=root, daemon=DaemonSettings(port=0))


def _write_address(path: Path, port: int, pid: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"host": "127.0.0.1", "port": port, "pid": pid}))
    tmp.replace(path)


def _later(seconds: float, act: Callable[[], None]) -> threading.Thread:
    thread = threading.Timer(seconds, act)
    thread.start()
    return thread


@pytest.mark.parametrize("old", ["stale", "removed"])
def test_a_client_refused_by_a_stale_address_follows_the_restarted_daemon(
    tmp_path: Path, restarted: int, old: str
) -> None:
    """Read just before the daemon went: the old port refuses, the new file is read."""
    settings = _settings(tmp_path, port=_free_port(), pid=DEAD_PID if old == "stale" else 1)
    client = Client.from_settings(settings)
    address = settings.address_file
    if old == "removed":  # the old daemon stopped cleanly after the client read its file
        address.unlink()
    writer = _later(0.3, lambda: _write_address(address, restarted, os.getpid()))
    started = time.monotonic()
    try:
        assert client.job("j-1").id == "j-1"
    finally:
        writer.join()
        client.close()
    assert time.monotonic() - started < 20, "a generous bound: found as soon as it is written"


def test_a_submit_follows_a_restart_with_its_key(tmp_path: Path, restarted: int) -> None:
    settings = _settings(tmp_path, port=_free_port(), pid=DEAD_PID)
    client = Client.from_settings(settings)
    writer = _later(0.2, lambda: _write_address(settings.address_file, restarted, os.getpid()))
    try:
        assert client.submit(_spec(), idempotency_key="k-1").id == "j-1"
    finally:
        writer.join()
        client.close()


def test_a_stale_address_file_is_named_when_no_daemon_comes_back(tmp_path: Path) -> None:
    port = _free_port()
    settings = _settings(tmp_path, port=port, pid=DEAD_PID)
    client = Client.from_settings(settings, restart_wait=0.3)
    with pytest.raises(ApiError) as failed:
        client.job("j-1")
    message = str(failed.value)
    assert f"{settings.address_file} names pid {DEAD_PID}, which is not running" in message
    assert "did not stop cleanly" in message and "start it with `spotd daemon`" in message
    assert "waited 0.3 s for a new one" in message


def test_a_client_that_never_read_an_address_file_does_not_wait(tmp_path: Path) -> None:
    """No daemon, no address file: nothing says one is on its way."""
    client = Client(f"http://127.0.0.1:{_free_port()}", "t", timeout=2,
                    address_file=tmp_path / "daemon.json", restart_wait=30)  # fmt: skip
    started = time.monotonic()
    with pytest.raises(ApiError, match="cannot reach a spotd daemon"):
        client.job("j-1")
    assert time.monotonic() - started < 10
