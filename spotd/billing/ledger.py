"""The cost ledger: what every attempt of a job was billed, and what on-demand would have cost.

One :class:`LedgerEntry` per attempt, kind and UTC day. It is built from the
attempt rows and the price history alone (:func:`build_ledger` is pure), so
the ledger table can always be dropped and rebuilt.

Billing rule (the one the simulated provider's own meter uses too, see
``spotd_sim.billing``):

- Each node is billed from its launch to its end (an open attempt: to
  ``now``; the nodes a hold keeps after their attempt failed the job,
  ``keep_on_failure``: to their release, to ``now`` while it lasts), rounded up
  by the billing granularity and minimum of the
  provider's kind (``ProviderKind.billing_step_seconds`` and
  ``billing_minimum_seconds``; a simulated provider's: those of the kind it
  mirrors), per node.
- A node kept from one attempt to the next (a gang whose lost node was replaced,
  :mod:`spotd.engine.repair`) is billed once over its whole life, rounded up once;
  each attempt bills its share: up to the next attempt's start, from its own.
- The node's times are the provider's own when the caller passes them as
  :class:`NodeUsage` (a cloud's ``describe``, the simulator's state files);
  otherwise the attempt's ``started_at`` and ``ended_at`` (or ``released_at``). Passing them is
  what makes the ledger equal the provider's bill to the cent: the daemon
  sees a launch or an end only on its next pass.
- Price: a node whose price the provider fixed at launch (``NodeUsage``
  with a price, or any provider whose kind fixes prices at launch,
  ``ProviderKind.prices_fixed_at_launch``: the simulator) is billed at that price throughout; the
  simulator's price at launch is the attempt's price unless the hourly
  drift stepped between the poll and the launch, which is why the sim's
  usage carries its own price. Cloud nodes are billed at the prices in
  force while they ran: the pool's price history in the attempt's market,
  integrated piecewise, falling back to the attempt's
  ``price_per_node_hour`` before the first polled price.
- The time from launch to ``running_at`` (the whole life, if it never ran)
  is ``changeover``: paid, no progress. The rest, with the rounding up, is
  ``compute``.
- ``egress``: when an attempt resumes from a checkpoint in another region
  or provider than the last attempt that ran, the checkpoint
  (``spec.checkpoint.size_gb``) pays the source provider's internet egress
  (``ProviderKind.egress_usd_per_gb``) across providers, or its
  ``inter_region_usd_per_gb`` within one (:func:`spotd.market.catalog.transfer_usd_per_gb`).
- On-demand equivalent: the same billed node-seconds at the on-demand price
  of the same offering, except the changeovers after the job's first boot
  (an on-demand run boots once; recoveries are spot's overhead, so their
  on-demand equivalent is 0): the attempt's own price for an on-demand attempt;
  else the pool's on-demand price history, before its first point the
  caller's current on-demand price (``on_demand_prices``); with neither, the
  entry's own cost (no saving is claimed that cannot be shown). Egress has
  no on-demand equivalent (0): staying on-demand would not have moved.

The ledger is the only cost in spotd: budgets, ``spotd status``, ``/metrics``,
budget alerts, job-end emails and reports all read it. The stored lines are
final for closed attempts (but one whose nodes a hold keeps, until its keeper
stops them and bills it again); :func:`ledger_so_far` adds the attempts not billed
yet (the running one, a held one), priced to ``now`` by the same rules at their price at
placement, so a running job's figure needs no read of the price history.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import TYPE_CHECKING

from spotd.core.values import (
    AttemptRecord,
    EntryKind,
    Instance,
    JobRecord,
    LedgerEntry,
    Market,
    NodeUsage,
    Pool,
    PricePoint,
)
from spotd.market import catalog
from spotd.market.catalog import billed_seconds
from spotd.registry import find_kind_of

if TYPE_CHECKING:
    from spotd.core.contracts import HistoryStore, Store

PriceHistory = Callable[[Pool, Market, datetime], Sequence[PricePoint]]
"""``(pool, market, since)`` -> the pool's polled prices in that market since then, oldest first."""

HISTORY_LOOKBACK = timedelta(days=7)
"""How far before an attempt's start the price in force at its start is looked for."""


def usage_from_instances(instances: Iterable[Instance]) -> dict[str, NodeUsage]:
    """Node usage from a provider's ``describe``: its launch and end times, no fixed price."""
    return {
        i.id: NodeUsage(i.id, i.launched_at, i.ended_at if i.ended else None)
        for i in instances
        if i.launched_at is not None
    }


