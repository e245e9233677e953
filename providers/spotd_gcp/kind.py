"""The GCP provider kind: its descriptor, with the figures spotd weighs and their sources.

Importing this module needs no SDK: google-cloud-compute loads when ``build`` is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.contracts import BuiltProviders, ProviderContext
from spotd.core.kinds import BootCarrier, InstanceShape, ProviderKind, Sdk
from spotd.core.kinds import instance_shape as _t
from spotd.core.network import Fabric

from .settings import GcpSettings

if TYPE_CHECKING:
    from spotd.core.contracts import NoticeWatcher, WatcherSettings

NAME = "gcp"

NOTICE_SECONDS = 30
"""GCP gives about 30 s between the preemption signal and the hard power-off
(shared/guides/domain.md)."""

METADATA_URL = "http://metadata.google.internal"
"""The GCE metadata server."""

E, ROCE = Fabric.ETHERNET, Fabric.ROCE

INSTANCE_TYPES: dict[str, InstanceShape] = {
    # "GPU machine types" and "A3 / A4 machine series" pages (A3 High:
    # GPUDirect-TCPX 1,000 Gbps; A3 Mega: GPUDirect-TCPXO 1,800 Gbps; A3 Ultra and
    # A4: 3,200 Gbps GPU RDMA over RoCE). A2 figures from public secondary sources.
    # Figures per node, divided by the GPUs of the node.
    "a2-highgpu-1g": _t("A100", 1, 40, E, 24),
    "a2-highgpu-8g": _t("A100", 8, 40, E, 100),
    "a2-ultragpu-1g": _t("A100", 1, 80, E, 24),
    "a2-ultragpu-8g": _t("A100", 8, 80, E, 100),
    "a3-highgpu-8g": _t("H100", 8, 80, Fabric.TCPX, 1000),
    "a3-megagpu-8g": _t("H100", 8, 80, Fabric.TCPXO, 1800),
    "a3-ultragpu-8g": _t("H200", 8, 141, ROCE, 3200),
    "a4-highgpu-8g": _t("B200", 8, 180, ROCE, 3200),
    "g2-standard-4": _t("L4", 1, 24, E, 10),
    "g2-standard-96": _t("L4", 8, 24, E, 100),
}
"""GPUs and scale-out fabric of the GCE GPU machine types spotd knows."""


def build(settings: GcpSettings, context: ProviderContext) -> BuiltProviders:
    """The GCP provider (loads the SDK), its nodes booted by the daemon's script."""
    from .adapter import build_gcp_provider

    script = context.require_boot_script(NAME)
    return BuiltProviders((build_gcp_provider(settings, startup_script=script),))


def notice_watcher(config: WatcherSettings) -> NoticeWatcher:
    """The metadata server's ``instance/preempted``, long-polled."""
    from .notice import GcpNoticeWatcher

    return GcpNoticeWatcher(
        base_url=config.metadata_base,
        poll_interval=config.poll_interval,
        long_poll_seconds=config.long_poll_seconds,
    )


KIND: ProviderKind[GcpSettings] = ProviderKind(
    name=NAME,
    settings=GcpSettings,
    build=build,
    # google-cloud-compute and -billing: the "gcp" extra of pyproject.toml.
    sdk=Sdk("gcp", ("google.cloud.compute_v1", "google.cloud.billing_v1")),
    # Compute Engine is "billed in one-second increments, with a 1-minute minimum".
    billing_step_seconds=1,
    billing_minimum_seconds=60,
    # Internet egress list price, first tier (~0.12 USD/GB); between regions
    # 0.01-0.02 USD/GB (shared/guides/domain.md).
    egress_usd_per_gb=0.12,
    inter_region_usd_per_gb=0.02,
    notice_seconds=NOTICE_SECONDS,
    # The startup-script metadata value: 256 KiB.
    boot=BootCarrier("GCE startup-script", 256 * 1024),
    metadata_url=METADATA_URL,
    # Only used when the long poll fails.
    agent_poll_seconds=1.0,
    instance_types=INSTANCE_TYPES,
    notice_watcher=notice_watcher,
)
"""The descriptor of the ``gcp`` kind (entry point ``spotd.providers: gcp``)."""
