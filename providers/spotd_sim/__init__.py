"""The simulated spot market: spotd's embedded default provider.

Three providers (``sim-aws``, ``sim-gcp``, ``sim-azure``) with real instance
type names, on a seeded or trace-driven spot market running on a shared
simulated clock. Instances are real local processes that outlive the daemon;
for tests, :class:`InProcessSimProvider` sells the same market with nodes that
are workloads moved on by a clock the test controls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotd.core.lazy import lazy_exports

from .catalog import PROVIDERS, SIM_AWS, SIM_AZURE, SIM_GCP, CatalogEntry
from .kind import KIND
from .settings import SimSettings

if TYPE_CHECKING:
    from .clock import SimClock
    from .factory import build_sim_providers
    from .inprocess import InProcessSimProvider, build_inprocess_providers
    from .market import MarketConfig, SimMarket
    from .provider import SimProvider
    from .trace import Trace, TraceError, load_trace
    from .workload import (
        ReportSink,
        TrainingPlan,
        TrainingWorkload,
        Workload,
        WorkloadExit,
        WorkloadFactory,
    )

# The daemon's config loads every kind's settings through this package; the
# provider, its VMs and the agent load only when a daemon builds the market,
# so a quick command (spotd status) does not pay for them.
_LAZY = {
    "SimClock": ".clock",
    "build_sim_providers": ".factory",
    "InProcessSimProvider": ".inprocess",
    "build_inprocess_providers": ".inprocess",
    "MarketConfig": ".market",
    "SimMarket": ".market",
    "SimProvider": ".provider",
    "Trace": ".trace",
    "TraceError": ".trace",
    "load_trace": ".trace",
    "ReportSink": ".workload",
    "TrainingPlan": ".workload",
    "TrainingWorkload": ".workload",
    "Workload": ".workload",
    "WorkloadExit": ".workload",
    "WorkloadFactory": ".workload",
}

__getattr__ = lazy_exports(__name__, _LAZY)

__all__ = [
    "KIND",
    "PROVIDERS",
    "SIM_AWS",
    "SIM_AZURE",
    "SIM_GCP",
    "CatalogEntry",
    "InProcessSimProvider",
    "MarketConfig",
    "ReportSink",
    "SimClock",
    "SimMarket",
    "SimProvider",
    "SimSettings",
    "Trace",
    "TraceError",
    "TrainingPlan",
    "TrainingWorkload",
    "Workload",
    "WorkloadExit",
    "WorkloadFactory",
    "build_inprocess_providers",
    "build_sim_providers",
    "load_trace",
]
