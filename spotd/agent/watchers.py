"""Preemption-notice watchers, one per provider, over each metadata service.

Every watcher answers :meth:`NoticeWatcher.check`: one poll, returning a
:class:`Notice` while the provider announces one, else None. A poll never
raises on a transient HTTP failure (connection refused, timeout, 5xx): the
notice will still be there at the next poll, and a crashing watcher would lose
it for good. The runner decides what to do with repeated notices.

Metadata requests ignore proxy variables (``trust_env=False``): the metadata
address is link-local and a proxy would answer for the wrong machine.
"""

from __future__ import annotations

import email.utils
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol

import httpx

from spotd.agent.config import DEFAULT_METADATA_URLS, AgentConfig, AzureAck
from spotd.agent_api import NoticeKind

log = logging.getLogger(__name__)

Clock = Callable[[], float]

GCP_NOTICE_SECONDS = 30
"""GCP gives about 30 s between the preemption signal and the hard power-off."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A provider's announcement.

    ``preemption``: the VM will be taken back, at ``deadline`` if known.
    ``rebalance``: an early warning (AWS) that preemption is likely; not a notice to act on.
    """

    kind: NoticeKind
    deadline: datetime | None
    detail: str


class NoticeWatcher(Protocol):
    """What the runner needs of a provider's notice source."""

    @property
    def poll_interval(self) -> float:
        """Seconds to wait between two :meth:`check` calls."""
        ...

    def check(self) -> Notice | None:
        """One poll; None when nothing is announced or the metadata service failed."""
        ...

    def instance_id(self) -> str | None:
        """This VM's id as the provider's API names it, or None if unknown."""
        ...

    def job_ended(self) -> None:
        """The job exited after a preemption notice (its checkpoint is done)."""
        ...

    def close(self) -> None:
        """Release the HTTP client."""
        ...


class NullWatcher:
    """Provider ``none``: no metadata service, never a notice."""

    def __init__(self, poll_interval: float = 60.0) -> None:
        self._interval = poll_interval

    @property
    def poll_interval(self) -> float:
        """Seconds between polls (nothing is polled)."""
        return self._interval

    def check(self) -> Notice | None:
        """Never a notice."""
        return None

    def instance_id(self) -> str | None:
        """Unknown."""
        return None

    def job_ended(self) -> None:
        """Nothing to do."""

    def close(self) -> None:
        """Nothing to release."""


