"""The nodes' output as their agents ship it (:class:`~spotd.core.agent_wire.LogChunk`).

Kept in the store, not in files under the daemon's ``data_dir``: several daemons on
one PostgreSQL database answer the same API, an agent ships to whichever daemon its
URL reaches, and ``spotd logs`` may ask any other; the database is what they all
share (files would serve one daemon only, or need a shared disk besides).

Per node (job, attempt, instance): a head row (``log_heads``) says how far the
shipped output goes, so where the next chunk must start; the bytes are in chunk
rows (``log_chunks``), the newest one extended in place up to :data:`ROW_BYTES`, so
a job that prints a line a second keeps few rows, not one a request. A job keeps
its newest ``keep_bytes`` (every node of every attempt together): after an append
that goes over, the oldest rows go, whole, but never a node's newest (its tail),
so a job keeps at most ``keep_bytes`` and a row per node more. The heads stay: a
node's offsets go on from where they were.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import (
    Connection,
    Engine,
    Select,
    and_,
    delete,
    func,
    insert,
    not_,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from spotd.core.agent_wire import MAX_LOG_CHUNK, LogChunk, LogGap
from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.store.base import SqlBase
from spotd.store.tables import LOG_CHUNKS, LOG_HEADS

DEFAULT_KEEP_BYTES = 4 * 1024 * 1024
"""``[agent] log_keep_bytes`` by default: the newest 4 MiB of a job's output."""
MIN_KEEP_BYTES = MAX_LOG_CHUNK
"""The least a job may keep: one whole chunk."""
ROW_BYTES = MAX_LOG_CHUNK
"""A chunk row is extended in place while it stays within this many bytes."""

NodeKey = tuple[int, str]
"""A node of a job: its attempt's number and its instance id."""


@dataclass(frozen=True, slots=True)
class KeptOutput:
    """What the store keeps of one node's output: bytes ``[start, end)`` of it, ``end``
    being all its agent shipped (``start`` is past 0 when older bytes were trimmed,
    or when only those after an offset were asked for)."""

    attempt: int
    instance_id: str
    start: int
    end: int
    data: bytes

    @property
    def node(self) -> NodeKey:
        """This node's key: its attempt and instance id."""
        return self.attempt, self.instance_id


class JobLogRows(SqlBase):
    """The shipped output of the jobs' nodes (see the module): appended by the agents'
    route, read by ``spotd logs`` and the dashboard."""

    def __init__(
        self, engine: Engine, *, keep_bytes: int = DEFAULT_KEEP_BYTES, wall: Clock = WALL
    ) -> None:
        super().__init__(engine, wall=wall)
        self.keep_bytes = max(keep_bytes, MIN_KEEP_BYTES)

    @classmethod
    def of(cls, store: object, *, keep_bytes: int = DEFAULT_KEEP_BYTES) -> JobLogRows | None:
        """The rows over ``store``'s database; None for a store that is not SQL."""
        if not isinstance(store, SqlBase):
            return None
        return cls(store.engine, keep_bytes=keep_bytes)

    def append(self, chunk: LogChunk) -> int:
        """Keep ``chunk``'s bytes that are new, trim the job to its bound, and return the
        end of the node's output as kept. :class:`~spotd.core.agent_wire.LogGap` (and
        nothing kept) for a chunk that starts past that end."""
        key = (chunk.job_id, chunk.attempt, chunk.instance_id)
        with self._write() as conn:
            shipped = _shipped(conn, key)
            end = shipped or 0
            if chunk.offset > end:
                raise LogGap(
                    f"the output of {chunk.instance_id} (attempt {chunk.attempt}) ends at "
                    f"byte {end}, and the chunk starts at {chunk.offset}: send from {end}",
                    expected=end, job_id=chunk.job_id,
                )  # fmt: skip
            new = chunk.data[end - chunk.offset :]
            if not new:
                return end  # all held already: a retry of a chunk that went
            _add_bytes(conn, key, end, new)
            _set_shipped(conn, key, end + len(new), known=shipped is not None)
            self._trim(conn, chunk.job_id)
            return end + len(new)

    def kept(
        self,
        job_id: str,
        *,
        attempts: Collection[int] | None = None,
        after: Mapping[NodeKey, int] | None = None,
    ) -> list[KeptOutput]:
        """The kept output of each node of the job that shipped any (of ``attempts``
        only, if given), by attempt then instance id; of a node in ``after``, only the
        bytes past its offset there."""
        after = after or {}
        with self._read() as conn:
            heads = conn.execute(_heads_query(job_id, attempts)).all()
            rows = conn.execute(_rows_query(job_id, attempts, after)).all()
        found: dict[NodeKey, list[tuple[int, bytes]]] = {}
        for attempt, instance_id, start, data in rows:
            found.setdefault((attempt, instance_id), []).append((start, bytes(data)))
        return [
            _kept(attempt, instance_id, shipped, found.get((attempt, instance_id), []),
                  after.get((attempt, instance_id), 0))
            for attempt, instance_id, shipped in heads
        ]  # fmt: skip

    def _trim(self, conn: Connection, job_id: str) -> None:
        """Drop the job's oldest rows, a node's newest excepted, until it keeps at most
        :attr:`keep_bytes`."""
        total = conn.execute(
            select(func.coalesce(func.sum(LOG_CHUNKS.c.size), 0)).where(
                LOG_CHUNKS.c.job_id == job_id
            )
        ).scalar_one()
        if total <= self.keep_bytes:
            return
        c = LOG_CHUNKS.c
        rows = conn.execute(
            select(c.id, c.attempt, c.instance_id, c.size).where(c.job_id == job_id)
            .order_by(c.id)
        ).all()  # fmt: skip
        newest = {(r.attempt, r.instance_id): r.id for r in rows}  # ids grow with the offset
        dropped: list[int] = []
        for row in rows:
            if total <= self.keep_bytes:
                break
            if newest[(row.attempt, row.instance_id)] != row.id:
                dropped.append(row.id)
                total -= row.size
        if dropped:
            conn.execute(delete(LOG_CHUNKS).where(LOG_CHUNKS.c.id.in_(dropped)))


