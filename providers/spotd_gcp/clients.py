"""Building the Google API clients of the adapter (REST transport throughout).

Credentials come from the caller (tests pass ``AnonymousCredentials``) or
from Application Default Credentials; spotd never reads or stores a key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import google.auth
from google.cloud import billing_v1, compute_v1

from spotd.core.errors import ProviderError

from .errors import PROVIDER, map_gcp_errors
from .settings import GcpSettings

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
RESOURCE_MANAGER = "https://cloudresourcemanager.googleapis.com"


@dataclass(frozen=True, slots=True)
class GcpClients:
    """The API clients the adapter calls, and the project it works in."""

    project: str
    instances: Any
    """``compute_v1.InstancesClient``"""
    machine_types: Any
    """``compute_v1.MachineTypesClient``"""
    zone_operations: Any
    """``compute_v1.ZoneOperationsClient``"""
    catalog: Any
    """``billing_v1.CloudCatalogClient``"""
    resource_policies: Any = None
    """``compute_v1.ResourcePoliciesClient``"""
    region_operations: Any = None
    """``compute_v1.RegionOperationsClient``"""
    regions: Any = None
    """``compute_v1.RegionsClient`` (quotas)"""
    images: Any = None
    """``compute_v1.ImagesClient``"""
    subnetworks: Any = None
    """``compute_v1.SubnetworksClient``"""
    routers: Any = None
    """``compute_v1.RoutersClient`` (Cloud NAT, for ``check-cloud``)"""
    credentials: Any = None
    """What the clients authenticate with (``check-cloud`` tests permissions with it)."""
    resource_manager_url: str = RESOURCE_MANAGER
    """Cloud Resource Manager base URL (``projects.testIamPermissions``)."""


def default_credentials(project: str) -> tuple[Any, str]:
    """ADC credentials and the project (``project`` or the credentials' own)."""
    with map_gcp_errors("finding Application Default Credentials"):
        credentials, adc_project = google.auth.default(scopes=list(SCOPES))
    return credentials, project or adc_project or ""


def build_clients(settings: GcpSettings, credentials: Any | None = None) -> GcpClients:
    """Clients for ``settings``, on ``credentials`` or else on ADC."""
    project = settings.project
    if credentials is None:
        credentials, project = default_credentials(project)
    if not project:
        raise ProviderError(
            "gcp: providers.gcp.project is empty and the ADC credentials name no project",
            provider=PROVIDER, code="NoProject",
        )  # fmt: skip
    compute = _options(settings.api_endpoint)
    billing = _options(settings.billing_endpoint)
    common: dict[str, Any] = {"credentials": credentials, "transport": "rest"}
    # The constructors read client certificates and endpoints: their errors too are ours.
    with map_gcp_errors("creating the API clients"):
        return GcpClients(
            project=project,
            instances=compute_v1.InstancesClient(**common, client_options=compute),
            machine_types=compute_v1.MachineTypesClient(**common, client_options=compute),
            zone_operations=compute_v1.ZoneOperationsClient(**common, client_options=compute),
            catalog=billing_v1.CloudCatalogClient(**common, client_options=billing),
            resource_policies=compute_v1.ResourcePoliciesClient(
                **common, client_options=compute),
            region_operations=compute_v1.RegionOperationsClient(
                **common, client_options=compute),
            regions=compute_v1.RegionsClient(**common, client_options=compute),
            images=compute_v1.ImagesClient(**common, client_options=compute),
            subnetworks=compute_v1.SubnetworksClient(**common, client_options=compute),
            routers=compute_v1.RoutersClient(**common, client_options=compute),
            credentials=credentials,
            resource_manager_url=settings.resource_manager_endpoint or RESOURCE_MANAGER,
        )  # fmt: skip


def _options(endpoint: str | None) -> dict[str, Any] | None:
    # The SDK takes an http:// endpoint as plain HTTP (only fakes on loopback get one).
    return {"api_endpoint": endpoint} if endpoint else None
