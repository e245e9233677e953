"""The simulated market as a provider kind: ``sim-aws``, ``sim-gcp`` and ``sim-azure``.

Each simulated provider mirrors a cloud (:data:`.catalog.MIRRORS`): its
billing, egress, notice and instance types are that cloud kind's. What is
the simulator's own: prices fixed per instance at launch, a clock of its own
that may run faster than real time, prices polled at every reconcile pass,
and a notice read from the node's status file instead of a metadata service.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from spotd.core.contracts import BuiltProviders, ProviderContext
from spotd.core.kinds import ProviderKind

from .catalog import MIRRORS, PROVIDERS
from .settings import SimSettings

if TYPE_CHECKING:
    from spotd.core.contracts import Clock, NoticeWatcher, WatcherSettings

NAME = "sim"


def build(settings: SimSettings, context: ProviderContext) -> BuiltProviders:
    """The three simulated providers on one market, sharing the clock they bring."""
    from .factory import build_sim_providers

    sims = build_sim_providers(
        context.state_dir,
        seed=settings.seed,
        speed=settings.speed,
        mean_up_hours=settings.mean_up_hours,
        mean_down_hours=settings.mean_down_hours,
        lifetimes=settings.lifetimes,
        boot_seconds=settings.boot_seconds,
        traces=settings.traces,
        sim_epoch=settings.epoch,
        wall=context.wall,
    )
    return BuiltProviders(tuple(sims), clock=sims[0].clock)


def open_clock(state_dir: Path) -> Clock | None:
    """The simulated clock saved in ``state_dir``, once the market has started."""
    from .clock import CLOCK_FILE, SimClock

    if not (state_dir / CLOCK_FILE).is_file():
        return None
    return SimClock.open(state_dir)


def notice_watcher(config: WatcherSettings) -> NoticeWatcher:
    """The simulated node's "metadata service": its status file."""
    from .notice import SimNoticeWatcher

    return SimNoticeWatcher(config.sim_state, poll_interval=config.poll_interval)


def _speed(settings: SimSettings) -> float:
    return settings.speed


KIND: ProviderKind[SimSettings] = ProviderKind(
    name=NAME,
    settings=SimSettings,
    build=build,
    provider_names=PROVIDERS,
    mirrors=MIRRORS,
    prices_fixed_at_launch=True,
    # The market moves with the simulated clock: poll it at every reconcile pass.
    price_poll_seconds=0.0,
    nodes_have_gpus=False,
    # Every node is on the host's loopback: a new node reaches the kept ones.
    replaces_gang_nodes=True,
    agent_poll_seconds=0.1,
    notice_watcher=notice_watcher,
    clock_speed=_speed,
    open_clock=open_clock,
)
"""The descriptor of the ``sim`` kind (entry point ``spotd.providers: sim``)."""
