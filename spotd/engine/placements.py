"""The placement objects of gangs: deleted when their attempt ends, reaped when orphaned.

A cloud adapter creates a placement object (a cluster placement group, a
compact placement policy, a scale set) before a gang's instances and tags it
as it tags them. Nothing else would ever delete one, and some cost money or
count against a quota, so the engine removes an attempt's objects as soon as
the attempt ends, and the reaper removes any left over: objects whose attempt
is closed or unknown (the daemon was killed between creating one and
recording the attempt's launch), once none of their instances is still alive.
A provider that refuses to delete one yet (its instances are still shutting
down) is asked again on the next reap.

A node repair (:mod:`spotd.engine.repair`) launches the new nodes into the
running gang's objects, those of the attempt that first placed it, so an
object lives on past its attempt while an open attempt keeps nodes of its gang
(:func:`gang_chain`, :func:`joined`), and goes when that gang ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from spotd.core.contracts import PlacementHost, Provider
from spotd.core.errors import ProviderError
from spotd.core.values import AttemptRecord, Instance, PlacementObject

log = logging.getLogger(__name__)

Tags = Mapping[str, str]


def attempt_tags(job_id: str, seq: int, *, job_tag: str, attempt_tag: str) -> dict[str, str]:
    """The tags that pick out one attempt's objects."""
    return {job_tag: job_id, attempt_tag: str(seq)}


def gang_chain(attempts: Sequence[AttemptRecord], attempt: AttemptRecord) -> list[AttemptRecord]:
    """``attempt``, then each attempt before it whose nodes the next one kept (a node
    repair, :mod:`spotd.engine.repair`): their placement objects hold ``attempt``'s nodes.
    The last is the gang's origin, whose launch made the objects the others joined."""
    by_seq = {a.seq: a for a in attempts}
    chain = [attempt]
    while True:
        before = by_seq.get(chain[-1].seq - 1)
        if before is None or not set(before.instance_ids) & set(chain[-1].instance_ids):
            return chain
        chain.append(before)


def joined(attempts: Sequence[AttemptRecord], owner: AttemptRecord) -> bool:
    """Whether an open attempt's gang still lives in ``owner``'s placement objects (it
    kept, directly or through repairs in between, nodes of ``owner``'s gang)."""
    return any(a.open and owner.seq in {c.seq for c in gang_chain(attempts, a)}
               for a in attempts)  # fmt: skip


def release(provider: Provider, attempt: AttemptRecord, tags: Tags) -> int:
    """Delete the placement objects of an ended ``attempt``; return how many went.

    Failures are logged, not raised: the reaper finds what is left.
    """
    if attempt.nodes < 2 or not isinstance(provider, PlacementHost):
        return 0  # adapters make placement objects for gangs only
    try:
        found = list(provider.list_placements(tags))
        if found:
            provider.delete_placements(found)
    except ProviderError as exc:
        log.warning("placement of %s %s not deleted yet, the reaper retries: %s",
                    attempt.job_id, attempt.seq, exc)  # fmt: skip
        return 0
    return len(found)


def reap_placements(
    provider: Provider,
    owner_tags: Tags,
    live: Sequence[Instance],
    orphaned: Callable[[Tags], bool],
    *,
    key_tags: tuple[str, str],
) -> int:
    """Delete ``provider``'s placement objects no open attempt owns; return how many went.

    ``live`` are the owner's instances not yet ended: an object still holding
    one is left for a later pass (the instance is reaped first). ``orphaned``
    says, from an object's tags, whether its attempt is closed or unknown.
    ``key_tags`` are the tag names of job and attempt.
    """
    if not isinstance(provider, PlacementHost):
        return 0
    try:
        found = provider.list_placements(owner_tags)
    except ProviderError as exc:
        log.warning("reaper could not list %s's placement objects: %s", provider.name, exc)
        return 0
    busy = {_key(i.tags, key_tags) for i in live}
    doomed = [p for p in found if _key(p.tags, key_tags) not in busy and orphaned(p.tags)]
    if not doomed:
        return 0
    log.warning("deleting %d placement object(s) no attempt owns: %s",
                len(doomed), [p.id for p in doomed])  # fmt: skip
    return _delete_each(provider, doomed)


def _delete_each(host: PlacementHost, doomed: Sequence[PlacementObject]) -> int:
    # One by one: one still in use must not keep the others.
    deleted = 0
    for placement in doomed:
        try:
            host.delete_placements([placement])
        except ProviderError as exc:
            log.warning("placement object %s not deleted yet: %s", placement.id, exc)
            continue
        deleted += 1
    return deleted


def _key(tags: Tags, key_tags: tuple[str, str]) -> tuple[str, str]:
    return tags.get(key_tags[0], ""), tags.get(key_tags[1], "")
