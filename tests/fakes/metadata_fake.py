"""A loopback metadata service that plays AWS IMDSv2, GCE metadata and Azure Scheduled Events.

All three answer on one threaded HTTP server at ``fake.url`` (their paths do
not overlap). Levers change what the VM would see; counters and logs record
what the agent did:

AWS     ``PUT /latest/api/token`` (TTL header required) gives a token that expires
        after its TTL; every GET needs a live token (401 otherwise).
        ``schedule_aws_action()`` makes ``spot/instance-action`` answer (404 before),
        ``recommend_rebalance()`` the rebalance recommendation.
GCP     ``Metadata-Flavor: Google`` required (403). ``instance/preempted`` reads
        FALSE until ``preempt_gcp()``; ``wait_for_change=true`` blocks until the
        value differs from ``last_etag`` (or changes) or ``timeout_sec`` passes.
        ``break_gcp_long_poll`` makes long polls answer 500.
Azure   ``Metadata: true`` required (400). ``add_azure_preempt()`` adds a Preempt
        event; ``POST`` with ``StartRequests`` records acks in ``azure_acks``.
All     ``fail_next(n)`` answers the next ``n`` requests with 500.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

AWS_INSTANCE_ID = "i-0fake00000000001"
GCP_INSTANCE_NAME = "spotd-gcp-vm-1"
AZURE_VM_NAME = "spotd-azure-vm-1"
# The nodes' private addresses, on loopback: a test that dials one stays on this machine.
AWS_PRIVATE_IP = "127.0.31.1"
GCP_PRIVATE_IP = "127.0.31.2"
AZURE_PRIVATE_IP = "127.0.31.3"


@dataclass
class _State:
    aws_tokens: dict[str, float] = field(default_factory=dict)
    aws_tokens_issued: int = 0
    aws_unauthorized: int = 0
    aws_action: dict[str, str] | None = None
    aws_rebalance: dict[str, str] | None = None
    gcp_preempted: bool = False
    gcp_long_polls: int = 0
    gcp_plain_polls: int = 0
    break_gcp_long_poll: bool = False
    azure_incarnation: int = 1
    azure_events: list[dict[str, Any]] = field(default_factory=list)
    azure_acks: list[str] = field(default_factory=list)
    failures_left: int = 0
    requests: list[str] = field(default_factory=list)


class MetadataFake:
    """The fake service; use as a context manager or call :meth:`close`."""

    def __init__(self) -> None:
        self.state = _State()
        self.cond = threading.Condition()
        self.closing = False
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        # A short poll interval keeps shutdown() quick between tests.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> MetadataFake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- levers ---------------------------------------------------------------

    def schedule_aws_action(self, action: str = "terminate", in_seconds: float = 120) -> None:
        at = datetime.now(UTC) + timedelta(seconds=in_seconds)
        with self.cond:
            self.state.aws_action = {"action": action, "time": at.strftime("%Y-%m-%dT%H:%M:%SZ")}

    def recommend_rebalance(self) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self.cond:
            self.state.aws_rebalance = {"noticeTime": now}

    def preempt_gcp(self) -> None:
        with self.cond:
            self.state.gcp_preempted = True
            self.cond.notify_all()

    def add_azure_preempt(self, resources: list[str], in_seconds: float = 30) -> str:
        event_id = str(uuid.uuid4()).upper()
        not_before = format_datetime(datetime.now(UTC) + timedelta(seconds=in_seconds), usegmt=True)
        with self.cond:
            self.state.azure_incarnation += 1
            self.state.azure_events.append({
                "EventId": event_id,
                "EventStatus": "Scheduled",
                "EventType": "Preempt",
                "ResourceType": "VirtualMachine",
                "Resources": resources,
                "NotBefore": not_before,
                "Description": "Virtual machine is being preempted.",
                "EventSource": "Platform",
                "DurationInSeconds": -1,
            })
        return event_id

    def fail_next(self, n: int) -> None:
        with self.cond:
            self.state.failures_left = n

    def set_break_gcp_long_poll(self, broken: bool) -> None:
        with self.cond:
            self.state.break_gcp_long_poll = broken

    def snapshot(self) -> _State:
        """A copy of the state, for assertions."""
        with self.cond:
            s = self.state
            return _State(
                aws_tokens=dict(s.aws_tokens),
                aws_tokens_issued=s.aws_tokens_issued,
                aws_unauthorized=s.aws_unauthorized,
                aws_action=s.aws_action,
                aws_rebalance=s.aws_rebalance,
                gcp_preempted=s.gcp_preempted,
                gcp_long_polls=s.gcp_long_polls,
                gcp_plain_polls=s.gcp_plain_polls,
                break_gcp_long_poll=s.break_gcp_long_poll,
                azure_incarnation=s.azure_incarnation,
                azure_events=list(s.azure_events),
                azure_acks=list(s.azure_acks),
                failures_left=s.failures_left,
                requests=list(s.requests),
            )


def _etag(value: str) -> str:
    return hashlib.sha1(value.encode()).hexdigest()[:16]


class _Handler(BaseHTTPRequestHandler):
    fake: MetadataFake
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is in the fake's state."""

    # -- plumbing -------------------------------------------------------------

    def _reply(self, status: int, body: str | bytes = b"", headers: dict[str, str] | None = None,
               content_type: str = "text/plain") -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, body: object) -> None:
        self._reply(status, json.dumps(body), content_type="application/json")

    def _begin(self) -> tuple[str, dict[str, list[str]]] | None:
        """Log the request and apply ``fail_next``; None when it was answered."""
        split = urlsplit(self.path)
        with self.fake.cond:
            self.fake.state.requests.append(f"{self.command} {split.path}")
            failing = self.fake.state.failures_left > 0
            if failing:
                self.fake.state.failures_left -= 1
        if failing:
            self._reply(500, "injected failure")
            return None
        return split.path, parse_qs(split.query)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    # -- verbs ----------------------------------------------------------------

    def do_PUT(self) -> None:
        begun = self._begin()
        if begun is None:
            return
        path, _ = begun
        self._body()
        if path == "/latest/api/token":
            self._aws_token()
        else:
            self._reply(404, "not found")

    def do_GET(self) -> None:
        begun = self._begin()
        if begun is None:
            return
        path, query = begun
        if path.startswith("/latest/"):
            self._aws_get(path)
        elif path.startswith("/computeMetadata/v1/"):
            self._gcp_get(path, query)
        elif path.startswith("/metadata/"):
            self._azure_get(path, query)
        else:
            self._reply(404, "not found")

    def do_POST(self) -> None:
        begun = self._begin()
        if begun is None:
            return
        path, _ = begun
        body = self._body()
        if path == "/metadata/scheduledevents":
            self._azure_ack(body)
        else:
            self._reply(404, "not found")

    # -- AWS ------------------------------------------------------------------

    def _aws_token(self) -> None:
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            self._reply(400, "bad TTL")
            return
        token = uuid.uuid4().hex
        with self.fake.cond:
            self.fake.state.aws_tokens[token] = time.monotonic() + int(ttl)
            self.fake.state.aws_tokens_issued += 1
        self._reply(200, token, {"X-aws-ec2-metadata-token-ttl-seconds": ttl})

    def _aws_get(self, path: str) -> None:
        token = self.headers.get("X-aws-ec2-metadata-token", "")
        with self.fake.cond:
            state = self.fake.state
            live = state.aws_tokens.get(token, 0.0) > time.monotonic()
            if not live:
                state.aws_unauthorized += 1
            action, rebalance = state.aws_action, state.aws_rebalance
        if not live:
            self._reply(401, "unauthorized")
        elif path == "/latest/meta-data/instance-id":
            self._reply(200, AWS_INSTANCE_ID)
        elif path == "/latest/meta-data/local-ipv4":
            self._reply(200, AWS_PRIVATE_IP)
        elif path == "/latest/meta-data/spot/instance-action" and action is not None:
            self._json(200, action)
        elif path == "/latest/meta-data/events/recommendations/rebalance" and rebalance:
            self._json(200, rebalance)
        else:
            self._reply(404, "not found")

    # -- GCP ------------------------------------------------------------------

    def _gcp_get(self, path: str, query: dict[str, list[str]]) -> None:
        if self.headers.get("Metadata-Flavor") != "Google":
            self._reply(403, "missing Metadata-Flavor: Google")
            return
        if path == "/computeMetadata/v1/instance/name":
            self._reply(200, GCP_INSTANCE_NAME, {"Metadata-Flavor": "Google"})
        elif path == "/computeMetadata/v1/instance/network-interfaces/0/ip":
            self._reply(200, GCP_PRIVATE_IP, {"Metadata-Flavor": "Google"})
        elif path == "/computeMetadata/v1/instance/preempted":
            self._gcp_preempted(query)
        else:
            self._reply(404, "not found")

    def _gcp_preempted(self, query: dict[str, list[str]]) -> None:
        fake = self.fake
        waiting = query.get("wait_for_change", [""])[0] == "true"
        with fake.cond:
            if waiting:
                fake.state.gcp_long_polls += 1
                broken = fake.state.break_gcp_long_poll
            else:
                fake.state.gcp_plain_polls += 1
                broken = False
            value = "TRUE" if fake.state.gcp_preempted else "FALSE"
        if broken:
            self._reply(500, "long poll broken")
            return
        if waiting:
            value = self._gcp_wait(value, query)
        headers = {"ETag": _etag(value), "Metadata-Flavor": "Google"}
        self._reply(200, value, headers)

    def _gcp_wait(self, value: str, query: dict[str, list[str]]) -> str:
        """Block until the value differs from ``last_etag`` (or from now) or the timeout."""
        fake = self.fake
        last = query.get("last_etag", [_etag(value)])[0]
        timeout = float(query.get("timeout_sec", ["60"])[0])
        deadline = time.monotonic() + timeout

        def current() -> str:
            return "TRUE" if fake.state.gcp_preempted else "FALSE"

        with fake.cond:
            while _etag(current()) == last and not fake.closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                fake.cond.wait(left)
            return current()

    # -- Azure ----------------------------------------------------------------

    def _azure_get(self, path: str, query: dict[str, list[str]]) -> None:
        if self.headers.get("Metadata") != "true":
            self._json(400, {"error": "Bad request. Required metadata header not specified"})
            return
        if path == "/metadata/instance/compute/name":
            self._reply(200, AZURE_VM_NAME)
        elif path == "/metadata/instance/network/interface/0/ipv4/ipAddress/0/privateIpAddress":
            self._reply(200, AZURE_PRIVATE_IP)
        elif path == "/metadata/scheduledevents" and query.get("api-version"):
            with self.fake.cond:
                body = {
                    "DocumentIncarnation": self.fake.state.azure_incarnation,
                    "Events": list(self.fake.state.azure_events),
                }
            self._json(200, body)
        else:
            self._reply(404, "not found")

    def _azure_ack(self, body: bytes) -> None:
        if self.headers.get("Metadata") != "true":
            self._json(400, {"error": "Bad request. Required metadata header not specified"})
            return
        try:
            starts = json.loads(body)["StartRequests"]
            ids = [str(s["EventId"]) for s in starts]
        except (ValueError, KeyError, TypeError):
            self._json(400, {"error": "bad StartRequests"})
            return
        with self.fake.cond:
            self.fake.state.azure_acks.extend(ids)
            # Acknowledged events proceed: they leave the document.
            self.fake.state.azure_events = [
                e for e in self.fake.state.azure_events if e["EventId"] not in ids
            ]
            self.fake.state.azure_incarnation += 1
        self._reply(200, "")
