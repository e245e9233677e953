"""Reports from the agent to the daemon, and an outbox that retries them.

:class:`DaemonReporter` makes one POST per report. :class:`ReportQueue` sends
reports in order from its own thread and retries failures with capped
exponential backoff, so a daemon that is down or restarting never blocks the
job or the notice handling; only the final exit report is waited for, and only
for a bounded time. The node's output goes its own way, by offset
(:mod:`spotd.agent.logship`), through :meth:`DaemonReporter.ship`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

import httpx
from pydantic import ValidationError

from spotd.core.agent_wire import (
    EXIT_PATH,
    HEARTBEAT_PATH,
    JOIN_PATH,
    LOG_PATH,
    NOTICE_PATH,
    PREFLIGHT_PATH,
    SECRETS_PATH,
    AgentReport,
    ExitReport,
    HeartbeatReport,
    JoinReport,
    LogAck,
    LogChunk,
    LogExpected,
    LogGap,
    NoticeReport,
    PreflightReport,
    Roster,
    Secrets,
    SecretsAsk,
    Waiting,
)
from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.errors import SpotdError
from spotd.core.orders import ORDERS_PATH, Orders, OrdersAsk
from spotd.core.rejoin import REJOIN_PATH, RejoinAnswer, RejoinAsk

log = logging.getLogger(__name__)


class ReportFailed(SpotdError):
    """The daemon could not take the report now (unreachable, 5xx, 429): retry."""


class ReportRejected(SpotdError):
    """The daemon refused the report (401, 422, ...): retrying cannot help."""


class ChunkTooLarge(ReportRejected):
    """The daemon refused a chunk of output as over its body limit (413): send less."""


def path_of(report: AgentReport) -> str:
    """The daemon route a report goes to."""
    if isinstance(report, NoticeReport):
        return NOTICE_PATH
    if isinstance(report, ExitReport):
        return EXIT_PATH
    if isinstance(report, PreflightReport):
        return PREFLIGHT_PATH
    if isinstance(report, JoinReport):
        return JOIN_PATH
    return HEARTBEAT_PATH


_STOP_POLL_SECONDS = 0.1
"""How often a drain with a ``stop`` event looks at it."""

_BEATS = (AgentReport, HeartbeatReport)
"""Reports of which only the latest queued one matters."""


class DaemonReporter:
    """POSTs reports to ``{daemon_url}/v1/agent/...`` with the agent's bearer token."""

    def __init__(
        self,
        daemon_url: str,
        token: str,
        *,
        client: httpx.Client | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.daemon_url = daemon_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=timeout)

    def send(self, report: AgentReport) -> None:
        """Deliver one report; raises ReportFailed or ReportRejected."""
        self._post(path_of(report), report)

    def join(self, report: JoinReport) -> Roster | Waiting:
        """Join the gang: its roster once complete, else how many have joined.

        Raises ReportFailed (retry) or ReportRejected (give up), as :meth:`send`.
        """
        response = self._post(JOIN_PATH, report)
        try:
            if response.status_code == 202:
                return Waiting.model_validate_json(response.content)
            return Roster.model_validate_json(response.content)
        except ValidationError as exc:
            raise ReportFailed(f"{JOIN_PATH}: unreadable answer: {exc}") from exc

    def orders(self, ask: OrdersAsk) -> Orders:
        """The daemon's orders for this node; raises ReportFailed or ReportRejected (a
        daemon too old for orders answers 404: rejected)."""
        response = self._post(ORDERS_PATH, ask)
        try:
            return Orders.model_validate_json(response.content)
        except ValidationError as exc:
            raise ReportFailed(f"{ORDERS_PATH}: unreadable answer: {exc}") from exc

    def next_step(self, ask: RejoinAsk) -> RejoinAnswer:
        """What this node, standing by after its command, is to do (:mod:`spotd.core.rejoin`);
        raises ReportFailed or ReportRejected (a daemon too old for it answers 404)."""
        response = self._post(REJOIN_PATH, ask)
        try:
            return RejoinAnswer.model_validate_json(response.content)
        except ValidationError:
            # The error would quote the body, and the body may hold an agent token.
            raise ReportFailed(f"{REJOIN_PATH}: unreadable answer") from None

    def secrets(self, ask: SecretsAsk) -> Secrets:
        """The job's secrets; raises ReportFailed (retry) or ReportRejected (give up)."""
        response = self._post(SECRETS_PATH, ask)
        try:
            return Secrets.model_validate_json(response.content)
        except ValidationError:
            # The error would quote the body, and the body holds the values.
            raise ReportFailed(f"{SECRETS_PATH}: unreadable answer") from None

    def ship(self, chunk: LogChunk) -> int:
        """Send a chunk of the node's output; the end of what the daemon holds of it.

        Raises :class:`~spotd.core.agent_wire.LogGap` with the offset the daemon
        expects (409), :class:`ChunkTooLarge` (413), else as :meth:`send`.
        """
        response = self._request(LOG_PATH, chunk)
        if response.status_code == 409:
            try:
                expected = LogExpected.model_validate_json(response.content).expected
            except ValidationError:
                # A conflict of another kind (two daemons at once): the next try settles it.
                raise ReportFailed(f"{LOG_PATH}: HTTP 409: {response.text[:200]}") from None
            raise LogGap(f"the daemon expects byte {expected}", expected=expected)
        if response.status_code == 413:
            raise ChunkTooLarge(f"{LOG_PATH}: HTTP 413: {response.text[:200]}")
        answer = self._checked(LOG_PATH, response)
        try:
            return LogAck.model_validate_json(answer.content).end
        except ValidationError as exc:
            raise ReportFailed(f"{LOG_PATH}: unreadable answer: {exc}") from exc

    def _post(self, path: str, report: AgentReport) -> httpx.Response:
        """POST ``report``; the answer when it is a success, else the error to raise."""
        return self._checked(path, self._request(path, report))

    def _request(self, path: str, report: AgentReport) -> httpx.Response:
        """POST ``report``; its answer, whatever its status. ReportFailed when none came."""
        try:
            return self._client.post(
                f"{self.daemon_url}{path}",
                # mode="json" writes bytes as the model says (a chunk's as base64).
                json=report.model_dump(mode="json"),
                headers=self._headers,
            )
        except httpx.HTTPError as exc:
            raise ReportFailed(f"{path}: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _checked(path: str, response: httpx.Response) -> httpx.Response:
        """``response`` when it is a success; else ReportFailed (retry) or ReportRejected."""
        if response.status_code >= 500 or response.status_code == 429:
            raise ReportFailed(f"{path}: HTTP {response.status_code}")
        if response.status_code >= 300:
            raise ReportRejected(f"{path}: HTTP {response.status_code}: {response.text[:200]}")
        return response

    def close(self) -> None:
        """Close the client if this reporter made it."""
        if self._owns_client:
            self._client.close()


class ReportQueue:
    """Sends reports in order from a background thread, retrying each until it goes.

    A newer heartbeat replaces one still waiting: only the latest says anything.
    ``clock`` times :meth:`drain`.
    """

    def __init__(
        self,
        send: Callable[[AgentReport], None],
        *,
        initial_backoff: float = 0.5,
        max_backoff: float = 30.0,
        clock: Clock = WALL,
    ) -> None:
        self._send = send
        self._clock = clock
        self._initial = initial_backoff
        self._max = max_backoff
        self._queue: deque[AgentReport] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="spotd-agent-outbox", daemon=True)

    def start(self) -> None:
        """Start the sending thread."""
        self._thread.start()

    def put(self, report: AgentReport) -> None:
        """Queue ``report``; returns at once."""
        with self._cond:
            if type(report) in _BEATS:
                stale = [r for r in self._queue if type(r) in _BEATS]
                for old in stale:
                    self._queue.remove(old)
            self._queue.append(report)
            self._cond.notify_all()

    def drain(self, timeout: float, *, stop: threading.Event | None = None) -> bool:
        """Wait up to ``timeout`` s until every queued report went, or until ``stop`` is
        set; True if they all went."""
        if stop is None:
            with self._cond:
                return self._cond.wait_for(lambda: not self._queue, timeout=timeout)
        # ``stop`` is set from a signal handler, which cannot notify the condition
        # safely: look at it a few times a second instead.
        deadline = self._clock.monotonic() + timeout
        with self._cond:
            while self._queue and not stop.is_set():
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, _STOP_POLL_SECONDS))
            return not self._queue

    def close(self) -> None:
        """Stop sending (what is still queued is dropped) and join the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        backoff = self._initial
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or bool(self._queue))
                if self._closed:
                    return
                report = self._queue[0]
            if self._deliver(report):
                backoff = self._initial
                self._done(report)
                continue
            with self._cond:
                # Interruptible sleep: close() must not wait out a long backoff.
                self._cond.wait_for(lambda: self._closed, timeout=backoff)
            backoff = min(self._max, backoff * 2)

    def _deliver(self, report: AgentReport) -> bool:
        """True when the report is settled (sent, or refused for good)."""
        try:
            self._send(report)
        except ReportFailed as exc:
            log.warning("report %s not delivered, will retry: %s", path_of(report), exc)
            return False
        except ReportRejected as exc:
            log.error("daemon refused report %s, dropping it: %s", path_of(report), exc)
        except Exception:
            # A bug in sending must not end the outbox: drop this report, keep the rest.
            log.exception("sending report %s failed unexpectedly; dropping it", path_of(report))
        return True

    def _done(self, report: AgentReport) -> None:
        with self._cond:
            # By identity: a newer heartbeat may have replaced this one meanwhile.
            for i, queued in enumerate(self._queue):
                if queued is report:
                    del self._queue[i]
                    break
            self._cond.notify_all()
