"""A real HTTP server on loopback that receives webhooks, with failures on cue.

``Receiver`` listens on 127.0.0.1 on a port of its own (``http.server`` in a
thread), records every POST (path, headers, body) and answers 200, or, for
the next ``fail_next`` requests, ``fail_status``. ``stop()`` closes the socket
(a connection is then refused) and ``start()`` listens again on the same port.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Request:
    """One POST the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """A webhook endpoint on loopback (see the module doc)."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.fail_next = 0
        self.fail_status = 503
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with receiver._lock:
                    receiver.requests.append(Request(self.path, dict(self.headers), body))
                    failing = receiver.fail_next > 0
                    if failing:
                        receiver.fail_next -= 1
                status = receiver.fail_status if failing else 200
                answer = b"unavailable" if failing else b"ok"
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test output is the assertions', not a request log

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Request]:
        """The first ``count`` requests, once that many arrived."""
        limit = time.monotonic() + timeout
        while time.monotonic() < limit:
            with self._lock:
                if len(self.requests) >= count:
                    return list(self.requests[:count])
            time.sleep(0.02)
        raise AssertionError(f"{len(self.requests)} of {count} webhook requests arrived")

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r.json() for r in self.requests]


def api(port: int, token: str, method: str, path: str, body: Any = None) -> Any:
    """One call to a daemon's HTTP API on loopback, with its token."""
    import httpx

    reply = httpx.request(
        method,
        f"http://127.0.0.1:{port}{path}",
        json=body,
        timeout=30,
        headers={"Authorization": f"Bearer {token}"},
    )
    reply.raise_for_status()
    return (
        reply.json()
        if reply.headers.get("content-type", "").startswith("application/json")
        else reply.text
    )
