"""``spotd check-cloud``: would a first real launch work? Asked without spending anything.

For each enabled provider (or the one named) the adapter checks credentials,
permissions and quotas with dry runs and read-only calls; with a job file, it
also checks the very launch request the daemon would send for the job there:
the offering the policy would choose on that provider, its node count, its
placement object and fabric interfaces, and whether nodes without a public
address can reach the daemon, the package index and the checkpoint store.
Nothing billable is created.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase

from spotd.core.clock import WALL
from spotd.core.contracts import Clock, CloudChecker, Provider
from spotd.core.egress import CHECKPOINT_URI_VAR
from spotd.core.errors import ConfigError
from spotd.core.fabric_env import fabric_environment
from spotd.core.spec import JobSpec
from spotd.core.values import CheckOutcome, CloudCheck, LaunchRequest
from spotd.daemon.config import Settings
from spotd.daemon.linkcheck import check_links
from spotd.daemon.wiring import build_providers
from spotd.engine.context import placement_context
from spotd.engine.launching import max_run_seconds
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB, TAG_OWNER
from spotd.engine.shipping import shipping_environment
from spotd.market.cache import MarketCache
from spotd.registry import load_policy

CHECK_JOB_ID = "j-check-cloud"
"""The job id the checked request carries (a real launch carries the job's)."""


def check_clouds(
    settings: Settings,
    spec: JobSpec | None = None,
    provider: str | None = None,
    clock: Clock = WALL,
) -> list[CloudCheck]:
    """The checks of every enabled provider matching ``provider`` (a name or glob);
    ``clock`` is the placement's "now"."""
    _, providers = build_providers(settings)
    chosen = {n: p for n, p in providers.items() if provider is None or fnmatchcase(n, provider)}
    if not chosen:
        enabled = ", ".join(sorted(providers)) or "none"
        raise ConfigError(f"no enabled provider matches {provider!r} (enabled: {enabled})")
    checks = check_providers(chosen, spec, settings, clock)
    # Offerings priced from another provider: is it enabled here, and does it list them?
    return [check_links(check, providers, clock) for check in checks]


def check_providers(
    providers: Mapping[str, Provider],
    spec: JobSpec | None,
    settings: Settings,
    clock: Clock = WALL,
) -> list[CloudCheck]:
    """The checks of these providers, by name, for a new job of ``spec`` if given."""
    return [_check_one(p, spec, settings, clock) for _, p in sorted(providers.items())]


def _check_one(
    provider: Provider, spec: JobSpec | None, settings: Settings, clock: Clock
) -> CloudCheck:
    if not isinstance(provider, CloudChecker):
        nothing = CheckOutcome("checks", True, "this provider has no checks to run")
        return CloudCheck(provider.name, (nothing,))
    if spec is None:
        return provider.check_cloud(None)
    request, problem = launch_request_for(provider, spec, settings, clock)
    checked = provider.check_cloud(request)
    if problem is None:
        return checked
    return CloudCheck(checked.provider, (*checked.outcomes, problem), checked.would_create)


def launch_request_for(
    provider: Provider, spec: JobSpec, settings: Settings, clock: Clock = WALL
) -> tuple[LaunchRequest | None, CheckOutcome | None]:
    """The request the daemon would send ``provider`` for a new job of ``spec``.

    The configured policy chooses among this provider's offerings only; when
    none fits, no request and a failed outcome saying why. ``clock`` is the
    placement's "now".
    """
    market = MarketCache({provider.name: provider}, clock=clock)
    market.refresh_all()
    snapshot = market.snapshot(provider.name)
    if snapshot.error is not None:
        return None, CheckOutcome("offerings", False, f"cannot read offerings: {snapshot.error}")
    here = spec.model_copy(
        update={"market": spec.market.model_copy(update={"providers": (provider.name,)})}
    )
    policy = load_policy(settings.scheduling.policy)
    offerings = market.offerings()
    ctx = placement_context(
        CHECK_JOB_ID, here, clock.now(), pools=(o.pool for o in offerings),
        cooldown_hours=settings.scheduling.cooldown_hours,
        changeover_hours=settings.scheduling.changeover_hours,
    )  # fmt: skip
    choice = policy.place(ctx, offerings).choice
    if choice is None:
        return None, CheckOutcome(
            "placement", False,
            f"no offering of {provider.name} fits the job (see `spotd plan` for why)",
        )  # fmt: skip
    offering = choice.offering
    env = fabric_environment(offering.interconnect, spec.fabric_env, nodes=choice.nodes,
                             instance_type=offering.pool.instance_type)  # fmt: skip
    env.update(spec.env)
    checkpoints = spec.checkpoint.uri or str(settings.checkpoints_dir / CHECK_JOB_ID)
    env.update(shipping_environment(spec, offering, checkpoints))
    env.update(SPOTD_JOB_ID=CHECK_JOB_ID, SPOTD_ATTEMPT="1", SPOTD_NUM_NODES=str(choice.nodes))
    # As a real launch says it: the egress checks ask which store the nodes must reach.
    env[CHECKPOINT_URI_VAR] = checkpoints
    request = LaunchRequest(
        offering=offering,
        market=choice.market,
        nodes=choice.nodes,
        client_token=f"{CHECK_JOB_ID}-1",
        tags={TAG_JOB: CHECK_JOB_ID, TAG_ATTEMPT: "1", TAG_OWNER: settings.daemon.owner},
        command=spec.command,
        env=env,
        workdir=None if spec.code is not None else spec.workdir,
        max_run_seconds=max_run_seconds(spec),
    )
    return request, None
