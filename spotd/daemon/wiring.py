"""Builds the daemon's parts from its settings: store, clock, providers, policy, engine."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, tzinfo
from typing import TYPE_CHECKING

from spotd.core.clock import DatabaseClock, WallClock, clock_note
from spotd.core.contracts import Clock, Provider, ProviderContext
from spotd.core.errors import ConfigError
from spotd.core.kinds import AnyKind
from spotd.daemon.config import Settings
from spotd.daemon.reader import Planner, Reader
from spotd.daemon.tokens import ensure_token
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.engine.teams import TeamLimits
from spotd.registry import kind_names, load_policy, require_sdk, sdk_missing
from spotd.store import open_store
from spotd.store.coordination import Coordinator

if TYPE_CHECKING:
    from pydantic import BaseModel

    from spotd.core.values import LaunchRequest
    from spotd.daemon.bootstrap import BootKind
    from spotd.mail import Mailer


def build_providers(
    settings: Settings, *, wall: Callable[[], float] | None = None
) -> tuple[Clock, dict[str, Provider]]:
    """The providers of every enabled kind, and the clock they share.

    A kind may bring its own clock (the simulated market's, which may run
    faster than real time); it can share a daemon with other kinds only at
    real speed, and only one kind may bring one. ``wall`` is the reference
    for real time such a clock runs on (default: this host's clock).
    """
    enabled = check_kinds(settings)
    script = _boot_scripts(settings, [kind for kind, _ in enabled if kind.boot is not None])
    clock: Clock | None = None
    providers: dict[str, Provider] = {}
    for kind, table in enabled:
        context = ProviderContext(
            state_dir=settings.state_dir(kind.name),
            boot_script=script(kind.name) if kind.boot is not None else None,
            wall=wall,
        )
        try:
            built = kind.build(table, context)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing.partition(".")[0] in ("spotd", kind.build.__module__.partition(".")[0]):
                raise  # a module of ours gone missing is a bug, not an SDK to install
            # A module the kind's sdk does not list: the same one line, not a traceback.
            raise sdk_missing(kind, missing) from exc
        except ValueError as exc:
            # A clock speed other than the one the state dir was created with, say.
            raise ConfigError(f"[providers.{kind.name}]: {exc}") from exc
        clock = clock or built.clock
        for provider in built.providers:
            if provider.name in providers:
                raise ConfigError(f"two enabled kinds build a provider named {provider.name!r}")
            providers[provider.name] = provider
    return clock or WallClock(), providers


def check_kinds(settings: Settings) -> list[tuple[AnyKind, BaseModel]]:
    """The enabled provider kinds with their tables, once they can make one daemon:
    at least one, each with its SDK installed, their clocks able to be one. Builds
    nothing (``spotd config check`` asks it too); :class:`ConfigError` otherwise."""
    enabled = settings.providers.enabled_kinds()
    if not enabled:
        tables = ", ".join(f"[providers.{name}]" for name in kind_names())
        raise ConfigError(f"no provider is enabled: enable one of {tables}")
    for kind, _ in enabled:
        require_sdk(kind)  # before any other complaint: nothing else helps without it
    _check_clocks(enabled)
    return enabled


def _check_clocks(enabled: list[tuple[AnyKind, BaseModel]]) -> None:
    """Refuse kinds whose clocks cannot be one: two of their own, or one off real time
    beside others. Checked before anything is built, so no state dir takes a wrong speed."""
    own = [(kind, kind.clock_speed(table)) for kind, table in enabled if kind.clock_speed]
    if len(own) > 1:
        names = ", ".join(f"[providers.{kind.name}]" for kind, _ in own)
        raise ConfigError(f"{names} each bring a clock of their own: enable only one of them")
    others = [kind.name for kind, _ in enabled if kind.clock_speed is None]
    for kind, speed in own:
        if others and speed != 1:
            raise ConfigError(
                f"[providers.{kind.name}] speed {speed:g} cannot share a daemon with real "
                f"clouds ({', '.join(others)}): set speed = 1 or disable it"
            )


def records_clock(settings: Settings) -> Clock:
    """The clock the daemon's records are on, for commands that read them beside it
    (``spotd report``): an enabled kind's own once it has started (the simulated
    market's), else the wall's."""
    for kind, _ in settings.providers.enabled_kinds():
        if kind.open_clock is None:
            continue
        try:
            clock = kind.open_clock(settings.state_dir(kind.name))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"[providers.{kind.name}]: {exc}") from exc
        if clock is not None:
            return clock
    return WallClock()


def _boot_scripts(
    settings: Settings, booted: list[AnyKind]
) -> Callable[[BootKind], Callable[[LaunchRequest], str]]:
    """``kind -> (request -> boot script)`` for the kinds whose nodes the daemon boots."""
    if not booted:
        return _no_boot_script
    agent = settings.agent
    if not agent.daemon_url:
        raise ConfigError(
            "[agent] daemon_url is needed when a cloud is enabled "
            f"({', '.join(kind.name for kind in booted)}): the agents on the nodes report to it"
        )
    from spotd.daemon.bootstrap import bootstrap_for

    token = ensure_token(settings.token_file)

    def script(kind: BootKind) -> Callable[[LaunchRequest], str]:
        return bootstrap_for(
            kind,
            daemon_url=agent.daemon_url or "",
            daemon_token=token,
            install=agent.install,
            python=agent.python,
            registry_login=agent.registry_login,
        )

    return script


def _no_boot_script(kind: BootKind) -> Callable[[LaunchRequest], str]:
    raise ConfigError(f"[providers.{kind}] has no boot-script carrier")


def build_engine(settings: Settings) -> Engine:
    """An engine wired as the settings say."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(settings.db_url)
    shared: DatabaseClock | None = None
    if store.engine.dialect.name == "postgresql":
        # Several daemons may share this database: keep time by the server's
        # clock, and run a kind's own clock (the simulated market's) on it too.
        shared = DatabaseClock(Coordinator(store.engine).database_time)
    clock, providers = build_providers(
        settings, wall=None if shared is None else lambda: shared.now().timestamp()
    )
    if isinstance(clock, WallClock) and shared is not None:
        clock = shared
    engine_settings = EngineSettings(
        owner=settings.daemon.owner,
        lease_seconds=settings.daemon.lease_seconds,
        cooldown_hours=settings.scheduling.cooldown_hours,
        no_capacity_timeout_hours=settings.scheduling.no_capacity_timeout_hours,
        checkpoints_dir=settings.checkpoints_dir,
        changeover_hours=settings.scheduling.changeover_hours,
        replan_seconds=settings.scheduling.replan_seconds,
        price_history_seconds=settings.scheduling.price_history_seconds,
        forecast_over_budget=settings.scheduling.forecast_over_budget,
        teams={
            n: TeamLimits(t.max_running_jobs, t.monthly_budget_usd)
            for n, t in settings.teams.items()
        },
    )
    return Engine(store, providers, load_policy(settings.scheduling.policy), clock, engine_settings)


def build_reader(
    engine: Engine, policy_name: str | None = None, *, zone: tzinfo = UTC, can_email: bool = False
) -> Reader:
    """The read model beside ``engine``: the parts it shares with the loop (store, polled
    market, clock, settings, providers; each safe to read from another thread), a
    :class:`~spotd.daemon.reader.Planner` with a policy instance of its own
    (``policy_name``, the engine's by default), the ``zone`` times are shown in, and
    whether the daemon sends email (``can_email``: its submits warn of email asked in
    vain)."""
    policy = load_policy(policy_name or engine.policy.name)
    planner = Planner(policy, engine.store, engine.market, engine.clock, engine.settings)
    return Reader(engine.store, engine.market, engine.clock, engine.settings,
                  engine.providers, planner, zone, can_email)  # fmt: skip


def build_mailer_for(settings: Settings, engine: Engine) -> Mailer | None:
    """The mailer of the ``[email]`` table (None when no SMTP host is set)."""
    if not settings.email.enabled:
        return None
    from functools import partial

    from spotd.billing import charts, reports
    from spotd.mail import ReportKit, build_mailer

    kit = ReportKit(
        partial(reports.build_report, engine.store, zone=settings.display.timezone,
                clock_note=clock_note(engine.clock), clock=engine.clock),
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
        zone=settings.display.zone,
    )
