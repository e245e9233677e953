"""The kubernetes client, configured from the settings: a loopback endpoint (tests),
the pod's service account (in-cluster) or a kubeconfig context.

Retries are off (``retries = 0``): the engine retries by error class, so a refused
connection surfaces at once as ``ProviderUnavailable``.
"""

from __future__ import annotations

import os

from kubernetes import client, config

from .errors import map_kubernetes_errors
from .settings import KubernetesSettings


def build_api(settings: KubernetesSettings) -> client.CoreV1Api:
    """A CoreV1Api on the cluster the settings name; AuthError when its credentials
    cannot be loaded."""
    configuration = client.Configuration()
    if settings.api_endpoint is not None:
        configuration.host = settings.api_endpoint
    else:
        with map_kubernetes_errors("loading the cluster's credentials"):
            if _in_cluster(settings):
                config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration)
            else:
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=settings.kubeconfig or None,
                    context=settings.context or None,
                    client_configuration=configuration,
                )
    configuration.retries = 0
    return client.CoreV1Api(client.ApiClient(configuration))


def _in_cluster(settings: KubernetesSettings) -> bool:
    if settings.auth == "auto":
        return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    return settings.auth == "in-cluster"
