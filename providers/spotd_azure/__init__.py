"""The Azure adapter: spot and on-demand GPU VMs through azure-mgmt-compute.

Prices come from the public Retail Prices API; credentials only from
``DefaultAzureCredential``. See ``docs/providers-azure.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.lazy import lazy_exports

from .kind import KIND
from .settings import AzureSettings, check_launchable

if TYPE_CHECKING:
    from .adapter import NOTICE_SECONDS, AzureProvider, CustomData, build_azure_provider
    from .errors import map_azure_errors
    from .prices import PricePair, RetailPrices, pick_prices

# The SDK is an extra: importing the settings must not need it, so the
# adapter and its SDK load on first use of a name below.
_LAZY = {
    "NOTICE_SECONDS": ".adapter",
    "AzureProvider": ".adapter",
    "CustomData": ".adapter",
    "build_azure_provider": ".adapter",
    "map_azure_errors": ".errors",
    "PricePair": ".prices",
    "RetailPrices": ".prices",
    "pick_prices": ".prices",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "KIND",
    "NOTICE_SECONDS",
    "AzureProvider",
    "AzureSettings",
    "CustomData",
    "PricePair",
    "RetailPrices",
    "build_azure_provider",
    "check_launchable",
    "map_azure_errors",
    "pick_prices",
]
