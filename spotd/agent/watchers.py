"""Preemption-notice watchers: their contract, shared HTTP plumbing and the null one.

Each provider kind brings its own watcher (``ProviderKind.notice_watcher``,
in its package); :func:`make_watcher` asks the kind of ``SPOTD_AGENT_PROVIDER``.

Every watcher answers :meth:`NoticeWatcher.check`: one poll, returning a
:class:`ProviderNotice` while the provider announces one, else None. A poll never
raises on a transient HTTP failure (connection refused, timeout, 5xx): the
notice will still be there at the next poll, and a crashing watcher would lose
it for good. The runner decides what to do with repeated notices.

Metadata requests ignore proxy variables (``trust_env=False``): the metadata
address is link-local and a proxy would answer for the wrong machine.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import httpx

from spotd.agent.config import AgentConfig
from spotd.core.agent_wire import ProviderNotice
from spotd.core.contracts import NoticeWatcher

log = logging.getLogger(__name__)

class NullWatcher:
    """Provider ``none``: no metadata service, never a notice."""

    def __init__(self, poll_interval: float = 60.0) -> None:
        self._interval = poll_interval

    @property
    def poll_interval(self) -> float:
        """Seconds between polls (nothing is polled)."""
        return self._interval

    def check(self) -> ProviderNotice | None:
        """Never a notice."""
        return None

    def instance_id(self) -> str | None:
        """Unknown."""
        return None

    def job_ended(self) -> None:
        """Nothing to do."""

    def close(self) -> None:
        """Nothing to release."""


class HttpWatcher:
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


def parse_iso(value: object) -> datetime | None:
    """An ISO 8601 time (``Z`` for UTC) as an aware datetime; None if it is not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def json_object(response: httpx.Response) -> dict[str, Any]:
    """The response's JSON object; empty when the body is not one."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return body if isinstance(body, dict) else {}


def make_watcher(config: AgentConfig) -> NoticeWatcher:
    """The watcher of ``config.provider``'s kind (its ``notice_watcher`` hook), with
    its URL and intervals; the null watcher for ``none`` or a kind with no notices."""
    kind = config.kind
    if kind is None or kind.notice_watcher is None:
        return NullWatcher(config.poll_interval)
    return kind.notice_watcher(config)
