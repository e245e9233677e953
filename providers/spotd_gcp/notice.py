"""The agent's notice watcher on GCE nodes: the metadata server's ``instance/preempted``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, ClassVar

import httpx

from spotd.agent.watchers import HttpWatcher
from spotd.core.agent_wire import ProviderNotice
from spotd.core.clock import WALL
from spotd.core.contracts import Clock

from .figures import METADATA_URL, NOTICE_SECONDS

log = logging.getLogger(__name__)


class GcpNoticeWatcher(HttpWatcher):
    """GCE metadata ``instance/preempted``: TRUE once the VM is being preempted.

    The first read is a plain GET, which also yields the value's ETag. Later
    reads are long polls (``wait_for_change=true&last_etag=...``) that return
    at once if the value changed since that ETag, so a change between two polls
    is never missed. When a long poll fails, the watcher falls back to plain
    polls every ``poll_interval`` for ``plain_for_seconds`` and then tries again.
    ``clock`` times that and dates the notice's deadline.
    """

    PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
    NAME_PATH = "/computeMetadata/v1/instance/name"
    ADDRESS_PATH = "/computeMetadata/v1/instance/network-interfaces/0/ip"
    HEADERS: ClassVar[Mapping[str, str]] = {"Metadata-Flavor": "Google"}

    def __init__(
        self,
        *,
        base_url: str = METADATA_URL,
        client: httpx.Client | None = None,
        poll_interval: float = 1.0,
        long_poll_seconds: float = 30.0,
        plain_for_seconds: float = 60.0,
        timeout: float = 2.0,
        clock: Clock = WALL,
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

    def check(self) -> ProviderNotice | None:
        """Long poll (or plain poll) ``preempted``; a notice when it reads TRUE."""
        response = self._long_get() if self._long_polling() else None
        if response is None:
            response = self._get(self.PREEMPTED_PATH, params={})
        if response is None:
            return None
        self._etag = response.headers.get("ETag") or self._etag
        if response.text.strip().upper() != "TRUE":
            return None
        deadline = self._clock.now() + timedelta(seconds=NOTICE_SECONDS)
        return ProviderNotice(
            kind="preemption",
            deadline=deadline,
            detail=f"gcp instance/preempted=TRUE (about {NOTICE_SECONDS} s to power-off)",
        )

    def instance_id(self) -> str | None:
        """``instance/name``: the name the Compute API addresses the VM by."""
        response = self._get(self.NAME_PATH, params={})
        return response.text.strip() if response is not None else None

    def private_address(self) -> str | None:
        """``network-interfaces/0/ip``: nic0's address, where the gang's peers reach it."""
        response = self._get(self.ADDRESS_PATH, params={})
        return (response.text.strip() or None) if response is not None else None

    def _long_polling(self) -> bool:
        return self._etag is not None and self._clock.monotonic() >= self._plain_until

    def _long_get(self) -> httpx.Response | None:
        started = self._clock.monotonic()
        params = {
            "wait_for_change": "true",
            "last_etag": self._etag or "",
            "timeout_sec": str(self._long_poll),
        }
        timeout = httpx.Timeout(self._timeout, read=self._long_poll + self._timeout)
        response = self._get(self.PREEMPTED_PATH, params=params, timeout=timeout)
        if response is None:
            self._plain_until = self._clock.monotonic() + self._plain_for
            log.warning("gcp long poll failed; plain polling for %.0f s", self._plain_for)
            return None
        # A server that answers long polls at once would make us spin: slow down.
        took = self._clock.monotonic() - started
        self._long_poll_returned_early = took < min(0.5, self._long_poll / 2)
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
