"""The simulated spot market: spotd's embedded default provider.

Three providers (``sim-aws``, ``sim-gcp``, ``sim-azure``) with real instance
type names, on a seeded or trace-driven spot market running on a shared
simulated clock. Instances are real local processes that outlive the daemon.
"""

from __future__ import annotations

from .catalog import PROVIDERS, SIM_AWS, SIM_AZURE, SIM_GCP, CatalogEntry
from .clock import SimClock
from .factory import build_sim_providers
from .kind import KIND
from .market import MarketConfig, SimMarket
from .provider import SimProvider
from .settings import SimSettings
from .trace import Trace, TraceError, load_trace

__all__ = [
    "KIND",
    "PROVIDERS",
    "SIM_AWS",
    "SIM_AZURE",
    "SIM_GCP",
    "CatalogEntry",
    "MarketConfig",
    "SimClock",
    "SimMarket",
    "SimProvider",
    "SimSettings",
    "Trace",
    "TraceError",
    "build_sim_providers",
    "load_trace",
]