def store_history(store: HistoryStore) -> PriceHistory:
    """The store's price history as :data:`PriceHistory` (filtered by market)."""

    def history(pool: Pool, market: Market, since: datetime) -> list[PricePoint]:
        return [p for p in store.price_history(pool, since=since) if p.market is market]

    return history


def build_ledger(
    job: JobRecord,
    attempts: Sequence[AttemptRecord],
    price_history: PriceHistory,
    now: datetime,
    *,
    on_demand_prices: Mapping[Pool, float] | None = None,
    usage: Mapping[str, NodeUsage] | None = None,
) -> list[LedgerEntry]:
    """Every billed line of ``job``'s attempts, by attempt, kind and day (see the module doc).

    ``on_demand_prices`` are current on-demand prices per pool, used where
    the history has none; ``usage`` the providers' own node records by
    instance id. Pure: it reads nothing but its arguments.
    """
    ctx = _Context(job, price_history, now, on_demand_prices or {}, usage or {}, attempts=attempts)
    return _build(ctx, attempts, lambda _: True)


def _build(
    ctx: _Context, attempts: Sequence[AttemptRecord], wanted: Callable[[AttemptRecord], bool]
) -> list[LedgerEntry]:
    """The entries of the ``wanted`` attempts; the others only say where the job ran
    last (egress) and whether it had booted (the first boot's on-demand equivalent)."""
    entries: list[LedgerEntry] = []
    last_ran: AttemptRecord | None = None
    booted = False
    for attempt in sorted(attempts, key=lambda a: a.seq):
        windows = ctx.windows(attempt) if wanted(attempt) else []
        if windows:
            entries.extend(ctx.egress(last_ran, attempt))
            entries.extend(ctx.node_entries(attempt, windows, first_boot=not booted))
        if attempt.instance_ids:
            booted = True
        if attempt.running_at is not None:
            last_ran = attempt
    return entries


def ledger_so_far(
    job: JobRecord,
    attempts: Sequence[AttemptRecord],
    billed: Iterable[LedgerEntry],
    now: datetime,
    *,
    on_demand_prices: Mapping[Pool, float] | None = None,
) -> list[LedgerEntry]:
    """The job's ledger up to ``now``: THE cost of a job, final or running (pure).

    ``billed`` are the stored lines (:func:`record_ledger`, written when an
    attempt ends). They are kept for every closed attempt they cover. Every
    other attempt (the open one, or one whose bill has not been written) is
    priced to ``now`` by the same rules, with two simplifications that keep
    this cheap enough for every reconcile pass over many jobs: the attempt's
    own times (not the provider's meter) and its price at placement (no read
    of the price history, no on-demand history: ``on_demand_prices`` or no
    saving). When the attempt ends, :func:`record_ledger` bills it with the
    provider's times and the prices in force, and that figure replaces this
    one. On the simulated providers (price fixed at launch) the two agree
    but for the seconds between the launch and the daemon's next pass.
    """
    closed = {a.seq for a in attempts if billed_for_good(a)}
    kept = [e for e in billed if e.attempt in closed]
    covered = {e.attempt for e in kept}
    if all(a.seq in covered or not a.instance_ids for a in attempts):
        return kept
    ctx = _Context(job, _no_history, now, on_demand_prices or {}, {}, attempts=attempts)
    fresh = _build(ctx, attempts, lambda a: a.seq not in covered)
    return sorted([*kept, *fresh], key=lambda e: (e.attempt, e.start, e.kind))


def spend_so_far(
    job: JobRecord, attempts: Sequence[AttemptRecord], billed: Iterable[LedgerEntry], now: datetime
) -> float:
    """What the job has cost up to ``now`` by its ledger (:func:`ledger_so_far`), in USD.

    What budgets are enforced against, and what ``spotd status``, ``/metrics``,
    budget alerts and job-end emails show. The sum of :func:`ledger_so_far`'s
    lines, worked out by the same rules (windows, prices, egress) without
    building them: a reconcile pass asks it of every job with a budget.
    """
    closed = {a.seq for a in attempts if billed_for_good(a)}
    spend = 0.0
    covered: set[int] = set()
    for e in billed:
        if e.attempt in closed:
            spend += e.usd
            covered.add(e.attempt)
    ctx: _Context | None = None
    last_ran: AttemptRecord | None = None
    for attempt in sorted(attempts, key=lambda a: a.seq):
        if attempt.seq not in covered and attempt.instance_ids:
            ctx = ctx or _Context(job, _no_history, now, {}, {}, attempts=attempts)
            spend += sum(e.usd for e in ctx.egress(last_ran, attempt))
            # No price history and no provider meter: every node pays the attempt's price.
            seconds = sum((w.billed_end - w.start).total_seconds() for w in ctx.windows(attempt))
            spend += attempt.price_per_node_hour * seconds / 3600.0
        if attempt.running_at is not None:
            last_ran = attempt
    return spend


