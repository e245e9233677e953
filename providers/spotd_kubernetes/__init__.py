"""The Kubernetes adapter: a cluster's GPU node pools, one pod per node of an attempt.

See ``docs/providers-kubernetes.md`` for the labels read, the RBAC and the settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.lazy import lazy_exports

from .kind import KIND
from .settings import KubernetesPool, KubernetesSettings

if TYPE_CHECKING:
    from .adapter import KubernetesProvider, build_kubernetes_provider
    from .errors import map_kubernetes_errors

# The client is an extra: importing the settings must not need it, so the adapter
# and its SDK load on first use of a name below.
_LAZY = {
    "KubernetesProvider": ".adapter",
    "build_kubernetes_provider": ".adapter",
    "map_kubernetes_errors": ".errors",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "KIND",
    "KubernetesPool",
    "KubernetesProvider",
    "KubernetesSettings",
    "build_kubernetes_provider",
    "map_kubernetes_errors",
]