class _HttpWatcher:
    """Shared plumbing: the client, the base URL, and quiet logging of failures."""

    def __init__(
        self, base_url: str, client: httpx.Client | None, poll_interval: float, timeout: float
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._interval = poll_interval
        self._owns_client = client is None
        self._client = client or httpx.Client(timeout=timeout, trust_env=False)
        self._failing = False

    @property
    def poll_interval(self) -> float:
        """Seconds between polls."""
        return self._interval

    def job_ended(self) -> None:
        """Nothing to do by default."""

    def close(self) -> None:
        """Close the client if this watcher made it."""
        if self._owns_client:
            self._client.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        """One request; None (logged) on a transport failure."""
        try:
            response = self._client.request(method, f"{self.base_url}{path}", **kwargs)
        except httpx.HTTPError as exc:
            self._failed(f"{method} {path}: {type(exc).__name__}: {exc}")
            return None
        return response

    def _failed(self, what: str) -> None:
        # A dead metadata service fails every poll: warn once per streak, not every 5 s.
        level = logging.DEBUG if self._failing else logging.WARNING
        log.log(level, "metadata request failed: %s", what)
        self._failing = True

    def _ok(self) -> None:
        if self._failing:
            log.info("metadata service answers again")
        self._failing = False


def _parse_iso(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return body if isinstance(body, dict) else {}


class AwsNoticeWatcher(_HttpWatcher):
    """EC2 IMDSv2: ``spot/instance-action`` (preemption) and the rebalance recommendation.

    Every read carries a session token from ``PUT /latest/api/token``; the token
    is renewed shortly before its TTL runs out, and once more on a 401.
    """

    TOKEN_PATH = "/latest/api/token"  # noqa: S105 (a URL path, not a secret)
    ACTION_PATH = "/latest/meta-data/spot/instance-action"
    REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
    INSTANCE_ID_PATH = "/latest/meta-data/instance-id"

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_METADATA_URLS["aws"],
        client: httpx.Client | None = None,
        poll_interval: float = 5.0,
        token_ttl_seconds: int = 21600,
        timeout: float = 2.0,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(base_url, client, poll_interval, timeout)
        self._ttl = token_ttl_seconds
        # Renew with a margin so a token never expires between our check and IMDS's.
        self._margin = min(60.0, token_ttl_seconds / 4)
        self._clock = clock
        self._token: str | None = None
        self._token_expires = 0.0

    def check(self) -> Notice | None:
        """Preemption if an instance action is scheduled, else rebalance if recommended."""
        action = self._read(self.ACTION_PATH)
        if action is not None:
            body = _json_object(action)
            what = body.get("action", "unknown action")
            return Notice(
                kind="preemption",
                deadline=_parse_iso(body.get("time")),
                detail=f"aws spot instance-action: {what} at {body.get('time', '?')}",
            )
        rebalance = self._read(self.REBALANCE_PATH)
        if rebalance is not None:
            when = _json_object(rebalance).get("noticeTime", "?")
            detail = f"aws rebalance recommendation at {when}"
            return Notice(kind="rebalance", deadline=None, detail=detail)
        return None

    def instance_id(self) -> str | None:
        """``meta-data/instance-id``."""
        response = self._read(self.INSTANCE_ID_PATH)
        return response.text.strip() if response is not None else None

    def _read(self, path: str) -> httpx.Response | None:
        """GET a metadata path: the response on 200, None on 404 or any failure."""
        response = self._get_with_token(path)
        if response is not None and response.status_code == 401:
            # The token may have been revoked or outlived our clock: get a new one once.
            self._token = None
            response = self._get_with_token(path)
        if response is None:
            return None
        if response.status_code == 200:
            self._ok()
            return response
        if response.status_code != 404:
            self._failed(f"GET {path}: HTTP {response.status_code}")
        return None

    def _get_with_token(self, path: str) -> httpx.Response | None:
        token = self._session_token()
        if token is None:
            return None
        return self._request("GET", path, headers={"X-aws-ec2-metadata-token": token})

    def _session_token(self) -> str | None:
        now = self._clock()
        if self._token is not None and now < self._token_expires - self._margin:
            return self._token
        response = self._request(
            "PUT", self.TOKEN_PATH, headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self._ttl)}
        )
        if response is None:
            return None
        if response.status_code != 200:
            self._failed(f"PUT {self.TOKEN_PATH}: HTTP {response.status_code}")
            return None
        self._token = response.text.strip()
        self._token_expires = now + self._ttl
        log.debug("new IMDSv2 token, valid %d s", self._ttl)
        return self._token


