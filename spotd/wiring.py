"""Builds the daemon's parts from its settings: store, clock, providers, policy, engine."""

from __future__ import annotations

from spotd.config import Settings
from spotd.contracts import Clock, Provider
from spotd.engine import Engine, EngineSettings
from spotd.errors import ConfigError
from spotd.registry import load_policy
from spotd.store import open_store


def build_providers(settings: Settings) -> tuple[Clock, dict[str, Provider]]:
    """The enabled providers and the clock they share.

    The simulated market brings its own clock (it may run faster than real
    time), so it is the daemon's clock when it is enabled.
    """
    sim = settings.providers.sim
    if not sim.enabled:
        raise ConfigError("no provider is enabled: enable [providers.sim] (clouds come later)")
    from spotd.providers.sim import build_sim_providers

    try:
        sims = build_sim_providers(
            settings.sim_state_dir,
            seed=sim.seed,
            speed=sim.speed,
            mean_up_hours=sim.mean_up_hours,
            mean_down_hours=sim.mean_down_hours,
            boot_seconds=sim.boot_seconds,
            traces=sim.traces,
            sim_epoch=sim.epoch,
        )
    except ValueError as exc:
        # A clock speed other than the one the state dir was created with, say.
        raise ConfigError(f"[providers.sim]: {exc}") from exc
    return sims[0].clock, {p.name: p for p in sims}


def build_engine(settings: Settings) -> Engine:
    """An engine wired as the settings say."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(settings.db_url)
    clock, providers = build_providers(settings)
    engine_settings = EngineSettings(
        owner=settings.daemon.owner,
        lease_seconds=settings.daemon.lease_seconds,
        cooldown_hours=settings.scheduling.cooldown_hours,
        no_capacity_timeout_hours=settings.scheduling.no_capacity_timeout_hours,
        checkpoints_dir=settings.checkpoints_dir,
    )
    return Engine(store, providers, load_policy(settings.scheduling.policy), clock, engine_settings)
