"""The agent's notice watcher on Azure nodes: Scheduled Events' ``Preempt``."""

from __future__ import annotations

import email.utils
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

import httpx

from spotd.agent.config import AzureAck
from spotd.agent.watchers import HttpWatcher, json_object, parse_iso
from spotd.core.agent_wire import ProviderNotice

from .figures import METADATA_URL

log = logging.getLogger(__name__)


class AzureNoticeWatcher(HttpWatcher):
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
    ADDRESS_PATH = "/metadata/instance/network/interface/0/ipv4/ipAddress/0/privateIpAddress"
    HEADERS: ClassVar[Mapping[str, str]] = {"Metadata": "true"}

    def __init__(
        self,
        *,
        base_url: str = METADATA_URL,
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

    def check(self) -> ProviderNotice | None:
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
        events = json_object(response).get("Events")
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

    def private_address(self) -> str | None:
        """The first NIC's private IPv4 address (IMDS ``network/interface/0``)."""
        response = self._request(
            "GET", self.ADDRESS_PATH, params=self.NAME_PARAMS, headers=self.HEADERS
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

    def _notice(self, event: dict[str, Any]) -> ProviderNotice:
        event_id = str(event.get("EventId", ""))
        if event_id and event_id not in self._seen:
            self._seen.append(event_id)
            if self._ack_mode == "immediate":
                self._acknowledge([event_id])
        not_before = str(event.get("NotBefore") or "")
        return ProviderNotice(
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
        return parse_iso(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