def _node_is(key: tuple[str, int, str]) -> ColumnElement[bool]:
    job_id, attempt, instance_id = key
    c = LOG_CHUNKS.c
    return and_(c.job_id == job_id, c.attempt == attempt, c.instance_id == instance_id)


def _shipped(conn: Connection, key: tuple[str, int, str]) -> int | None:
    """How far the node's shipped output goes; None before its first chunk. Locked on
    PostgreSQL until the transaction ends: two daemons given the same chunk (a retry)
    keep it once."""
    job_id, attempt, instance_id = key
    h = LOG_HEADS.c
    query = select(h.shipped).where(h.job_id == job_id, h.attempt == attempt,
                                    h.instance_id == instance_id)  # fmt: skip
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    value = conn.execute(query).scalar_one_or_none()
    return None if value is None else int(value)


def _set_shipped(conn: Connection, key: tuple[str, int, str], end: int, *, known: bool) -> None:
    job_id, attempt, instance_id = key
    h = LOG_HEADS.c
    if known:
        conn.execute(
            update(LOG_HEADS)
            .where(h.job_id == job_id, h.attempt == attempt, h.instance_id == instance_id)
            .values(shipped=end)
        )
        return
    conn.execute(insert(LOG_HEADS).values(job_id=job_id, attempt=attempt,
                                          instance_id=instance_id, shipped=end))  # fmt: skip


def _add_bytes(conn: Connection, key: tuple[str, int, str], start: int, new: bytes) -> None:
    """``new`` as the node's bytes from ``start`` on: onto its newest row while that
    stays within :data:`ROW_BYTES` and ends at ``start``, else in a row of their own."""
    c = LOG_CHUNKS.c
    last = conn.execute(
        select(c.id, c.start, c.size, c.data).where(_node_is(key))
        .order_by(c.start.desc()).limit(1)
    ).first()  # fmt: skip
    if last is not None and last.start + last.size == start and last.size + len(new) <= ROW_BYTES:
        # Concatenated here, not with SQL's ||: SQLite's makes text of two blobs.
        conn.execute(update(LOG_CHUNKS).where(c.id == last.id)
                     .values(data=bytes(last.data) + new, size=last.size + len(new)))  # fmt: skip
        return
    job_id, attempt, instance_id = key
    conn.execute(insert(LOG_CHUNKS).values(job_id=job_id, attempt=attempt, instance_id=instance_id,
                                           start=start, size=len(new), data=new))  # fmt: skip


def _heads_query(job_id: str, attempts: Collection[int] | None) -> Select[int, str, int]:
    h = LOG_HEADS.c
    query = select(h.attempt, h.instance_id, h.shipped).where(h.job_id == job_id)
    if attempts is not None:
        query = query.where(h.attempt.in_(list(attempts)))
    return query.order_by(h.attempt, h.instance_id)


def _rows_query(
    job_id: str, attempts: Collection[int] | None, after: Mapping[NodeKey, int]
) -> Select[int, str, int, bytes]:
    """The rows of the job's nodes (of ``attempts``) that hold a byte past ``after``."""
    c = LOG_CHUNKS.c
    query = select(c.attempt, c.instance_id, c.start, c.data).where(c.job_id == job_id)
    if attempts is not None:
        query = query.where(c.attempt.in_(list(attempts)))
    if after:
        past = [
            and_(c.attempt == attempt, c.instance_id == instance_id, c.start + c.size > offset)
            for (attempt, instance_id), offset in after.items()
        ]
        others = not_(tuple_(c.attempt, c.instance_id).in_(list(after)))
        query = query.where(or_(others, *past))
    return query.order_by(c.attempt, c.instance_id, c.start)


def _kept(
    attempt: int, instance_id: str, shipped: int, rows: Sequence[tuple[int, bytes]], after: int
) -> KeptOutput:
    """One node's output from its rows (in order, contiguous), from ``after`` on."""
    start = rows[0][0] if rows else shipped
    data = b"".join(data for _, data in rows)
    if after > start:
        data = data[after - start :]
        start = min(after, shipped)
    return KeptOutput(attempt, instance_id, start, int(shipped), data)
