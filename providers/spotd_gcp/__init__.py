"""The GCP adapter: Compute Engine Spot VMs, priced from the Cloud Billing Catalog.

See ``docs/providers-gcp.md`` for the APIs called, IAM permissions and settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.lazy import lazy_exports

from .kind import KIND
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


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "KIND",
    "GcpClients",
    "GcpProvider",
    "GcpSettings",
    "build_gcp_provider",
    "map_gcp_errors",
]