class GcpNoticeWatcher(_HttpWatcher):
    """GCE metadata ``instance/preempted``: TRUE once the VM is being preempted.

    The first read is a plain GET, which also yields the value's ETag. Later
    reads are long polls (``wait_for_change=true&last_etag=...``) that return
    at once if the value changed since that ETag, so a change between two polls
    is never missed. When a long poll fails, the watcher falls back to plain
    polls every ``poll_interval`` for ``plain_for_seconds`` and then tries again.
    """

    PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
    NAME_PATH = "/computeMetadata/v1/instance/name"
    HEADERS: ClassVar[Mapping[str, str]] = {"Metadata-Flavor": "Google"}

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_METADATA_URLS["gcp"],
        client: httpx.Client | None = None,
        poll_interval: float = 1.0,
        long_poll_seconds: float = 30.0,
        plain_for_seconds: float = 60.0,
        timeout: float = 2.0,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(base_url, client, poll_interval, timeout)
        self._long_poll = max(1, round(long_poll_seconds))  # the server takes whole seconds
        self._timeout = timeout
        self._plain_for = plain_for_seconds
        self._clock = clock
        self._etag: str | None = None
        self._plain_until = 0.0
        self._long_poll_returned_early = False

    @property
    def poll_interval(self) -> float:
        """No wait while long polls work (the server waits); else the plain interval."""
        if self._long_polling() and not self._long_poll_returned_early:
            return 0.0
        return self._interval

    @property
    def long_polling(self) -> bool:
        """Whether the next check is a long poll."""
        return self._long_polling()

    def check(self) -> Notice | None:
        """Long poll (or plain poll) ``preempted``; a notice when it reads TRUE."""
        response = self._long_get() if self._long_polling() else None
        if response is None:
            response = self._get(self.PREEMPTED_PATH, params={})
        if response is None:
            return None
        self._etag = response.headers.get("ETag") or self._etag
        if response.text.strip().upper() != "TRUE":
            return None
        deadline = datetime.now(UTC) + timedelta(seconds=GCP_NOTICE_SECONDS)
        return Notice(
            kind="preemption",
            deadline=deadline,
            detail=f"gcp instance/preempted=TRUE (about {GCP_NOTICE_SECONDS} s to power-off)",
        )

    def instance_id(self) -> str | None:
        """``instance/name``: the name the Compute API addresses the VM by."""
        response = self._get(self.NAME_PATH, params={})
        return response.text.strip() if response is not None else None

    def _long_polling(self) -> bool:
        return self._etag is not None and self._clock() >= self._plain_until

    def _long_get(self) -> httpx.Response | None:
        started = self._clock()
        params = {
            "wait_for_change": "true",
            "last_etag": self._etag or "",
            "timeout_sec": str(self._long_poll),
        }
        timeout = httpx.Timeout(self._timeout, read=self._long_poll + self._timeout)
        response = self._get(self.PREEMPTED_PATH, params=params, timeout=timeout)
        if response is None:
            self._plain_until = self._clock() + self._plain_for
            log.warning("gcp long poll failed; plain polling for %.0f s", self._plain_for)
            return None
        # A server that answers long polls at once would make us spin: slow down.
        self._long_poll_returned_early = self._clock() - started < min(0.5, self._long_poll / 2)
        return response

    def _get(self, path: str, params: dict[str, str], **kwargs: Any) -> httpx.Response | None:
        response = self._request("GET", path, params=params, headers=self.HEADERS, **kwargs)
        if response is None:
            return None
        if response.status_code != 200:
            self._failed(f"GET {path}: HTTP {response.status_code}")
            return None
        self._ok()
        return response


