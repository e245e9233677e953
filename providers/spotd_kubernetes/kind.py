"""The Kubernetes provider kind: its descriptor.

Importing this module needs no SDK: the kubernetes client loads when ``build`` is called.
"""

from __future__ import annotations

from spotd.core.contracts import BuiltProviders, ProviderContext
from spotd.core.kinds import BootCarrier, ProviderKind, Sdk

from .figures import NAME, NOTICE_SECONDS
from .settings import KubernetesSettings

POD_SCRIPT_BYTES = 120 * 1024
"""The boot script goes to ``bash -c`` as one argument: Linux takes 128 KiB at most
(MAX_ARG_STRLEN), less the few lines spotd adds after it."""


def build(settings: KubernetesSettings, context: ProviderContext) -> BuiltProviders:
    """The cluster's provider (loads the kubernetes client); its pods run the daemon's
    boot script."""
    from .adapter import build_kubernetes_provider

    script = context.require_boot_script(NAME)
    return BuiltProviders((build_kubernetes_provider(settings, boot_script=script),))


KIND: ProviderKind[KubernetesSettings] = ProviderKind(
    name=NAME,
    settings=KubernetesSettings,
    build=build,
    # The official client: the "kubernetes" extra of pyproject.toml.
    sdk=Sdk("kubernetes", ("kubernetes.client",)),
    sdk_loggers=("kubernetes", "urllib3"),
    # A cluster bills nothing per pod; the prices are the operator's own, per hour,
    # so spotd counts by the second with no minimum.
    billing_step_seconds=1,
    billing_minimum_seconds=0,
    notice_seconds=NOTICE_SECONDS,
    boot=BootCarrier("Kubernetes pod command (bash -c)", POD_SCRIPT_BYTES),
    # No metadata service: an eviction or a drain reaches the job as the pod's SIGTERM.
    notice_watcher=None,
)
"""The descriptor of the ``kubernetes`` kind (entry point ``spotd.providers: kubernetes``)."""
