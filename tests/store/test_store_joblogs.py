"""spotd.store.joblogs: the nodes' shipped output, by offset, kept once and bounded."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from engine_support import spec

from spotd.core.agent_wire import MAX_LOG_CHUNK, LogChunk, LogGap
from spotd.store import SqlStore
from spotd.store.joblogs import MIN_KEEP_BYTES, ROW_BYTES, JobLogRows
from spotd.store.tables import LOG_CHUNKS

T0 = datetime(2026, 3, 2, tzinfo=UTC)


def chunk(job_id: str, offset: int, data: bytes, *, attempt: int = 1, iid: str = "i-a") -> LogChunk:
    return LogChunk(job_id=job_id, attempt=attempt, instance_id=iid, provider="aws", at=T0,
                    offset=offset, data=data)  # fmt: skip


def rows_of(store: SqlStore, job_id: str) -> int:
    with store.engine.connect() as conn:
        return len(conn.execute(LOG_CHUNKS.select().where(LOG_CHUNKS.c.job_id == job_id)).all())


def test_bytes_are_kept_once_whatever_is_sent_again(store: SqlStore) -> None:
    job = store.create_job(spec(), now=T0)
    logs = JobLogRows(store.engine)
    assert logs.append(chunk(job.id, 0, b"hello ")) == 6
    assert logs.append(chunk(job.id, 0, b"hello ")) == 6, "a retry of a chunk that went"
    assert logs.append(chunk(job.id, 3, b"lo world\n")) == 12, "an overlap keeps what is new"
    assert logs.append(chunk(job.id, 12, b"")) == 12
    (kept,) = logs.kept(job.id)
    assert (kept.start, kept.end, kept.data) == (0, 12, b"hello world\n")


def test_a_chunk_past_the_end_is_refused_with_the_offset_expected(store: SqlStore) -> None:
    job = store.create_job(spec(), now=T0)
    logs = JobLogRows(store.engine)
    with pytest.raises(LogGap) as gap:
        logs.append(chunk(job.id, 5, b"late"))
    assert gap.value.expected == 0 and gap.value.job_id == job.id
    assert logs.kept(job.id) == [], "nothing kept, not even a head"
    logs.append(chunk(job.id, 0, b"abc"))
    with pytest.raises(LogGap) as gap:
        logs.append(chunk(job.id, 4, b"x"))
    assert gap.value.expected == 3
    assert logs.kept(job.id)[0].data == b"abc"


def test_nodes_and_attempts_each_have_their_own_offsets(store: SqlStore) -> None:
    job = store.create_job(spec(), now=T0)
    logs = JobLogRows(store.engine)
    logs.append(chunk(job.id, 0, b"a1 node a\n"))
    logs.append(chunk(job.id, 0, b"a1 node b\n", iid="i-b"))
    logs.append(chunk(job.id, 0, b"a2 node a\n", attempt=2))
    kept = logs.kept(job.id)
    assert [(k.attempt, k.instance_id, k.data) for k in kept] == [
        (1, "i-a", b"a1 node a\n"), (1, "i-b", b"a1 node b\n"), (2, "i-a", b"a2 node a\n"),
    ]  # fmt: skip
    assert [k.instance_id for k in logs.kept(job.id, attempts=[2])] == ["i-a"]


def test_small_chunks_extend_one_row_and_a_read_after_an_offset_gets_the_rest(
    store: SqlStore,
) -> None:
    job = store.create_job(spec(), now=T0)
    logs = JobLogRows(store.engine)
    for n in range(100):
        logs.append(chunk(job.id, n * 8, f"line {n:02}\n".encode()))
    assert rows_of(store, job.id) == 1, "a line a second is not a row a second"
    (rest,) = logs.kept(job.id, after={(1, "i-a"): 8 * 98})
    assert (rest.start, rest.end, rest.data) == (784, 800, b"line 98\nline 99\n")
    (none,) = logs.kept(job.id, after={(1, "i-a"): 800})
    assert (none.start, none.data) == (800, b"")


def test_a_job_keeps_its_newest_bytes_and_every_nodes_tail(store: SqlStore) -> None:
    job = store.create_job(spec(), now=T0)
    logs = JobLogRows(store.engine, keep_bytes=MIN_KEEP_BYTES)
    block = MAX_LOG_CHUNK
    logs.append(chunk(job.id, 0, b"b" * 100, iid="i-b"))  # node b's only row: its tail
    for n in range(5):
        logs.append(chunk(job.id, n * block, bytes([65 + n]) * block))
    kept = {k.instance_id: k for k in logs.kept(job.id)}
    a, b = kept["i-a"], kept["i-b"]
    assert a.end == 5 * block and a.data == b"E" * block and a.start == 4 * block
    assert b.data == b"b" * 100, "a node's newest row is never trimmed"
    total = sum(len(k.data) for k in kept.values())
    assert total <= MIN_KEEP_BYTES + ROW_BYTES
    # The offsets go on where they were: the next chunk starts at the end, not at 0.
    assert logs.append(chunk(job.id, 5 * block, b"more")) == 5 * block + 4
    with pytest.raises(LogGap):
        logs.append(chunk(job.id, 200, b"x", iid="i-b"))


def test_a_keep_below_one_chunk_is_one_chunk(store: SqlStore) -> None:
    assert JobLogRows(store.engine, keep_bytes=10).keep_bytes == MIN_KEEP_BYTES
    assert JobLogRows.of(object()) is None, "a store that is not SQL keeps no output"
    assert JobLogRows.of(store) is not None
