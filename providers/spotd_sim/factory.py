"""Building the three simulated providers on one shared market, clock and state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from spotd.core.clock import WALL

from .catalog import PROVIDERS
from .clock import SimClock
from .market import MarketConfig, SimMarket
from .provider import SimProvider

if TYPE_CHECKING:
    from spotd.core.contracts import Clock, Driller, Provider


def build_sim_providers(
    state_dir: Path,
    *,
    seed: int,
    speed: float,
    mean_up_hours: float,
    mean_down_hours: float,
    boot_seconds: float,
    lifetimes: bool = False,
    traces: Mapping[str, Path] | None = None,
    sim_epoch: datetime | None = None,
    wall: Callable[[], float] | None = None,
) -> list[SimProvider]:
    """``sim-aws``, ``sim-gcp`` and ``sim-azure`` sharing one market, clock and state dir.

    ``traces`` maps a pattern to a trace file: a pattern without ``/`` is a
    glob on the zone name (``us-east-1a``: every instance type in that zone),
    one with ``/`` a glob on ``provider/zone/instance_type``; the first
    matching pattern wins, and other pools follow the seeded model. A bad
    trace file raises :class:`~spotd_sim.trace.TraceError` here.
    ``lifetimes``: see :class:`MarketConfig`. ``sim_epoch`` only counts when
    ``state_dir`` has no clock yet. ``wall`` is the source of real time (POSIX
    seconds) the clock runs on (see :class:`SimClock`); None: this host's clock.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    clock = SimClock(state_dir, speed, sim_epoch=sim_epoch, wall=wall or _host_seconds)
    config = MarketConfig(
        seed=seed,
        mean_up_hours=mean_up_hours,
        mean_down_hours=mean_down_hours,
        traces=MarketConfig.trace_pairs(traces),
        lifetimes=lifetimes,
    )
    market = SimMarket(config, epoch=clock.sim_epoch)
    return [
        SimProvider(
            name, market=market, state_dir=state_dir, clock=clock, boot_seconds=boot_seconds
        )
        for name in PROVIDERS
    ]


def _host_seconds() -> float:
    """POSIX seconds by this host's clock."""
    return WALL.now().timestamp()


if TYPE_CHECKING:
    # mypy proves here that the simulator fits spotd's contracts.
    def _fits(provider: SimProvider, clock: SimClock) -> tuple[Provider, Driller, Clock]:
        return provider, provider, clock
