"""The agent's notice watcher on EC2 nodes: IMDSv2's spot instance-action and rebalance."""

from __future__ import annotations

import logging

import httpx

from spotd.agent.watchers import HttpWatcher, json_object, parse_iso
from spotd.core.agent_wire import ProviderNotice
from spotd.core.clock import WALL
from spotd.core.contracts import Clock

from .figures import METADATA_URL

log = logging.getLogger(__name__)


class AwsNoticeWatcher(HttpWatcher):
    """EC2 IMDSv2: ``spot/instance-action`` (preemption) and the rebalance recommendation.

    Every read carries a session token from ``PUT /latest/api/token``; the token
    is renewed shortly before its TTL runs out (by ``clock``'s monotonic seconds), and
    once more on a 401.
    """

    TOKEN_PATH = "/latest/api/token"  # noqa: S105 (a URL path, not a secret)
    ACTION_PATH = "/latest/meta-data/spot/instance-action"
    REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
    INSTANCE_ID_PATH = "/latest/meta-data/instance-id"
    ADDRESS_PATH = "/latest/meta-data/local-ipv4"

    def __init__(
        self,
        *,
        base_url: str = METADATA_URL,
        client: httpx.Client | None = None,
        poll_interval: float = 5.0,
        token_ttl_seconds: int = 21600,
        timeout: float = 2.0,
        clock: Clock = WALL,
    ) -> None:
        super().__init__(base_url, client, poll_interval, timeout)
        self._ttl = token_ttl_seconds
        # Renew with a margin so a token never expires between our check and IMDS's.
        self._margin = min(60.0, token_ttl_seconds / 4)
        self._clock = clock
        self._token: str | None = None
        self._token_expires = 0.0

    def check(self) -> ProviderNotice | None:
        """Preemption if an instance action is scheduled, else rebalance if recommended."""
        action = self._read(self.ACTION_PATH)
        if action is not None:
            body = json_object(action)
            what = body.get("action", "unknown action")
            return ProviderNotice(
                kind="preemption",
                deadline=parse_iso(body.get("time")),
                detail=f"aws spot instance-action: {what} at {body.get('time', '?')}",
            )
        rebalance = self._read(self.REBALANCE_PATH)
        if rebalance is not None:
            when = json_object(rebalance).get("noticeTime", "?")
            detail = f"aws rebalance recommendation at {when}"
            return ProviderNotice(kind="rebalance", deadline=None, detail=detail)
        return None

    def instance_id(self) -> str | None:
        """``meta-data/instance-id``."""
        response = self._read(self.INSTANCE_ID_PATH)
        return response.text.strip() if response is not None else None

    def private_address(self) -> str | None:
        """``meta-data/local-ipv4``: the primary interface's private address."""
        response = self._read(self.ADDRESS_PATH)
        return (response.text.strip() or None) if response is not None else None

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
        now = self._clock.monotonic()
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
