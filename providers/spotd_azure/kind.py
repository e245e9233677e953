"""The Azure provider kind: its descriptor, with the figures spotd weighs and their sources.

Its name, notice lead and GPU types live in the leaf :mod:`spotd_azure.figures`,
which the adapter reads too: nothing the adapter imports imports this module.

Importing this module needs no SDK: azure-mgmt-compute loads when ``build`` is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.contracts import BuiltProviders, ProviderContext
from spotd.core.kinds import BootCarrier, ProviderKind, Sdk

from .figures import INSTANCE_TYPES, METADATA_URL, NAME, NOTICE_SECONDS
from .settings import AzureSettings

if TYPE_CHECKING:
    from spotd.core.contracts import NoticeWatcher, WatcherSettings


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
    sdk_loggers=("azure", "msal"),
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
    # A replacement node is a new member of the kept nodes' scale set.
    replaces_gang_nodes=True,
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