class AzureNoticeWatcher(_HttpWatcher):
    """Azure Scheduled Events: a ``Preempt`` event for this VM is a preemption notice.

    ``ack`` decides when the event is acknowledged (``StartRequests``), which
    lets Azure evict the VM at once instead of waiting for ``NotBefore``:
    ``after-exit`` (default) acknowledges once the job has exited after the
    signal, i.e. after its checkpoint; ``immediate`` as soon as it is seen,
    which gives the notice window away and only suits jobs that need none.
    """

    EVENTS_PATH = "/metadata/scheduledevents"
    EVENTS_PARAMS: ClassVar[Mapping[str, str]] = {"api-version": "2020-07-01"}
    NAME_PATH = "/metadata/instance/compute/name"
    NAME_PARAMS: ClassVar[Mapping[str, str]] = {"api-version": "2021-02-01", "format": "text"}
    HEADERS: ClassVar[Mapping[str, str]] = {"Metadata": "true"}

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_METADATA_URLS["azure"],
        client: httpx.Client | None = None,
        poll_interval: float = 1.0,
        vm_name: str = "",
        ack: AzureAck = "after-exit",
        timeout: float = 2.0,
    ) -> None:
        super().__init__(base_url, client, poll_interval, timeout)
        self._vm_name = vm_name.lower()
        self._ack_mode = ack
        self._seen: list[str] = []
        self._acked: set[str] = set()

    def check(self) -> Notice | None:
        """A notice for the first ``Preempt`` event that names this VM (or any, unnamed)."""
        response = self._request(
            "GET", self.EVENTS_PATH, params=self.EVENTS_PARAMS, headers=self.HEADERS
        )
        if response is None:
            return None
        if response.status_code != 200:
            self._failed(f"GET {self.EVENTS_PATH}: HTTP {response.status_code}")
            return None
        self._ok()
        events = _json_object(response).get("Events")
        for event in events if isinstance(events, list) else []:
            if isinstance(event, dict) and self._is_our_preemption(event):
                return self._notice(event)
        return None

    def job_ended(self) -> None:
        """In ``after-exit`` mode, acknowledge the preemptions seen: the job is done."""
        if self._ack_mode == "after-exit":
            self._acknowledge([e for e in self._seen if e not in self._acked])

    def instance_id(self) -> str | None:
        """``compute/name``: the VM name the Azure API addresses it by."""
        response = self._request(
            "GET", self.NAME_PATH, params=self.NAME_PARAMS, headers=self.HEADERS
        )
        if response is None or response.status_code != 200:
            return None
        return response.text.strip() or None

    def _is_our_preemption(self, event: dict[str, Any]) -> bool:
        if event.get("EventType") != "Preempt":
            return False
        if not self._vm_name:
            return True
        resources = event.get("Resources") or []
        return any(str(r).lower() == self._vm_name for r in resources)

    def _notice(self, event: dict[str, Any]) -> Notice:
        event_id = str(event.get("EventId", ""))
        if event_id and event_id not in self._seen:
            self._seen.append(event_id)
            if self._ack_mode == "immediate":
                self._acknowledge([event_id])
        not_before = str(event.get("NotBefore") or "")
        return Notice(
            kind="preemption",
            deadline=_parse_http_date(not_before),
            detail=f"azure Preempt event {event_id} not before {not_before or '?'}",
        )

    def _acknowledge(self, event_ids: list[str]) -> None:
        if not event_ids:
            return
        body = {"StartRequests": [{"EventId": e} for e in event_ids]}
        response = self._request(
            "POST", self.EVENTS_PATH, params=self.EVENTS_PARAMS, headers=self.HEADERS, json=body
        )
        if response is None or response.status_code >= 300:
            # Not fatal: Azure proceeds at NotBefore without our acknowledgement.
            status = "no answer" if response is None else f"HTTP {response.status_code}"
            log.warning("acknowledging %s failed: %s", event_ids, status)
            return
        self._acked.update(event_ids)
        log.info("acknowledged scheduled events %s", event_ids)


def _parse_http_date(value: str) -> datetime | None:
    """Azure's ``NotBefore`` is an RFC 1123 date ("Mon, 19 Sep 2016 18:29:47 GMT")."""
    if not value:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return _parse_iso(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def make_watcher(config: AgentConfig) -> NoticeWatcher:
    """The watcher for ``config.provider``, with its URL and intervals."""
    base, interval = config.metadata_base, config.poll_interval
    if config.provider == "aws":
        return AwsNoticeWatcher(base_url=base, poll_interval=interval)
    if config.provider == "gcp":
        return GcpNoticeWatcher(
            base_url=base, poll_interval=interval, long_poll_seconds=config.long_poll_seconds
        )
    if config.provider == "azure":
        return AzureNoticeWatcher(
            base_url=base, poll_interval=interval, vm_name=config.vm_name, ack=config.azure_ack
        )
    if config.provider == "sim":
        # The simulated node's "metadata service" is its status file.
        from spotd.providers.sim.notice import SimNoticeWatcher

        return SimNoticeWatcher(config.sim_state, poll_interval=interval)
    return NullWatcher(interval)
