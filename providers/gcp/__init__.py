"""The GCP adapter: Compute Engine Spot VMs, priced from the Cloud Billing Catalog.

See ``docs/providers-gcp.md`` for the APIs called, IAM permissions and settings.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .settings import GcpSettings

if TYPE_CHECKING:
    from .adapter import GcpProvider, build_gcp_provider
    from .clients import GcpClients
    from .errors import map_gcp_errors

# The SDK is an extra: importing the settings must not need it, so the
# adapter and its SDK load on first use of a name below.
_LAZY = {
    "GcpProvider": ".adapter",
    "build_gcp_provider": ".adapter",
    "GcpClients": ".clients",
    "map_gcp_errors": ".errors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)


__all__ = ["GcpClients", "GcpProvider", "GcpSettings", "build_gcp_provider", "map_gcp_errors"]
