"""A job's output, node by node of each attempt: what ``spotd logs`` prints (through
``GET /v1/jobs/{ref}/logs``) and the tail the dashboard's job page shows.

Read the same way on every provider: what each node's agent shipped to the daemons
(:mod:`spotd.store.joblogs`). Only a node whose agent never spoke to a daemon (no
report, nothing shipped: the simulated nodes of a market run without a daemon) is
read from its provider's own record of it (:meth:`~spotd.core.contracts.Provider.logs`).
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spotd.core.errors import ProviderError
from spotd.core.values import AttemptRecord, JobRecord
from spotd.daemon.logview import CursorKey, LogSource, LogsView, NodeLogView, encode_cursor
from spotd.daemon.reader import Reader
from spotd.store.joblogs import JobLogRows, KeptOutput, NodeKey


@dataclass(frozen=True, slots=True)
class NodeBytes:
    """One node's output as read, before it is text: bytes ``[start, start + len(data))``."""

    attempt: AttemptRecord
    rank: int
    instance_id: str
    source: LogSource
    start: int
    data: bytes

    @property
    def header(self) -> str:
        """``attempt <seq> <pool> <instance id>``."""
        return f"attempt {self.attempt.seq} {self.attempt.pool} {self.instance_id}"

    @property
    def key(self) -> CursorKey:
        """The node in a cursor."""
        return self.attempt.seq, self.instance_id, self.source


def job_logs(
    reader: Reader,
    job: JobRecord,
    *,
    attempt: int | None = None,
    node: int | None = None,
    after: Mapping[CursorKey, int] | None = None,
) -> LogsView:
    """The output of each node of ``job`` (of attempt number ``attempt`` and rank
    ``node`` only, if given), oldest attempt first; of a node in ``after`` (a cursor's
    offsets), only what came after its offset there."""
    after = after or {}
    attempts = [a for a in reader.store.attempts(job.id) if attempt is None or a.seq == attempt]
    nodes = [n for n in read_nodes(reader, job.id, attempts, after)
             if node is None or n.rank == node]  # fmt: skip
    views, logs, offsets = [], {}, dict(after)
    for found in nodes:
        text, used = decoded(found.data)
        asked = after.get(found.key, 0)
        views.append(NodeLogView(
            header=found.header, attempt=found.attempt.seq, node=found.rank,
            instance_id=found.instance_id, source=found.source, start=found.start,
            end=found.start + used, skipped=max(0, found.start - asked),
        ))  # fmt: skip
        logs[found.header] = text
        offsets[found.key] = found.start + used
    return LogsView(logs=logs, nodes=views, cursor=encode_cursor(offsets))


def attempt_logs(reader: Reader, attempts: Sequence[AttemptRecord]) -> list[tuple[str, str]]:
    """The output of each node of ``attempts``, under its header, as ``spotd logs``
    prints it."""
    if not attempts:
        return []
    nodes = read_nodes(reader, attempts[0].job_id, attempts, {})
    return [(n.header, decoded(n.data)[0]) for n in nodes]


def read_nodes(
    reader: Reader,
    job_id: str,
    attempts: Sequence[AttemptRecord],
    after: Mapping[CursorKey, int],
) -> list[NodeBytes]:
    """Each node of ``attempts`` and its output from its offset in ``after`` on: the
    shipped output of a node whose agent reported or shipped, else its provider's."""
    rows = JobLogRows.of(reader.store)
    shipped_after = {(a, i): end for (a, i, source), end in after.items()
                     if source is LogSource.AGENT}  # fmt: skip
    kept: dict[NodeKey, KeptOutput] = {}
    if rows is not None and attempts:
        seqs = [a.seq for a in attempts]
        kept = {k.node: k for k in rows.kept(job_id, attempts=seqs, after=shipped_after)}
    spoke = {(r.attempt, r.instance_id) for r in reader.store.reports(job_id)} | set(kept)
    out: list[NodeBytes] = []
    for attempt in attempts:
        for rank, iid in enumerate(_instances(attempt, kept)):
            key = (attempt.seq, iid)
            if key in spoke:
                found = kept.get(key)
                start = found.start if found else 0
                out.append(NodeBytes(attempt, rank, iid, LogSource.AGENT, start,
                                     found.data if found else b""))  # fmt: skip
                continue
            offset = after.get((attempt.seq, iid, LogSource.PROVIDER), 0)
            data = _provider_output(reader, attempt, iid).encode()
            start = min(offset, len(data))
            out.append(NodeBytes(attempt, rank, iid, LogSource.PROVIDER, start, data[start:]))
    return out


def _instances(attempt: AttemptRecord, kept: Mapping[NodeKey, KeptOutput]) -> list[str]:
    """The attempt's instances in rank order, then any other that shipped for it."""
    known = list(attempt.instance_ids)
    others = sorted(i for a, i in kept if a == attempt.seq and i not in known)
    return known + others


def _provider_output(reader: Reader, attempt: AttemptRecord, instance_id: str) -> str:
    provider = reader.providers.get(attempt.pool.provider)
    if provider is None:
        return "(provider not enabled)"
    try:
        return provider.logs(instance_id)
    except ProviderError:
        return ""  # gone, or the provider cannot say now: nothing to show


def decoded(data: bytes) -> tuple[str, int]:
    """``data`` as UTF-8 text, and how many of its bytes that took: an incomplete
    character at its end waits for the rest (the next chunk brings it)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=False)
    pending, _ = decoder.getstate()
    return text, len(data) - len(pending)


def tail(text: str, lines: int) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.splitlines()[-lines:])