def billed_for_good(attempt: AttemptRecord) -> bool:
    """Whether the attempt's stored lines are final: it is closed, and no hold keeps its
    nodes (a kept node is billed up to ``now`` until the hold's keeper stops it)."""
    return not attempt.open and attempt.held_until is None


def billed_until(attempt: AttemptRecord, now: datetime) -> datetime:
    """When the attempt's nodes stop being billed by its own times: its end; for the
    nodes a hold kept, their release (``now`` while the hold lasts); ``now`` if open."""
    end = attempt.ended_at
    if end is None or attempt.held_until is not None:
        return now
    return end if attempt.released_at is None else max(end, attempt.released_at)


def spend_by_attempt(entries: Iterable[LedgerEntry]) -> dict[int, float]:
    """USD of ``entries`` by attempt seq."""
    spend: dict[int, float] = {}
    for e in entries:
        spend[e.attempt] = spend.get(e.attempt, 0.0) + e.usd
    return spend


def _no_history(pool: Pool, market: Market, since: datetime) -> Sequence[PricePoint]:
    return ()


def record_ledger(
    store: Store,
    job: JobRecord,
    now: datetime,
    *,
    on_demand_prices: Mapping[Pool, float] | None = None,
    usage: Mapping[str, NodeUsage] | None = None,
) -> list[LedgerEntry]:
    """Rebuild the job's ledger from its attempts and the price history, and store it."""
    entries = build_ledger(
        job,
        store.attempts(job.id),
        store_history(store),
        now,
        on_demand_prices=on_demand_prices,
        usage=usage,
    )
    store.replace_ledger(job.id, entries)
    return entries


def totals(entries: Iterable[LedgerEntry]) -> tuple[float, float]:
    """(spend, on-demand equivalent) of ``entries``, in USD."""
    spend = on_demand = 0.0
    for e in entries:
        spend += e.usd
        on_demand += e.on_demand_usd
    return spend, on_demand


# -- prices over time ---------------------------------------------------------


class PriceCurve:
    """A price that steps at polled points, with a price before the first point.

    ``before`` None means the first point's price holds before it too.
    """

    def __init__(self, points: Sequence[PricePoint], before: float | None) -> None:
        self._points = sorted(points, key=lambda p: p.at)
        self._times = [p.at for p in self._points]
        self._before = before

    @property
    def known(self) -> bool:
        """Whether the curve has any price at all."""
        return bool(self._points) or self._before is not None

    def at(self, moment: datetime) -> float:
        """The price in force at ``moment`` (USD per node-hour)."""
        index = bisect.bisect_right(self._times, moment) - 1
        if index >= 0:
            return self._points[index].price
        return self._before if self._before is not None else self._first()

    def integrate(self, start: datetime, end: datetime) -> float:
        """USD one node pays from ``start`` to ``end``, the price stepping where it changed."""
        if end <= start:
            return 0.0
        lo, hi = bisect.bisect_right(self._times, start), bisect.bisect_left(self._times, end)
        cuts = self._times[lo:hi]
        edges = [start, *cuts, end]
        return sum(
            self.at(a) * (b - a).total_seconds() / 3600.0 for a, b in itertools.pairwise(edges)
        )

    def _first(self) -> float:
        return self._points[0].price if self._points else 0.0


# -- building -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Window:
    """One node's billed life: launch, end of changeover, end of the billed time."""

    start: datetime
    running: datetime
    billed_end: datetime
    price: float | None


@dataclass(frozen=True, slots=True)
class _Offering:
    gpu: str
    gpus_per_node: int
    fabric: str


