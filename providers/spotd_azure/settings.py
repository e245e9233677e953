"""Settings of the Azure adapter (the ``[providers.azure]`` table) and their checks.

Nothing secret lives here: credentials come from ``DefaultAzureCredential``
(environment, workload or managed identity, Azure CLI login), never from
spotd's configuration.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from spotd.core.errors import ConfigError

from .figures import INSTANCE_TYPES

IMAGE_KEYS = frozenset({"publisher", "offer", "sku", "version"})
"""The keys an image reference must have, no more and no fewer."""


def _default_image() -> dict[str, str]:
    # Microsoft's Ubuntu HPC image ships the GPU, InfiniBand and NCCL drivers
    # that the ND sizes need, so a node can train without a custom image.
    return {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204",
            "version": "latest"}  # fmt: skip


class AzureSettings(BaseModel):
    """Where and how spotd buys Azure GPU VMs."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    subscription_id: str = ""
    """The subscription VMs are created in (a UUID)."""
    resource_group: str = "spotd"
    """An existing resource group that holds spotd's VMs and nothing else of value."""
    regions: list[str] = Field(default_factory=lambda: ["eastus", "westus3"])
    sizes: list[str] | None = None
    """VM sizes to offer; None means every Azure size in spotd's interconnect table."""
    arm_endpoint: str | None = None
    """Azure Resource Manager base URL; None for the public cloud (tests point it at a fake)."""
    prices_url: str = "https://prices.azure.com"
    """Base URL of the unauthenticated Retail Prices API."""
    image: dict[str, str] = Field(default_factory=_default_image)
    """Marketplace image: ``publisher``, ``offer``, ``sku``, ``version``."""
    subnet_id: dict[str, str] = Field(default_factory=dict)
    """Region -> resource id of the subnet the VMs' NICs join."""
    admin_username: str = "spotd"
    ssh_public_key: str | None = None
    """Public key for the admin user; Azure requires one (passwords are disabled)."""

    def size_list(self) -> list[str]:
        """The sizes to offer, the interconnect table's Azure sizes by default."""
        return list(self.sizes) if self.sizes is not None else sorted(INSTANCE_TYPES)


def check_launchable(settings: AzureSettings) -> None:
    """Raise :class:`ConfigError` naming every setting that stops a launch.

    Run when the provider is built, so a bad table fails at start-up rather
    than at the first launch hours later.
    """
    problems = []
    if not settings.subscription_id:
        problems.append("subscription_id is empty")
    if not settings.regions:
        problems.append("regions is empty")
    missing = [r for r in settings.regions if not settings.subnet_id.get(r)]
    if missing:
        problems.append(f"subnet_id has no subnet for region(s) {', '.join(missing)}")
    if set(settings.image) != IMAGE_KEYS:
        problems.append(f"image must have exactly the keys {', '.join(sorted(IMAGE_KEYS))}")
    if not settings.ssh_public_key:
        problems.append("ssh_public_key is not set (Azure Linux VMs need one)")
    if problems:
        raise ConfigError("providers.azure: " + "; ".join(problems))
