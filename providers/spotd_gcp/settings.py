"""The ``[providers.gcp]`` settings of the GCP adapter.

Nothing secret lives here: credentials come only from Application Default
Credentials (``google.auth.default()``), or are injected by tests.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spotd.core.endpoints import checked_endpoint

DEFAULT_ZONES = [
    "us-central1-a", "us-central1-b", "us-central1-c",
    "us-east4-a", "us-east4-b", "us-east4-c",
    "europe-west4-a", "europe-west4-b",
]  # fmt: skip
"""Zones with A100, H100 and L4 capacity in most projects."""



class GcpGpuSubnet(BaseModel):
    """One GPU network interface's VPC network and subnetwork (spotd never creates them)."""

    model_config = ConfigDict(extra="forbid")

    network: str
    """``projects/P/global/networks/N`` (or ``global/networks/N`` in the launch project)."""
    subnetwork: str
    """``projects/P/regions/R/subnetworks/S``, ``regions/R/subnetworks/S`` or ``S``
    (then in the pool's region)."""


class GcpGpuNetworks(BaseModel):
    """The GPU NICs' networks of one region or zone, taken in order by each A3 layout."""

    model_config = ConfigDict(extra="forbid")

    gvnic: list[GcpGpuSubnet] = Field(default_factory=list)
    """gVNIC NICs after nic0: A3 High (GPUDirect-TCPX) takes the first 4, A3 Mega
    (TCPXO) the first 8, A3 Ultra and A4 the first 1 (their second gVNIC)."""
    rdma: list[GcpGpuSubnet] = Field(default_factory=list)
    """MRDMA NICs on a RoCE VPC (A3 Ultra, A4 take 8)."""


class GcpAttachedGpu(BaseModel):
    """GPUs attached to a general-purpose machine type (N1 with T4 or V100)."""

    model_config = ConfigDict(extra="forbid")

    accelerator: str
    """GCE accelerator type, e.g. ``nvidia-tesla-t4``."""
    count: int = Field(default=1, ge=1, le=8)


class GcpSettings(BaseModel):
    """The ``[providers.gcp]`` table: where spotd looks for and starts GPU VMs."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    project: str = ""
    """Project to launch in; empty takes the project of the ADC credentials."""
    zones: list[str] = Field(default_factory=lambda: list(DEFAULT_ZONES))
    machine_types: list[str] | None = None
    """Machine types to offer; None offers every GCP type of ``spotd.market.catalog``."""
    api_endpoint: str | None = None
    """Compute API endpoint override (tests and fakes; ``http://`` only on loopback)."""
    billing_endpoint: str | None = None
    """Cloud Billing API endpoint override (tests and fakes; ``http://`` only on loopback)."""
    image: str = ""
    """Source image URI of the boot disk, e.g. ``projects/P/global/images/family/F``."""
    boot_disk_gb: int = Field(default=200, ge=10)
    boot_disk_type: str = "pd-balanced"
    """Boot disk type. A3 Ultra, A4 and A4X take Hyperdisk only: a Persistent Disk type
    here gives them ``hyperdisk-balanced`` (``spotd_gcp.machines.HYPERDISK_ONLY``)."""
    network: str = "global/networks/default"
    external_ip: bool = True
    """Give each VM an ephemeral external address on nic0. False: nodes get none and need
    Cloud NAT on the region's router (or Private Google Access for Cloud Storage alone)
    to reach the daemon, the package index and the checkpoint store, which
    ``spotd check-cloud`` checks."""
    service_account: str | None = None
    """Service account email the VMs run as; None keeps the project default."""
    termination_action: Literal["DELETE", "STOP"] = "DELETE"
    """What GCP does to a preempted Spot VM."""
    catalog_ttl_hours: float = Field(default=6.0, gt=0)
    """How long the Cloud Billing catalog (large and slow to read) is cached."""
    machine_types_ttl_hours: float = Field(default=1.0, gt=0)
    """How long the machine types of the zones are cached."""
    request_timeout_seconds: float = Field(default=60.0, gt=0)
    """Timeout of each API call."""
    operation_timeout_seconds: float = Field(default=300.0, gt=0)
    """How long a launch waits for its insert operations to finish."""
    gpu_networks: dict[str, GcpGpuNetworks] = Field(default_factory=dict)
    """GPU NIC networks by region (``us-central1``) or zone (``us-central1-a``, wins):
    the fabric of multi-node A3 and A4 gangs. A gang of such a type is refused
    when its zone's networks are missing."""
    attached_gpus: dict[str, GcpAttachedGpu] = Field(default_factory=dict)
    """General-purpose machine types to offer with GPUs attached
    (``guest_accelerators``), e.g. ``n1-standard-8 = {accelerator = "nvidia-tesla-t4"}``."""
    resource_manager_endpoint: str | None = None
    """Cloud Resource Manager endpoint override (``check-cloud``'s permission test;
    tests and fakes, ``http://`` only on loopback)."""

    @field_validator("api_endpoint", "billing_endpoint", "resource_manager_endpoint")
    @classmethod
    def _plain_http_only_on_loopback(cls, value: str | None) -> str | None:
        return checked_endpoint(value)

    @field_validator("zones")
    @classmethod
    def _zones_look_like_zones(cls, value: list[str]) -> list[str]:
        for zone in value:
            if zone.count("-") < 2:
                raise ValueError(f"not a zone name: {zone!r} (expected e.g. us-central1-a)")
        return value

    @field_validator("gpu_networks")
    @classmethod
    def _keys_are_regions_or_zones(
        cls, value: dict[str, GcpGpuNetworks]
    ) -> dict[str, GcpGpuNetworks]:
        for key in value:
            if key.count("-") not in (1, 2):
                raise ValueError(f"gpu_networks: {key!r} is neither a region nor a zone")
        return value

    def gpu_networks_of(self, zone: str) -> GcpGpuNetworks | None:
        """The GPU networks configured for ``zone``: its own entry, else its region's."""
        return self.gpu_networks.get(zone) or self.gpu_networks.get(region_of(zone))

    @model_validator(mode="after")
    def _enabled_needs_an_image(self) -> GcpSettings:
        if self.enabled and not self.image:
            raise ValueError("providers.gcp.image must be set when the provider is enabled")
        return self


def region_of(zone: str) -> str:
    """The region of a zone name: ``us-central1-a`` -> ``us-central1``."""
    return zone.rsplit("-", 1)[0]
