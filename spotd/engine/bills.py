"""What a job has cost: its spend so far (read once per version) and its ledger (rebuilt
at each attempt's end)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

from spotd.billing.ledger import record_ledger, spend_so_far, usage_from_instances
from spotd.core.contracts import Clock, EngineStore, Metered, Provider
from spotd.core.errors import SpotdError
from spotd.core.values import AttemptRecord, JobRecord, LedgerEntry, NodeUsage
from spotd.market.cache import MarketCache

log = logging.getLogger(__name__)


class Bills:
    """The jobs' stored ledger lines, kept by the job's version they were read at."""

    def __init__(
        self,
        store: EngineStore,
        providers: Mapping[str, Provider],
        market: MarketCache,
        clock: Clock,
    ) -> None:
        self._store = store
        self._providers = providers
        self._market = market
        self._clock = clock
        self._kept: dict[str, tuple[int, list[LedgerEntry]]] = {}

    def spent(self, job: JobRecord, attempts: Sequence[AttemptRecord], now: datetime) -> float:
        """The job's cost so far by its ledger (:func:`spotd.billing.ledger.spend_so_far`).

        The stored lines are read once per version of the job (a transition or a
        bill changes them, and this engine's bills are kept as they are written):
        a steady pass reads nothing. The open attempt is priced to ``now`` at its
        price at placement, with no read of the price history.
        """
        if not any(not a.open and a.instance_ids for a in attempts):
            return spend_so_far(job, attempts, (), now)  # nothing billed yet: nothing to read
        kept = self._kept.get(job.id)
        if kept is None or kept[0] != job.version:
            billed = self._store.ledger(job_id=job.id)
            covered = {e.attempt for e in billed}
            # Read between another thread's transition and its bill: read again next time.
            if all(a.open or not a.instance_ids or a.seq in covered for a in attempts):
                self._kept[job.id] = (job.version, billed)
            kept = (job.version, billed)
        return spend_so_far(job, attempts, kept[1], now)

    def bill(self, job: JobRecord) -> None:
        """Rebuild the job's ledger now that one of its attempts ended.

        Instances are priced from the provider's own meter where it keeps one
        (the simulator), else from the launch and end times it reports.
        """
        try:
            attempts = self._store.attempts(job.id)
            usage: dict[str, NodeUsage] = {}
            for a in attempts:
                provider = self._providers.get(a.pool.provider)
                if provider is None or not a.instance_ids:
                    continue
                if isinstance(provider, Metered):
                    usage.update(provider.usage(a.instance_ids))
                else:
                    usage.update(usage_from_instances(provider.describe(a.instance_ids)))
            pools = {a.pool for a in attempts}
            on_demand = {
                o.pool: o.on_demand_price
                for o in self._market.offerings()
                if o.on_demand_price is not None and o.pool in pools
            }
            entries = record_ledger(self._store, job, self._clock.now(),
                                    on_demand_prices=on_demand, usage=usage)  # fmt: skip
            self._kept[job.id] = (job.version, entries)
        except SpotdError as exc:
            log.warning("ledger of %s not updated, the next attempt end retries: %s", job.id, exc)

    def forget(self, job_id: str) -> None:
        """An ended job is never priced again: keep no bill of it."""
        self._kept.pop(job_id, None)

    def keep_only(self, held: Mapping[str, int]) -> None:
        """Drop the bills of jobs this daemon no longer holds."""
        for job_id in self._kept.keys() - held.keys():
            del self._kept[job_id]
