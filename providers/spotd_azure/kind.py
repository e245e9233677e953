"""The Azure provider kind: its descriptor, with the figures spotd weighs and their sources.

Importing this module needs no SDK: azure-mgmt-compute loads when ``build`` is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.contracts import BuiltProviders, ProviderContext
from spotd.core.kinds import BootCarrier, InstanceShape, ProviderKind, Sdk
from spotd.core.kinds import instance_shape as _t
from spotd.core.network import Fabric

from .settings import AzureSettings

if TYPE_CHECKING:
    from spotd.core.contracts import NoticeWatcher, WatcherSettings

NAME = "azure"

NOTICE_SECONDS = 30
"""Azure Scheduled Events give at least 30 s (shared/guides/domain.md)."""

METADATA_URL = "http://169.254.169.254"
"""The Azure Instance Metadata Service."""

E, IB = Fabric.ETHERNET, Fabric.INFINIBAND

INSTANCE_TYPES: dict[str, InstanceShape] = {
    # "ND A100 v4", "ND H100 v5", "ND H200 v5", "NC A100 v4", "NCads H100 v5"
    # size pages (HDR 200 Gb/s or NDR 400 Gb/s InfiniBand per GPU; NC sizes have
    # no InfiniBand). Figures per node, divided by the GPUs of the node.
    "Standard_ND96asr_v4": _t("A100", 8, 40, IB, 1600),
    "Standard_ND96amsr_A100_v4": _t("A100", 8, 80, IB, 1600),
    "Standard_ND96isr_H100_v5": _t("H100", 8, 80, IB, 3200),
    "Standard_ND96isr_H200_v5": _t("H200", 8, 141, IB, 3200),
    "Standard_NC24ads_A100_v4": _t("A100", 1, 80, E, 20),
    "Standard_NC48ads_A100_v4": _t("A100", 2, 80, E, 40),
    "Standard_NC96ads_A100_v4": _t("A100", 4, 80, E, 80),
    "Standard_NC40ads_H100_v5": _t("H100-NVL", 1, 94, E, 40),
    "Standard_NC80adis_H100_v5": _t("H100-NVL", 2, 94, E, 80),
}
"""GPUs and scale-out fabric of the Azure GPU sizes spotd knows."""


def build(settings: AzureSettings, context: ProviderContext) -> BuiltProviders:
    """The Azure provider (loads the SDK), its nodes booted by the daemon's script."""
    from .adapter import build_azure_provider

    custom_data = context.require_boot_script(NAME)
    return BuiltProviders((build_azure_provider(settings, custom_data=custom_data),))


def notice_watcher(config: WatcherSettings) -> NoticeWatcher:
    """Scheduled Events' ``Preempt`` for this VM, acknowledged as ``azure_ack`` says."""
    from .notice import AzureNoticeWatcher

    return AzureNoticeWatcher(
        base_url=config.metadata_base,
        poll_interval=config.poll_interval,
        vm_name=config.vm_name,
        ack=config.azure_ack,
    )


KIND: ProviderKind[AzureSettings] = ProviderKind(
    name=NAME,
    settings=AzureSettings,
    build=build,
    # azure-mgmt-compute, -network, azure-identity: the "azure" extra of pyproject.toml.
    sdk=Sdk("azure", ("azure.mgmt.compute", "azure.mgmt.network", "azure.identity")),
    # Azure VMs are billed per minute (partial minutes rounded up).
    billing_step_seconds=60,
    billing_minimum_seconds=60,
    # Internet egress list price, first tier (~0.087 USD/GB); between regions
    # 0.01-0.02 USD/GB (shared/guides/domain.md).
    egress_usd_per_gb=0.087,
    inter_region_usd_per_gb=0.02,
    notice_seconds=NOTICE_SECONDS,
    # Custom data via cloud-init: 64 KiB, counted after base64 (checked raw).
    boot=BootCarrier("Azure custom data via cloud-init", 64 * 1024),
    metadata_url=METADATA_URL,
    # As little as 30 s of notice: poll each second.
    agent_poll_seconds=1.0,
    instance_types=INSTANCE_TYPES,
    notice_watcher=notice_watcher,
    # azure-identity's EnvironmentCredential: a client secret, a certificate's password.
    secret_variables=("AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PASSWORD", "AZURE_PASSWORD"),
)
"""The descriptor of the ``azure`` kind (entry point ``spotd.providers: azure``)."""
