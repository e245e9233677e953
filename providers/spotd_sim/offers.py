"""What the simulated providers sell and how they take a launch request.

One source for both: :class:`~spotd_sim.provider.SimProvider` (nodes as
processes) and :class:`~spotd_sim.inprocess.InProcessSimProvider` (nodes as
workloads on a test's clock). For one market and one moment they offer the
same pools at the same prices, refuse the same requests and end spot nodes
with the same lifetimes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from spotd.core.errors import CapacityError, ProviderError
from spotd.core.values import CheckOutcome, CloudCheck, LaunchRequest, Market, Offering, Pool

from .catalog import CatalogEntry
from .market import SimMarket


def offering(entry: CatalogEntry, market: SimMarket, now: datetime) -> Offering:
    """The pool of ``entry`` as offered at ``now``: its prices and capacity signal."""
    shape = entry.shape
    return Offering(
        pool=entry.pool,
        gpu=shape.gpu,
        gpus_per_node=shape.gpus_per_node,
        gpu_memory_gb=shape.gpu_memory_gb,
        interconnect=shape.interconnect,
        spot_price=market.spot_price(entry.pool, entry.base_spot_price, now),
        on_demand_price=entry.on_demand_price,
        capacity=market.capacity_signal(entry.pool, now),
        notice_seconds=entry.notice_seconds,
    )


def launch_price(entry: CatalogEntry, market: SimMarket, kind: Market, at: datetime) -> float:
    """USD per node-hour of a node launched at ``at``: fixed for its life."""
    if kind is Market.ON_DEMAND:
        return entry.on_demand_price
    return market.spot_price(entry.pool, entry.base_spot_price, at)


def checked_entry(
    provider: str, entries: Mapping[Pool, CatalogEntry], request: LaunchRequest
) -> CatalogEntry:
    """The catalog entry ``request`` launches in; ProviderError for a request no
    simulated provider would take (unknown pool, no node, no command)."""
    entry = entries.get(request.offering.pool)
    if entry is None:
        raise invalid(provider, f"no pool {request.offering.pool}")
    if request.nodes < 1:
        raise invalid(provider, f"nodes must be at least 1, got {request.nodes}")
    if not request.command:
        raise invalid(provider, "the command is empty")
    return entry


def invalid(provider: str, problem: str) -> ProviderError:
    """The error of a request the provider refuses as it stands."""
    return ProviderError(f"{provider}: {problem}", provider=provider, code="InvalidParameter")


def check_capacity(provider: str, market: SimMarket, request: LaunchRequest, now: datetime) -> None:
    """CapacityError when a spot request asks for more nodes than its pool has now."""
    pool = request.offering.pool
    if request.market is Market.SPOT and not market.available(pool, now, request.nodes):
        raise CapacityError(
            f"{provider}: no spot capacity for {request.nodes} node(s) in {pool}",
            provider=provider, code="InsufficientCapacity",
        )  # fmt: skip


def taken_back_at(
    market: SimMarket,
    request: LaunchRequest,
    launched_at: datetime,
    launches_before: Callable[[], int],
) -> datetime | None:
    """When a spot launch ends by the market's hand on a market with lifetimes: its
    pool's n-th lifetime after ``launched_at``, n being ``launches_before()`` (the
    pool's spot launches before this one; a retry of a launch counts as that launch),
    so every node of it goes together. None: when its pool runs short."""
    pool = request.offering.pool
    if request.market is not Market.SPOT or not market.config.lifetimes:
        return None
    if market.config.trace_for(pool) is not None:
        return None  # a trace says when the pool runs short
    return launched_at + market.lifetime(pool, launches_before())


def market_check(
    provider: str,
    entries: Mapping[Pool, CatalogEntry],
    market: SimMarket,
    now: datetime,
    request: LaunchRequest | None,
    *,
    nodes_are: str,
) -> CloudCheck:
    """What ``spotd check-cloud`` shows for a simulated market: no account is needed,
    so only the request itself is checked (pool, nodes, capacity now). ``nodes_are``
    says what a launch starts, in the plural (``node process(es)``)."""
    pools = f"{len(entries)} simulated pools, no account or permission needed"
    outcomes = [CheckOutcome("market", True, pools)]
    if request is None:
        return CloudCheck(provider, tuple(outcomes))
    try:
        checked_entry(provider, entries, request)
        check_capacity(provider, market, request, now)
    except ProviderError as exc:
        outcomes.append(CheckOutcome("launch request", False, str(exc)))
        return CloudCheck(provider, tuple(outcomes))
    pool = request.offering.pool
    what = f"{request.nodes} x {pool.instance_type} {request.market} in {pool.zone}"
    outcomes.append(CheckOutcome("launch request", True, what))
    nodes = f"{request.nodes} {nodes_are} of {pool.instance_type} in {pool.zone}"
    return CloudCheck(provider, tuple(outcomes), (f"{nodes}, each on its own address",))
