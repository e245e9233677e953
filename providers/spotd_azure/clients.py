"""The SDK clients the adapter uses, built one way for production and tests.

Credentials come only from ``DefaultAzureCredential`` (or one injected by a
test). The compute client never retries (``retry_total=0``): the engine
retries with its own backoff and failover, and SDK retries under it would
only multiply the wait.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from azure.core.credentials import TokenCredential
from azure.core.pipeline import PipelineRequest
from azure.core.pipeline.policies import SansIOHTTPPolicy
from azure.core.rest import HttpRequest, HttpResponse
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.network import NetworkManagementClient

from .settings import AzureSettings

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class AllowLoopbackHttp(SansIOHTTPPolicy[HttpRequest, HttpResponse]):
    """Let the bearer-token policy send over plain http (only used for loopback fakes)."""

    def on_request(self, request: PipelineRequest[HttpRequest]) -> None:
        """Turn off azure-core's https check for this request."""
        request.context["enforce_https"] = False


def is_loopback_http(url: str) -> bool:
    """Whether ``url`` is plain http to this machine (a test fake), never a real cloud."""
    parts = urlsplit(url)
    return parts.scheme == "http" and (parts.hostname or "") in LOOPBACK_HOSTS


def default_credential() -> TokenCredential:
    """The credential chain of azure-identity: environment, workload or managed identity, CLI."""
    # Imported here: only a daemon with Azure enabled needs azure-identity loaded.
    from azure.identity import DefaultAzureCredential

    credential: TokenCredential = DefaultAzureCredential()
    return credential


def compute_client(
    settings: AzureSettings,
    credential: TokenCredential,
    *,
    polling_interval: float | None = None,
) -> ComputeManagementClient:
    """A compute client for the settings' subscription and ARM endpoint.

    Tokens go over plain http only to a loopback ``arm_endpoint``; any other
    http endpoint is refused by azure-core as usual.
    """
    options = _options(settings, polling_interval)
    return ComputeManagementClient(credential, settings.subscription_id, **options)


def network_client(
    settings: AzureSettings,
    credential: TokenCredential,
    *,
    polling_interval: float | None = None,
) -> NetworkManagementClient:
    """A network client like :func:`compute_client`; spotd only reads NICs with it.

    The compute API alone returns no VM address: the gang's private
    addresses come from the NICs the compute API created.
    """
    options = _options(settings, polling_interval)
    return NetworkManagementClient(credential, settings.subscription_id, **options)


def _options(settings: AzureSettings, polling_interval: float | None) -> dict[str, Any]:
    options: dict[str, Any] = {"retry_total": 0}
    if settings.arm_endpoint:
        options["base_url"] = settings.arm_endpoint
        if is_loopback_http(settings.arm_endpoint):
            options["per_call_policies"] = [AllowLoopbackHttp()]
    if polling_interval is not None:
        options["polling_interval"] = polling_interval
    return options
