"""boto3 clients of the adapter: one session, one client per service and region.

Retries are kept low because spotd's engine retries with its own backoff and
cooldowns; several layers of retries would hide a failing pool for minutes.
"""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config

from .errors import map_aws_errors
from .settings import AwsSettings

Client = Any
"""A boto3 client; boto3 ships no type hints, so clients are untyped here."""

BOTO_CONFIG = Config(
    retries={"total_max_attempts": 2, "mode": "standard"},
    connect_timeout=5,
    read_timeout=30,
    user_agent_extra="spotd",
)
"""One retry at most, a 5 s connect and a 30 s read timeout."""


class AwsClients:
    """Creates clients lazily from one boto3 session and keeps them.

    ``session`` may be injected (tests register botocore hooks on it); else
    one is made from the settings' ``profile`` and boto3's credential chain.
    """

    def __init__(self, settings: AwsSettings, session: Any = None) -> None:
        self._settings = settings
        self._session = session
        self._clients: dict[tuple[str, str], Client] = {}
        # boto3 sessions are not thread-safe; the clients they make are.
        self._lock = threading.Lock()

    def ec2(self, region: str) -> Client:
        """The EC2 client of ``region`` (at ``endpoint_url`` when set)."""
        return self._client("ec2", region, self._settings.endpoint_url)

    def sts(self, region: str) -> Client:
        """The STS client (who the credentials are), at ``endpoint_url`` when set."""
        return self._client("sts", region, self._settings.endpoint_url)

    def service_quotas(self, region: str) -> Client:
        """The Service Quotas client of ``region``, at ``endpoint_url`` when set."""
        return self._client("service-quotas", region, self._settings.endpoint_url)

    def fis(self, region: str) -> Client:
        """The Fault Injection Service client of ``region`` (drills), at ``endpoint_url``
        when set."""
        return self._client("fis", region, self._settings.endpoint_url)

    def pricing(self) -> Client:
        """The Price List API client at ``pricing_region``."""
        return self._client("pricing", self._settings.pricing_region, None)

    def _client(self, service: str, region: str, endpoint_url: str | None) -> Client:
        key = (service, region)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                with map_aws_errors(f"create {service} client"):
                    client = self._session_locked().client(
                        service, region_name=region, endpoint_url=endpoint_url,
                        config=BOTO_CONFIG,
                    )  # fmt: skip
                self._clients[key] = client
            return client

    def _session_locked(self) -> Any:
        if self._session is None:
            self._session = boto3.Session(profile_name=self._settings.profile)
        return self._session
