"""The reaper: stops what no open attempt owns, and bills what a killed daemon left unbilled.

Every cloud object spotd makes carries its owner's, job's and attempt's tags
(:mod:`spotd.engine.settings`), so a daemon that crashed between a
transition and its provider call leaves nothing behind for long: the next
reap stops the instances and deletes the placements of attempts that ended.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from spotd.core.contracts import EngineStore, Provider
from spotd.core.errors import ProviderError, SpotdError, StoreError
from spotd.core.values import AttemptRecord
from spotd.engine.executor import Executor
from spotd.engine.holds import keeps_nodes
from spotd.engine.placements import joined, reap_placements
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB, TAG_OWNER

log = logging.getLogger(__name__)


class Reaper:
    """Finds and stops the objects of ended attempts, owner by owner."""

    def __init__(
        self, store: EngineStore, providers: Mapping[str, Provider], executor: Executor
    ) -> None:
        self._store = store
        self._providers = providers
        self._executor = executor
        self._unbilled: set[str] = set()
        """Ended jobs a killed daemon left unbilled, not billed yet."""
        self._unbilled_read: set[str] = set()
        """The owners whose unbilled jobs were read (at their first reap here)."""

    def reap(self, owners: Sequence[str]) -> int:
        """Stop running instances no open attempt of ``owners`` owns, and delete placement
        objects no live instance or open attempt holds; return how many instances were
        stopped. Then bill what those owners left unbilled."""
        stopped = 0
        for owner in owners:
            for provider in self._providers.values():
                stopped += self._reap_one(provider, owner)
        self._bill_leftovers(owners)
        return stopped

    def _bill_leftovers(self, owners: Sequence[str]) -> None:
        """Bill the ended jobs that a daemon of ``owners``, killed between a job's end
        and its bill, left without one (each owner's read at its first reap here), each
        once every node of theirs has ended (the reaper stops those still running);
        then announce the end, which that daemon never reached either."""
        for owner in set(owners) - self._unbilled_read:
            try:
                self._unbilled.update(self._store.unbilled_jobs(owner))
            except StoreError as exc:
                log.warning("%s's ended jobs left unbilled could not be read: %s", owner, exc)
                continue
            self._unbilled_read.add(owner)
        for job_id in sorted(self._unbilled):
            try:
                attempts = self._store.attempts(job_id)
                if not all(self._nodes_ended(a) for a in attempts if not a.open):
                    continue
                job = self._store.get_job(job_id)
            except SpotdError as exc:
                log.warning("job %s: its bill waits, its nodes could not be read: %s", job_id, exc)
                continue
            log.info("job %s ended unbilled (its daemon stopped first): billing it now", job_id)
            self._executor.bills.bill(job)
            self._executor.announce_end(job)
            self._unbilled.discard(job_id)

    def _nodes_ended(self, attempt: AttemptRecord) -> bool:
        """Whether every node of ``attempt`` has ended (or its provider is gone)."""
        provider = self._providers.get(attempt.pool.provider)
        if provider is None or not attempt.instance_ids:
            return True
        return all(i.ended for i in provider.describe(attempt.instance_ids))

    def _reap_one(self, provider: Provider, owner: str) -> int:
        try:
            mine = provider.list_instances({TAG_OWNER: owner})
        except ProviderError as exc:
            log.warning("reaper could not list %s: %s", provider.name, exc)
            return 0
        except Exception:
            log.exception("reaper: listing %s raised", provider.name)  # an adapter's bug
            return 0
        live = [i for i in mine if not i.ended]
        orphans = [i.id for i in live if self.orphaned(i.tags, i.id)]
        stopped = _stop_orphans(provider, orphans) if orphans else 0
        try:
            # Orphans stopped just now still hold their placement: it goes next pass.
            reap_placements(provider, {TAG_OWNER: owner}, live, self.orphaned,
                            key_tags=(TAG_JOB, TAG_ATTEMPT))  # fmt: skip
        except Exception:
            log.exception("reaper: placements of %s raised", provider.name)  # an adapter's bug
        return stopped

    def orphaned(self, tags: Mapping[str, str], instance_id: str | None = None) -> bool:
        """Whether the attempt named by these tags (an instance's or a placement's) has
        ended, and no hold keeps its nodes (:mod:`spotd.engine.holds`), nor does an open
        attempt of its job hold the instance ``instance_id`` (a node kept when its gang
        was repaired, :mod:`spotd.engine.repair`); a placement object's attempt also lives
        on in an open attempt that kept nodes of its gang (:func:`joined`)."""
        job_id = tags.get(TAG_JOB, "")
        try:
            attempts = self._store.attempts(job_id)
        except StoreError as exc:
            # Unknown is not orphaned: stopping a healthy run on a locked database
            # loses its work, while a true orphan is only stopped a pass later.
            log.warning("reaper skips %s's objects, its attempts could not be read: %s",
                        job_id, exc)  # fmt: skip
            return False
        owner = next((a for a in attempts if str(a.seq) == tags.get(TAG_ATTEMPT)), None)
        if instance_id is not None and any(a.open and instance_id in a.instance_ids
                                           for a in attempts):  # fmt: skip
            return False
        if instance_id is None and owner is not None and joined(attempts, owner):
            return False  # a placement whose gang a repair kept: its nodes are still in it
        # Nodes a hold keeps for inspection are the hold's keeper's to stop.
        return owner is None or not (owner.open or keeps_nodes(owner))


def _stop_orphans(provider: Provider, orphans: list[str]) -> int:
    log.warning("stopping %d instance(s) no attempt owns: %s", len(orphans), orphans)
    try:
        provider.terminate(orphans)
    except Exception as exc:
        # One provider's failure (or an adapter's unmapped error) must not keep the
        # reaper from the others.
        log.warning("reaper could not stop %s on %s: %s", orphans, provider.name, exc)
        return 0
    return len(orphans)
