"""The CLI's HTTP client against a loopback server that answers what a daemon might."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from spotd.cli.client import Client
from spotd.core.errors import ApiError
from spotd.daemon.config import DaemonSettings, Settings

REPLIES: dict[str, tuple[int, bytes]] = {
    "/v1/jobs/j-cut": (200, b'{"id": "j-cut", "na'),
    "/v1/jobs/j-other": (200, b'{"id": "j-other", "status": 3}'),
    "/v1/jobs/j-gone/cancel": (409, b'{"detail": "job j-gone already cancelled"}'),
    "/v1/prices": (500, b"Internal Server Error"),
}


class _Daemon(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        status, body = REPLIES.get(self.path, (404, b'{"detail": "no such job"}'))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
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


def test_a_daemon_on_a_port_of_its_choosing_that_is_not_running_is_named(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    settings = Settings(data_dir=tmp_path, daemon=DaemonSettings(port=0))
    with pytest.raises(ApiError, match="no spotd daemon is running with data_dir"):
        Client.from_settings(settings)
