"""The ``[providers.gcp]`` settings of the GCP adapter.

Nothing secret lives here: credentials come only from Application Default
Credentials (``google.auth.default()``), or are injected by tests.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_ZONES = [
    "us-central1-a", "us-central1-b", "us-central1-c",
    "us-east4-a", "us-east4-b", "us-east4-c",
    "europe-west4-a", "europe-west4-b",
]  # fmt: skip
"""Zones with A100, H100 and L4 capacity in most projects."""

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


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
    """Boot disk type; A3 Ultra and A4 take only ``hyperdisk-balanced``."""
    network: str = "global/networks/default"
    external_ip: bool = True
    """Give each VM an ephemeral external address (needed without Cloud NAT)."""
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

    @field_validator("api_endpoint", "billing_endpoint")
    @classmethod
    def _plain_http_only_on_loopback(cls, value: str | None) -> str | None:
        # An http:// endpoint would send bearer tokens in clear text: only fakes may use one.
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint must be an http(s) URL, got {value!r}")
        if parts.scheme == "http" and parts.hostname not in _LOOPBACK_HOSTS:
            raise ValueError(f"http:// endpoints are allowed only on loopback, got {value!r}")
        return value.rstrip("/")

    @field_validator("zones")
    @classmethod
    def _zones_look_like_zones(cls, value: list[str]) -> list[str]:
        for zone in value:
            if zone.count("-") < 2:
                raise ValueError(f"not a zone name: {zone!r} (expected e.g. us-central1-a)")
        return value

    @model_validator(mode="after")
    def _enabled_needs_an_image(self) -> GcpSettings:
        if self.enabled and not self.image:
            raise ValueError("providers.gcp.image must be set when the provider is enabled")
        return self


def region_of(zone: str) -> str:
    """The region of a zone name: ``us-central1-a`` -> ``us-central1``."""
    return zone.rsplit("-", 1)[0]