class _Context:
    """What building one job's ledger needs, with the price histories it read."""

    def __init__(
        self,
        job: JobRecord,
        history: PriceHistory,
        now: datetime,
        on_demand: Mapping[Pool, float],
        usage: Mapping[str, NodeUsage],
        *,
        attempts: Sequence[AttemptRecord] = (),
    ) -> None:
        self.job = job
        self.now = now
        self._history = history
        self._on_demand = on_demand
        self._usage = usage
        self._spans = node_spans(attempts)
        self._read: dict[tuple[Pool, Market, datetime], Sequence[PricePoint]] = {}

    def windows(self, attempt: AttemptRecord) -> list[_Window]:
        """The billed window of each node; none for an attempt that never launched any."""
        return [self._window(attempt, iid) for iid in attempt.instance_ids]

    def _window(self, attempt: AttemptRecord, instance_id: str) -> _Window:
        used = self._usage.get(instance_id)
        if used is not None:
            start, end, price = used.launched_at, used.ended_at or self.now, used.price_per_hour
        else:
            start, end, price = attempt.started_at, billed_until(attempt, self.now), None
        end = max(start, end)
        billed = billed_seconds(attempt.pool.provider, (end - start).total_seconds())
        billed_end = start + timedelta(seconds=billed)
        # A node kept from one attempt to the next is billed once: each attempt its share.
        start, end, billed_end = _share(self._spans.get((attempt.seq, instance_id)),
                                        start, end, billed_end)  # fmt: skip
        if attempt.running_at is None:
            running = billed_end  # never ran: all of it was changeover
        else:
            running = min(max(attempt.running_at, start), end)
        return _Window(start, running, billed_end, price)

    def node_entries(
        self, attempt: AttemptRecord, windows: Sequence[_Window], *, first_boot: bool
    ) -> list[LedgerEntry]:
        """The attempt's changeover and compute entries, one per kind and day.

        Only the job's first boot has an on-demand equivalent: an on-demand
        run boots once, so the changeovers of recoveries are spot's overhead.
        """
        sums: dict[tuple[EntryKind, datetime], _Sum] = {}
        od_curve = self._on_demand_curve(attempt)
        for w in windows:
            paid = self._paid_curve(attempt, w)
            pieces: tuple[tuple[EntryKind, datetime, datetime], ...] = (
                ("changeover", w.start, w.running),
                ("compute", w.running, w.billed_end),
            )
            for kind, a, b in pieces:
                for d0, d1 in split_days(a, b):
                    usd = paid.integrate(d0, d1)
                    od = od_curve.integrate(d0, d1) if od_curve is not None else usd
                    if kind == "changeover" and not first_boot:
                        od = 0.0
                    sums.setdefault((kind, _day(d0)), _Sum()).add(d0, d1, usd, od)
        ordered = sorted(sums.items(), key=lambda kv: (kv[1].start, kv[0][0]))
        return [self._entry(attempt, kind, s) for (kind, _), s in ordered]

    def egress(self, last_ran: AttemptRecord | None, attempt: AttemptRecord) -> list[LedgerEntry]:
        """The checkpoint's move to ``attempt``'s region, if it moved and there was one."""
        if last_ran is None or attempt.resume_from is None:
            return []
        src, dst = last_ran.pool, attempt.pool
        if (src.provider, src.region) == (dst.provider, dst.region):
            return []
        usd = self.job.spec.checkpoint.size_gb * egress_rate(src.provider, dst.provider)
        s = _Sum()
        s.add(attempt.started_at, attempt.started_at, usd, 0.0)
        return [self._entry(attempt, "egress", s)]

    def _paid_curve(self, attempt: AttemptRecord, window: _Window) -> PriceCurve:
        if window.price is not None:
            return PriceCurve((), window.price)
        kind = find_kind_of(attempt.pool.provider)
        if kind is not None and kind.prices_fixed_at_launch:
            return PriceCurve((), attempt.price_per_node_hour)
        points = self._points(attempt.pool, attempt.market, attempt.started_at)
        return PriceCurve(points, attempt.price_per_node_hour)

    def _on_demand_curve(self, attempt: AttemptRecord) -> PriceCurve | None:
        """The on-demand price of the offering; None: price it as paid (no saving)."""
        if attempt.market is Market.ON_DEMAND:
            return None
        points = self._points(attempt.pool, Market.ON_DEMAND, attempt.started_at)
        curve = PriceCurve(points, self._on_demand.get(attempt.pool))
        return curve if curve.known else None

    def _points(self, pool: Pool, market: Market, start: datetime) -> Sequence[PricePoint]:
        since = start - HISTORY_LOOKBACK
        key = (pool, market, since)
        if key not in self._read:
            self._read[key] = self._history(pool, market, since)
        return self._read[key]

    def _entry(self, attempt: AttemptRecord, kind: EntryKind, s: _Sum) -> LedgerEntry:
        offering = _offering_of(self.job, attempt.pool)
        pool = attempt.pool
        return LedgerEntry(
            job_id=self.job.id,
            attempt=attempt.seq,
            provider=pool.provider,
            region=pool.region,
            zone=pool.zone,
            instance_type=pool.instance_type,
            gpu=offering.gpu,
            gpus=offering.gpus_per_node * attempt.nodes,
            nodes=attempt.nodes,
            fabric=offering.fabric,
            market=attempt.market.value,
            kind=kind,
            start=s.start,
            end=s.end,
            billed_seconds=s.seconds,
            usd=s.usd,
            on_demand_usd=s.on_demand,
            job_status=self.job.status.value,
        )


