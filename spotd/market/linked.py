"""Prices of offerings that run on another provider's machines.

A provider may run on machines another provider sells (a Kubernetes node pool of a
cloud's VMs) with no price of its own for them. It then marks its offering with a
:class:`~spotd.core.values.PriceLink` naming that provider, region, zone and
instance type, and this step prices the linked markets as that provider sells the
same machine now: the offering in the same zone, else the dearest in the region (a
zone price the daemon does not see is never taken as cheaper than it may be), scaled
to the offering's GPUs per node. A spot market the source does not sell spot takes
its on-demand price. An offering whose source no enabled provider lists keeps its
own (default) price and is reported as unmatched.

Cloud-neutral and pure: offerings in, offerings out. It runs when the market
cache's snapshots change, never per job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from spotd.core.values import Market, Offering, PriceLink


@dataclass(frozen=True, slots=True)
class Linked:
    """Every provider's offerings with linked prices filled in."""

    offerings: Mapping[str, tuple[Offering, ...]]
    """Provider name -> its offerings, linked ones priced from their source."""
    unmatched: tuple[Offering, ...] = ()
    """Linked offerings no enabled provider lists the source of: their own price stands."""


def price_links(by_provider: Mapping[str, Sequence[Offering]]) -> Linked:
    """``by_provider`` with every linked offering priced from its source's offering."""
    linked = {name: [o for o in offered if o.price_link is not None]
              for name, offered in by_provider.items()}  # fmt: skip
    linked = {name: found for name, found in linked.items() if found}
    if not linked:
        return Linked({name: tuple(offered) for name, offered in by_provider.items()})
    wanted = {o.price_link.source.provider for found in linked.values() for o in found
              if o.price_link is not None}  # fmt: skip
    sources = _sources(by_provider, wanted)
    priced: dict[str, tuple[Offering, ...]] = {}
    unmatched: list[Offering] = []
    for name, offered in by_provider.items():
        if name not in linked:
            priced[name] = tuple(offered)
            continue
        out = []
        for offering in offered:
            link = offering.price_link
            if link is None:
                out.append(offering)
                continue
            found = _candidates(sources, link)
            if not found:
                unmatched.append(offering)
            out.append(_priced(offering, link, found) if found else offering)
        priced[name] = tuple(out)
    return Linked(priced, tuple(unmatched))


_Key = tuple[str, str, str]


def _sources(
    by_provider: Mapping[str, Sequence[Offering]], wanted: set[str]
) -> dict[_Key, list[Offering]]:
    """The offerings of the providers links name, by (provider, region, instance type)."""
    index: dict[_Key, list[Offering]] = {}
    for name in wanted:
        for o in by_provider.get(name, ()):
            if o.price_link is None:  # a linked offering is no price to copy
                index.setdefault((name, o.pool.region, o.pool.instance_type), []).append(o)
    return index


def _candidates(sources: dict[_Key, list[Offering]], link: PriceLink) -> list[Offering]:
    src = link.source
    found = sources.get((src.provider, src.region, src.instance_type), [])
    return [o for o in found if o.pool.zone == src.zone] or found


def _priced(offering: Offering, link: PriceLink, found: list[Offering]) -> Offering:
    prices: dict[Market, float | None] = {
        Market.SPOT: offering.spot_price, Market.ON_DEMAND: offering.on_demand_price,
    }  # fmt: skip
    for market in link.markets:
        if prices[market] is None:
            continue  # the offering does not sell this market: nothing to price
        per_node = [p for o in found if (p := _per_gpu(o, market)) is not None]
        if per_node:
            prices[market] = max(per_node) * offering.gpus_per_node
    return replace(offering, spot_price=prices[Market.SPOT],
                   on_demand_price=prices[Market.ON_DEMAND])  # fmt: skip


def _per_gpu(source: Offering, market: Market) -> float | None:
    price = source.price(market)
    if price is None and market is Market.SPOT:
        price = source.on_demand_price
    if price is None or source.gpus_per_node < 1:
        return None
    return price / source.gpus_per_node
