"""Why a job waits: the placement that found nothing, said in a sentence a person reads.

A pending or recovering job the policy does not place carries a waiting
reason (``jobs.waiting``, shown by ``spotd status``), written with an event
when it changes. It is built from what the policy excluded of the offerings
the job could use (:meth:`~spotd.core.values.Decision.near_misses`), grouped
by :class:`~spotd.core.values.ExclusionKind`, or, when the market has no
offering of the job's GPU models and node size at all, from the market's
index alone. The same groups summarise ``spotd plan``'s exclusions.

A reason has a gist and its text: the gist leaves out the figures that move
with the market (the cheapest plan's cost), so a price that drifts does not
write a new event every poll; the text, with them, is what was true when the
gist was first written. The figures always read ``(cheapest ...)``, so the
gist of a stored text is found again (:func:`gist_of`) after a restart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from spotd.core.spec import JobSpec, MarketMode
from spotd.core.values import (
    AttemptRecord,
    Candidate,
    Decision,
    ExclusionKind,
    Market,
    PlacementContext,
)
from spotd.engine.attempts import region_key
from spotd.market.cache import OfferingIndex

K = ExclusionKind

Cooling = Mapping[tuple[str, str, str], tuple[datetime, AttemptRecord, int]]
"""The regions cooling down, as :func:`spotd.engine.attempts.cooling_until` gives them."""


_FIGURES = re.compile(r" \(cheapest [^()]*\)")


@dataclass(frozen=True, slots=True)
class WaitingReason:
    """A waiting reason: ``gist`` decides whether it changed, ``text`` is what is shown."""

    gist: str
    text: str

    @classmethod
    def of(cls, gist: str, cheapest: str = "") -> WaitingReason:
        """The reason ``gist``, with the cheapest figure of now in brackets after it."""
        return cls(gist, f"{gist} (cheapest {cheapest})" if cheapest else gist)


def gist_of(text: str) -> str:
    """The gist of a reason's text: the text without its ``(cheapest ...)`` figures."""
    return _FIGURES.sub("", text)


@dataclass(frozen=True, slots=True)
class ExclusionGroup:
    """The candidates one kind of rule excluded: how many, and what they have in common."""

    kind: ExclusionKind
    count: int
    summary: str


def markets_of(spec: JobSpec) -> tuple[Market, ...]:
    """The markets ``market.type`` lets the job buy in."""
    mode = spec.market.type
    return tuple(m for m in Market if mode is MarketMode.AUTO or m.value == mode.value)


def unfit_type(spec: JobSpec, index: OfferingIndex) -> str | None:
    """Why no offering in ``index`` is of a type the job can use (GPU model, GPUs per
    node, market), or None when some is. Read off the index's buckets: no scan."""
    res = spec.resources
    markets = markets_of(spec)
    if any(index.bucket(g, res.gpus_per_node, m) for g in res.gpus for m in markets):
        return None
    gpus = "/".join(res.gpus)
    sizes: dict[int, set[Market]] = {}
    for gpu in res.gpus:
        for n, markets_sold in index.node_sizes(gpu).items():
            sizes.setdefault(n, set()).update(markets_sold)
    if not sizes:
        return f"no offering has {gpus} GPUs now"
    if res.gpus_per_node not in sizes:
        offered = ", ".join(str(n) for n in sizes)
        return f"no offering has {res.gpus_per_node} {gpus} GPUs per node (offered: {offered})"
    sold = ", ".join(sorted(str(m) for m in sizes[res.gpus_per_node]))
    wanted = " or ".join(str(m) for m in markets)
    return (f"no offering with {res.gpus_per_node} {gpus} GPUs per node is sold as {wanted} "
            f"(only {sold})")  # fmt: skip


def waiting_reason(
    ctx: PlacementContext,
    index: OfferingIndex,
    decision: Decision,
    *,
    cooling: Cooling,
    policy: str,
    spent: int = 0,
) -> WaitingReason:
    """Why the policy placed the job nowhere: the kinds of rule that excluded the most
    of the offerings it could use, most first (two at most), or why there are none.
    ``index`` is the whole market; ``spent`` counts the pools the policy was not shown
    (``retry.launch_failures_per_pool``)."""
    if not len(index):
        return WaitingReason.of("no offerings: no provider has answered a price poll with any")
    unfit = unfit_type(ctx.spec, index)
    if unfit is not None:
        return WaitingReason.of(unfit)
    groups = _by_kind(decision.near_misses())
    if not groups and spent:
        return WaitingReason.of(f"{_plural(spent, 'pool')} that fit failed too many launches "
                                "(retry.launch_failures_per_pool)")  # fmt: skip
    if not groups:
        # Something passes and yet the policy chose nothing: its own plan waits.
        return WaitingReason.of(f"the {policy} policy chooses to wait although offerings fit "
                                "(`spotd plan` says what it weighs)")  # fmt: skip
    ranked = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    parts = [_waiting_part(kind, found, ctx, cooling) for kind, found in ranked[:2]]
    more = len(ranked) - 2
    tail = [f"and {more} other kind(s) of reason (`spotd plan`)"] if more > 0 else []
    return WaitingReason("; ".join([*(p.gist for p in parts), *tail]),
                         "; ".join([*(p.text for p in parts), *tail]))  # fmt: skip


def submit_warning(ctx: PlacementContext, index: OfferingIndex, decision: Decision) -> str | None:
    """Why the market can never run the job, whatever the prices and capacity (only rules
    for what the offerings and the job are, :attr:`ExclusionKind.static`), or None."""
    if not len(index) or decision.choice is not None:
        return None
    unfit = unfit_type(ctx.spec, index)
    if unfit is not None:
        return unfit
    near = decision.near_misses()
    if not near or not all(c.excluded is not None and c.excluded.kind.static for c in near):
        return None
    return waiting_reason(ctx, index, decision, cooling={}, policy="").text


