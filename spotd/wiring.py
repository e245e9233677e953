"""Builds the daemon's parts from its settings: store, clock, providers, policy, engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from spotd.clock import WallClock
from spotd.config import Settings
from spotd.contracts import Clock, Provider
from spotd.engine import Engine, EngineSettings
from spotd.errors import ConfigError
from spotd.registry import load_policy
from spotd.store import open_store
from spotd.tokens import ensure_token

if TYPE_CHECKING:
    from spotd.bootstrap import BootKind
    from spotd.domain import LaunchRequest
    from spotd.mail import Mailer


def build_providers(settings: Settings) -> tuple[Clock, dict[str, Provider]]:
    """The enabled providers and the clock they share.

    The simulated market brings its own clock, which may run faster than
    real time; it can share a daemon with real clouds only at speed 1.
    """
    clouds = build_clouds(settings)
    sim = settings.providers.sim
    if not sim.enabled:
        if not clouds:
            raise ConfigError("no provider is enabled: enable [providers.sim] or a cloud")
        return WallClock(), clouds
    if clouds and sim.speed != 1:
        raise ConfigError(
            f"[providers.sim] speed {sim.speed:g} cannot share a daemon with real clouds "
            f"({', '.join(clouds)}): set speed = 1 or disable the simulator"
        )
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
    return sims[0].clock, {**{p.name: p for p in sims}, **clouds}


def records_clock(settings: Settings) -> Clock:
    """The clock the daemon's records are on, for commands that read them beside it
    (``spotd report``): the simulated market's once it has started, else the wall's."""
    if settings.providers.sim.enabled:
        from spotd.providers.sim.clock import CLOCK_FILE, SimClock

        if (settings.sim_state_dir / CLOCK_FILE).is_file():
            try:
                return SimClock.open(settings.sim_state_dir)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"[providers.sim]: {exc}") from exc
    return WallClock()


def build_clouds(settings: Settings) -> dict[str, Provider]:
    """The enabled cloud adapters, each with the bootstrap that starts the agent on its nodes."""
    enabled = settings.providers.clouds_enabled
    if not enabled:
        return {}
    agent = settings.agent
    if not agent.daemon_url:
        raise ConfigError(
            "[agent] daemon_url is needed when a cloud is enabled: "
            "the agents on the nodes report to it"
        )
    from spotd.bootstrap import bootstrap_for

    token = ensure_token(settings.token_file)

    def script(kind: BootKind) -> Callable[[LaunchRequest], str]:
        return bootstrap_for(
            kind,
            daemon_url=agent.daemon_url or "",
            daemon_token=token,
            install=agent.install,
            python=agent.python,
        )

    providers: dict[str, Provider] = {}
    p = settings.providers
    if p.aws.enabled:
        from spotd.providers.aws import build_aws_provider

        providers["aws"] = build_aws_provider(p.aws, user_data=script("aws"))
    if p.gcp.enabled:
        from spotd.providers.gcp import build_gcp_provider

        providers["gcp"] = build_gcp_provider(p.gcp, startup_script=script("gcp"))
    if p.azure.enabled:
        from spotd.providers.azure import build_azure_provider

        providers["azure"] = build_azure_provider(p.azure, custom_data=script("azure"))
    return providers


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
        changeover_hours=settings.scheduling.changeover_hours,
        replan_seconds=settings.scheduling.replan_seconds,
        price_history_seconds=settings.scheduling.price_history_seconds,
    )
    return Engine(store, providers, load_policy(settings.scheduling.policy), clock, engine_settings)


def build_mailer_for(settings: Settings, engine: Engine) -> Mailer | None:
    """The mailer of the ``[email]`` table (None when no SMTP host is set)."""
    if not settings.email.enabled:
        return None
    from functools import partial

    from spotd import charts, reports
    from spotd.mail import ReportKit, build_mailer

    kit = ReportKit(
        partial(reports.build_report, engine.store),
        reports.render_text,
        reports.render_html,
        charts.render_charts,
    )
    return build_mailer(
        settings.email,
        settings.data_dir,
        store=engine.store,
        clock=engine.clock,
        claim=lambda key: engine.store.claim_notification(key, at=engine.clock.now()),
        reports=kit,
    )
