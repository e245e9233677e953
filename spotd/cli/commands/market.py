"""The commands on the market and the clouds: ``prices`` and ``check-cloud``."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from spotd.cli.commands.options import ConfigOpt, JsonOpt, settings_of
from spotd.cli.errors import guard
from spotd.cli.render.console import out
from spotd.cli.render.market import check_json, print_check, print_market
from spotd.cli.render.progress import working
from spotd.core.clock import WALL
from spotd.core.spec_io import load_job_file
from spotd.daemon.config import Settings

if TYPE_CHECKING:
    from spotd.core.contracts import Clock
    from spotd.core.values import CloudCheck
    from spotd.daemon.views import MarketView


def _market(settings: Settings, wall: Clock = WALL) -> tuple[MarketView, str]:
    """The daemon's view of the market, or a direct poll (its ages by ``wall``) when no
    daemon answers."""
    from spotd.cli.client import Client
    from spotd.core.errors import ApiError

    try:
        return Client.from_settings(settings, clock=wall).prices(), "daemon"
    except ApiError:
        from spotd.daemon.views import market_view
        from spotd.daemon.wiring import build_providers
        from spotd.market.cache import MarketCache

        _, providers = build_providers(settings)
        cache = MarketCache(providers, clock=wall)
        # The cache's warning of a failed poll is the daemon's log line; here each
        # failed provider gets a line of its own under the table.
        cache_log = logging.getLogger(MarketCache.__module__)
        level = cache_log.level
        cache_log.setLevel(logging.ERROR)
        try:
            with working(f"no daemon answered: polling {len(providers)} provider(s)"):
                cache.refresh_all()
        finally:
            cache_log.setLevel(level)
        view = market_view(cache.snapshots(), wall.now().timestamp())
        return view, "direct poll (no daemon running)"


def _filter_offerings(
    view: MarketView, gpu: str | None, provider: str | None, region: str | None
) -> MarketView:
    from fnmatch import fnmatchcase

    offerings = [
        o for o in view.offerings
        if (gpu is None or o.gpu.upper() == gpu.upper())
        and (provider is None or fnmatchcase(o.provider, provider))
        and (region is None or fnmatchcase(o.region, region))
    ]
    offerings.sort(key=lambda o: (o.gpu, o.gpus_per_node, o.spot_price or o.on_demand_price or 0))
    return view.model_copy(update={"offerings": offerings})


def prices(
    gpu: Annotated[str | None, typer.Option(help="Only this GPU model, e.g. H100.")] = None,
    provider: Annotated[str | None, typer.Option(help="Provider name or glob.")] = None,
    region: Annotated[str | None, typer.Option(help="Region glob, e.g. 'us-*'.")] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the current market: offerings, both prices, fabric, and how fresh the data is."""
    view, source = guard(lambda: _market(settings_of(config)))
    failed = [p for p in view.providers if p.error is not None and not p.offerings]
    # Nothing to show because every poll failed is an error, not an empty market.
    code = 1 if failed and len(failed) == len(view.providers) else 0
    view = _filter_offerings(view, gpu, provider, region)
    if as_json:
        out.print_json(view.model_dump_json())
        raise typer.Exit(code)
    print_market(view, source)
    raise typer.Exit(code)


def check_cloud(
    job: Annotated[
        Path | None,
        typer.Argument(help="A job.toml whose launch request to check too.", show_default=False),
    ] = None,
    provider: Annotated[
        str | None, typer.Option(help="Only this provider (name or glob).", show_default=False)
    ] = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check, launching nothing billable, that a real launch would work.

    Per enabled provider: credentials, permissions, quotas and, with a job file,
    the very request the daemon would send for it (AWS's DryRun; GCP and Azure
    by read-only calls), and what spotd would create. Exits 1 if a check failed.
    """
    from spotd.daemon.cloudcheck import check_clouds

    def run() -> list[CloudCheck]:
        spec = load_job_file(job) if job is not None else None
        return check_clouds(settings_of(config), spec, provider)

    with working("checking credentials, permissions and quotas"):
        checks = guard(run)
    if as_json:
        sys.stdout.write(json.dumps([check_json(c) for c in checks], indent=2) + "\n")
    else:
        for check in checks:
            print_check(check)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)