def exclusion_groups(
    excluded: Iterable[Candidate], ctx: PlacementContext, *, cooling: Cooling
) -> list[ExclusionGroup]:
    """The excluded candidates by the kind of rule, most first, each with one summary of
    what its candidates have in common (``spotd plan``)."""
    groups = _by_kind(excluded)
    ranked = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    return [
        ExclusionGroup(kind, len(found), _summary(kind, found, ctx, cooling))
        for kind, found in ranked
    ]


def _by_kind(candidates: Iterable[Candidate]) -> dict[ExclusionKind, list[Candidate]]:
    groups: dict[ExclusionKind, list[Candidate]] = {}
    for c in candidates:
        if c.excluded is not None:
            groups.setdefault(c.excluded.kind, []).append(c)
    return groups


def _pools(found: Sequence[Candidate]) -> int:
    return len({c.offering.pool for c in found})


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _budget(ctx: PlacementContext) -> str:
    budget = ctx.spec.budget
    assert budget is not None  # an over-budget exclusion needs one
    if ctx.spent_usd > 0:
        left = budget.max_usd - ctx.spent_usd
        return f"the {left:,.2f} USD left of its {budget.max_usd:,.2f} USD budget"
    return f"the {budget.max_usd:,.2f} USD budget"


def _cooling(found: Sequence[Candidate], cooling: Cooling) -> tuple[str, str]:
    """When the first of these pools comes back (``%H:%M UTC``), and after what."""
    ends = [cooling[k] for k in {region_key(c.offering.pool) for c in found} if k in cooling]
    if not ends:
        return "", ""
    first = min(until for until, _, _ in ends)
    after = ", ".join(sorted({str(last.end_reason) for _, last, _ in ends}))
    return f"until {first:%H:%M} UTC", f"after {after}"


def _waiting_part(
    kind: ExclusionKind, found: Sequence[Candidate], ctx: PlacementContext, cooling: Cooling
) -> WaitingReason:
    """One kind's share of a waiting reason: as if it were the only one."""
    pools = _pools(found)
    spec = ctx.spec
    if kind is K.OVER_BUDGET:
        cheapest = f"{min(c.expected_cost_usd for c in found):,.2f} USD"
        return WaitingReason.of(f"every plan costs more than {_budget(ctx)}", cheapest)
    if kind is K.NO_CAPACITY:
        return WaitingReason.of(f"no spot capacity in the {_plural(pools, 'pool')} that fit")
    if kind is K.COOLING_DOWN:
        until, after = _cooling(found, cooling)
        words = " ".join(w for w in ("cooling down", until, after) if w)
        return WaitingReason.of(f"{_plural(pools, 'pool')} that fit {words}")
    if kind is K.PRICE_CAP:
        cap = spec.market.max_price_per_gpu_hour
        over = f"every offering that fits is over the {cap:g} USD/GPU-hour price cap"
        return WaitingReason.of(over, f"{_cheapest_per_gpu(found):.3f} USD/GPU-hour")
    summary = _summary(kind, found, ctx, cooling)
    return WaitingReason.of(f"every offering that fits is ruled out: {summary}")


def _cheapest_per_gpu(found: Sequence[Candidate]) -> float:
    return min((c.offering.price(c.market) or 0.0) / c.offering.gpus_per_node for c in found)


def _summary(
    kind: ExclusionKind, found: Sequence[Candidate], ctx: PlacementContext, cooling: Cooling
) -> str:
    """What the candidates one kind of rule excluded have in common, with its figures."""
    spec = ctx.spec
    pools = _pools(found)
    if kind is K.GPU_MODEL:
        models = ", ".join(sorted({c.offering.gpu for c in found}))
        return f"GPU {models}; the job takes {' or '.join(spec.resources.gpus)}"
    if kind is K.GPUS_PER_NODE:
        sizes = ", ".join(str(n) for n in sorted({c.offering.gpus_per_node for c in found}))
        return f"{sizes} GPUs per node; the job needs {spec.resources.gpus_per_node}"
    if kind is K.FABRIC:
        fastest = max(c.offering.interconnect.gbps_per_gpu for c in found)
        return (f"scale-out fabric too slow for a {spec.resources.nodes}-node job "
                f"(fastest of them {fastest:g} Gbps/GPU)")  # fmt: skip
    if kind is K.PROVIDER:
        names = ", ".join(sorted({c.offering.pool.provider for c in found}))
        return f"provider {names} not in market.providers"
    if kind is K.REGION:
        regions = {c.offering.pool.region for c in found}
        return f"{_plural(len(regions), 'region')} not in market.regions"
    if kind is K.NOT_SOLD:
        return f"not sold as {', '.join(sorted({str(c.market) for c in found}))}"
    if kind is K.PRICE_CAP:
        cap = spec.market.max_price_per_gpu_hour
        return f"over the {cap:g} USD/GPU-hour cap (cheapest {_cheapest_per_gpu(found):.3f})"
    if kind is K.NO_CAPACITY:
        return f"no spot capacity now in {_plural(pools, 'pool')}"
    if kind is K.COOLING_DOWN:
        until, after = _cooling(found, cooling)
        words = " ".join(w for w in (until, after) if w)
        return f"{_plural(pools, 'pool')} cooling down {words}".rstrip()
    cheapest = min(c.expected_cost_usd for c in found)
    return f"over {_budget(ctx)} (cheapest {cheapest:,.2f} USD)"
