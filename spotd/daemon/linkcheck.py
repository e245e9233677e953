"""``spotd check-cloud``: are the offerings priced from another provider priced?

A provider that runs on another's machines (a Kubernetes node pool on a cloud's
VMs) links its offerings' prices to that provider (:class:`~spotd.core.values.PriceLink`).
Its check lists them (:attr:`~spotd.core.values.CloudCheck.linked`); this adds one
line per linked offering: the price it takes, or, plainly, that it keeps its own
(default) price because the daemon does not run that provider or the provider lists
no such machine there. Only the providers the links name are polled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from spotd.core.clock import WALL
from spotd.core.contracts import Clock, Provider
from spotd.core.values import CheckOutcome, CloudCheck, Market, Offering
from spotd.market.cache import MarketCache
from spotd.market.linked import price_links


def check_links(check: CloudCheck, providers: Mapping[str, Provider],
                clock: Clock = WALL) -> CloudCheck:  # fmt: skip
    """``check`` with one outcome per offering it lists as linked; ``providers`` are the
    daemon's enabled providers, by name."""
    if not check.linked:
        return check
    wanted = {o.price_link.source.provider for o in check.linked if o.price_link is not None}
    enabled = {name: providers[name] for name in sorted(wanted) if name in providers}
    market = MarketCache(enabled, clock=clock)
    market.refresh_all()
    sources = {name: market.snapshot(name) for name in enabled}
    priced = price_links({**{n: s.offerings for n, s in sources.items()},
                          check.provider: check.linked})  # fmt: skip
    unmatched = set(priced.unmatched)
    outcomes = []
    for linked, now in zip(check.linked, priced.offerings[check.provider], strict=True):
        error = sources[src].error if (src := _source(linked)) in sources else None
        outcomes.append(_outcome(linked, now, linked in unmatched, src in enabled, error))
    return replace(check, outcomes=(*check.outcomes, *outcomes))


def _source(offering: Offering) -> str:
    return offering.price_link.source.provider if offering.price_link is not None else ""


def _outcome(offering: Offering, priced: Offering, unmatched: bool, enabled: bool,
             error: str | None) -> CheckOutcome:  # fmt: skip
    assert offering.price_link is not None  # only linked offerings are checked
    src = offering.price_link.source
    name = f"price of {offering.pool}"
    machine = f"{src.instance_type} in {src.region}"
    if not unmatched:
        prices = ", ".join(f"{m}: {p:.2f} USD per node-hour" for m in sorted(Market)
                           if m in offering.price_link.markets
                           and (p := priced.price(m)) is not None)  # fmt: skip
        return CheckOutcome(name, True, f"as {src.provider} sells {machine} ({prices})")
    if not enabled:
        why = f"provider {src.provider} is not enabled in this daemon"
    elif error is not None:
        why = f"provider {src.provider}'s offerings could not be read ({error})"
    else:
        why = f"provider {src.provider} lists no {machine}"
    return CheckOutcome(name, False, f"its nodes are {src.provider}'s {machine}, but {why}: "
                        "it keeps its provider's own price (0 unless configured); enable "
                        f"{src.provider} or configure a price")  # fmt: skip