class _Sum:
    """Running totals of one entry while its nodes and pieces are added."""

    def __init__(self) -> None:
        self.start = datetime.max.replace(tzinfo=UTC)
        self.end = datetime.min.replace(tzinfo=UTC)
        self.seconds = 0.0
        self.usd = 0.0
        self.on_demand = 0.0

    def add(self, start: datetime, end: datetime, usd: float, on_demand: float) -> None:
        self.start = min(self.start, start)
        self.end = max(self.end, end)
        self.seconds += (end - start).total_seconds()
        self.usd += usd
        self.on_demand += on_demand


Span = tuple[datetime | None, datetime | None]
"""The part of a node's life one attempt bills: from (None: its launch) to (None: its end)."""


def node_spans(attempts: Sequence[AttemptRecord]) -> dict[tuple[int, str], Span]:
    """For each node kept from one attempt to the next (a gang repaired,
    :mod:`spotd.engine.repair`), by (attempt seq, instance id), the part of its life that
    attempt bills: from the attempt's start when an earlier one held it, up to the start
    of the next one that holds it. Nodes of one attempt only are not listed."""
    holders: dict[str, list[AttemptRecord]] = {}
    for attempt in sorted(attempts, key=lambda a: a.seq):
        for iid in attempt.instance_ids:
            holders.setdefault(iid, []).append(attempt)
    spans: dict[tuple[int, str], Span] = {}
    for iid, held in holders.items():
        if len(held) < 2:
            continue
        for k, attempt in enumerate(held):
            since = attempt.started_at if k > 0 else None
            until = held[k + 1].started_at if k + 1 < len(held) else None
            spans[(attempt.seq, iid)] = (since, until)
    return spans


def _share(
    span: Span | None, start: datetime, end: datetime, billed_end: datetime
) -> tuple[datetime, datetime, datetime]:
    """A node's billed window (its life, rounded up as a whole) cut to ``span``."""
    if span is None:
        return start, end, billed_end
    since, until = span
    if since is not None:
        start = min(max(start, since), billed_end)
    if until is not None:
        billed_end = max(min(billed_end, until), start)
    end = min(max(end, start), billed_end)
    return start, end, billed_end


def egress_rate(source: str, destination: str) -> float:
    """USD per GB to move data from provider ``source`` to ``destination`` (other region)."""
    return catalog.transfer_usd_per_gb(source, destination)


def split_days(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """``[start, end)`` cut at UTC midnights; empty when it is empty."""
    pieces: list[tuple[datetime, datetime]] = []
    cursor = start
    while cursor < end:
        midnight = _day(cursor) + timedelta(days=1)
        cut = min(end, midnight)
        pieces.append((cursor, cut))
        cursor = cut
    return pieces


def _day(moment: datetime) -> datetime:
    """The UTC midnight that starts ``moment``'s day."""
    utc = moment.astimezone(UTC)
    return datetime.combine(utc.date(), time(), tzinfo=UTC)


def _offering_of(job: JobRecord, pool: Pool) -> _Offering:
    """GPU model, GPUs per node and fabric of the pool's instance type.

    From the instance-type table the adapters use; for a type it lacks, the
    job's own request (its one accepted GPU model, or "unknown").
    """
    known = catalog.facts(pool.provider, pool.instance_type)
    if known is not None:
        return _Offering(known.gpu, known.gpus_per_node, known.interconnect.fabric.value)
    res = job.spec.resources
    gpu = res.gpus[0] if len(res.gpus) == 1 else "unknown"
    fabric = catalog.interconnect(pool.provider, pool.instance_type, res.gpus_per_node)
    return _Offering(gpu, res.gpus_per_node, fabric.fabric.value)
