"""Contract tests of the SQL store, run on SQLite and on PostgreSQL."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import SQLModel

import spotd.store.sql as sql
from spotd.billing.ledger import ledger_so_far
from spotd.core.contracts import Store
from spotd.core.errors import BadCursor, JobNotFound, LostTransition, StoreError
from spotd.core.spec import JobSpec
from spotd.core.spec_io import parse_job_toml
from spotd.core.states import FailureCause, JobStatus, Transition
from spotd.core.values import (
    EMPTY_FACTS,
    AttemptClose,
    AttemptEnd,
    EventCause,
    EventFacts,
    ExitCause,
    InstanceReport,
    JobRecord,
    Market,
    NewAttempt,
    Pool,
)
from spotd.store import (
    SqlStore,
    downgrade_schema,
    open_store,
    schema_revision,
    upgrade_schema,
)

S = JobStatus
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
POOL_A = Pool("sim", "us-east-1", "us-east-1a", "p5.48xlarge")
POOL_B = Pool("sim", "eu-west-1", "eu-west-1b", "p4d.24xlarge")
R = TypeVar("R")


def make_spec(name: str = "t") -> JobSpec:
    return parse_job_toml(
        f'name = "{name}"\ncommand = ["true"]\n[resources]\ngpus = ["H100"]\ngpus_per_node = 1\n',
        source="t.toml",
        base_dir=Path("."),
    )


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def new_attempt(pool: Pool = POOL_A, market: Market = Market.SPOT) -> NewAttempt:
    return NewAttempt(
        pool=pool, market=market, nodes=2, price_per_node_hour=12.5, resume_from="s3://ck/1"
    )


CAUSE_OF: dict[JobStatus, EventCause | AttemptEnd] = {
    S.PENDING: EventCause.HELD,
    S.PROVISIONING: EventCause.PLACED,
    S.RUNNING: EventCause.RUNNING,
    S.CHECKPOINTING: EventCause.NOTICE,
    S.RECOVERING: AttemptEnd.PREEMPTED,
    S.SUCCEEDED: AttemptEnd.SUCCEEDED,
    S.FAILED: EventCause.NO_CAPACITY,
    S.CANCELLED: EventCause.CANCELLED,
}
"""A cause the engine could give a move to each status: causes are types, read back
as such, so a test writes real ones."""


def move(
    store: SqlStore,
    job_id: str,
    expected: JobStatus,
    new: JobStatus,
    when: datetime,
    **kw: object,
) -> None:
    store.compare_and_set(
        Transition(job_id, expected, new, cause=CAUSE_OF[new], **kw),  # type: ignore[arg-type]
        now=when,
    )


def race(fns: list[Callable[[], R]]) -> list[R | BaseException]:
    """Run each function in its own thread, released together; collect results."""
    barrier = threading.Barrier(len(fns))
    results: list[R | BaseException] = [RuntimeError("not run")] * len(fns)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fns[i]()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


# -- jobs ------------------------------------------------------------------


def test_create_and_get_job(store: SqlStore) -> None:
    spec = make_spec("train")
    job = store.create_job(spec, now=T0)

    assert re.fullmatch(r"j-[0-9a-f]{10}", job.id)
    assert (job.name, job.status, job.failure) == ("train", S.PENDING, None)
    assert (job.submitted_at, job.updated_at) == (T0, T0)
    assert (job.owner, job.lease_until) == (None, None)
    assert job.spec == spec
    assert store.get_job(job.id) == job
    [created] = store.events(job.id)
    assert (created.from_status, created.to_status, created.cause) == (None, S.PENDING, "submitted")
    assert created.at == T0
    assert store.attempts(job.id) == []


def test_get_unknown_job(store: SqlStore) -> None:
    with pytest.raises(JobNotFound):
        store.get_job("j-0000000000")
    assert store.events("j-0000000000") == []


def test_find_job_by_id_prefix_and_name(store: SqlStore) -> None:
    old = store.create_job(make_spec("alpha"), now=at(0))
    new = store.create_job(make_spec("alpha"), now=at(1))
    same_instant = store.create_job(make_spec("beta"), now=at(1))
    later_insert = store.create_job(make_spec("beta"), now=at(1))

    assert store.find_job(old.id).id == old.id
    assert store.find_job(new.id[:-1]).id == new.id
    assert store.find_job("alpha").id == new.id
    assert store.find_job("beta").id == later_insert.id
    assert same_instant.id != later_insert.id

    with pytest.raises(StoreError, match="ambiguous") as ambiguous:
        store.find_job("j-")
    assert ambiguous.type is StoreError
    assert old.id in str(ambiguous.value)
    with pytest.raises(JobNotFound):
        store.find_job("nope")
    with pytest.raises(JobNotFound):
        store.find_job("j-%")  # a LIKE wildcard is not a prefix of every id


def test_list_jobs_oldest_first_and_by_status(store: SqlStore) -> None:
    first = store.create_job(make_spec("a"), now=at(5))
    second = store.create_job(make_spec("b"), now=at(5))
    third = store.create_job(make_spec("c"), now=at(9))
    move(store, second.id, S.PENDING, S.CANCELLED, at(10))

    assert [j.id for j in store.list_jobs()] == [first.id, second.id, third.id]
    assert [j.id for j in store.list_jobs([S.PENDING])] == [first.id, third.id]
    assert [j.id for j in store.list_jobs({S.CANCELLED, S.FAILED})] == [second.id]
    assert store.list_jobs([]) == []


def _pages(
    store: SqlStore,
    limit: int,
    statuses: set[JobStatus] | None = None,
    team: str | None = None,
) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page = store.jobs_page(statuses=statuses, team=team, limit=limit, cursor=cursor)
        pages.append([j.id for j in page.jobs])
        if page.next is None:
            return pages
        cursor = page.next


def test_jobs_page_has_every_job_exactly_once_newest_first(store: SqlStore) -> None:
    # 23 jobs, four to each instant (a simulated clock submits many at once): the
    # order is (submitted_at, id) descending, ties split by id, across page ends.
    jobs = [store.create_job(make_spec(f"n{i}"), now=at(i // 4)) for i in range(23)]
    for j in jobs[::3]:
        move(store, j.id, S.PENDING, S.CANCELLED, at(30))
    newest_first = [j.id for j in sorted(jobs, key=lambda j: (j.submitted_at, j.id), reverse=True)]

    pages = _pages(store, 5)
    assert [len(p) for p in pages] == [5, 5, 5, 5, 3]
    assert [i for p in pages for i in p] == newest_first

    cancelled = [i for p in _pages(store, 4, {S.CANCELLED}) for i in p]
    assert cancelled == [i for i in newest_first if i in {j.id for j in jobs[::3]}]
    assert len(cancelled) == 8
    pending = [i for p in _pages(store, 100, {S.PENDING, S.RUNNING}) for i in p]
    assert sorted(pending) == sorted(set(newest_first) - set(cancelled))
    assert _pages(store, 3, {S.FAILED}) == [[]]


def test_jobs_page_filters_by_the_specs_team(store: SqlStore) -> None:
    def of(team: str | None, minute: int) -> JobRecord:
        base = make_spec()
        return store.create_job(base.model_copy(update={"team": team}), now=at(minute))

    ml = [of("ml", i) for i in range(0, 9, 2)]
    others = [of("vision", 1), of(None, 3), of("ml-ops", 5)]
    got = [i for p in _pages(store, 2, None) for i in p]
    assert len(got) == len(ml) + len(others)
    assert [i for p in _pages(store, 2, None, team="ml") for i in p] == [
        j.id for j in reversed(ml)
    ]
    move(store, ml[0].id, S.PENDING, S.CANCELLED, at(20))
    pending_ml = store.jobs_page(statuses={S.PENDING}, team="ml", limit=10).jobs
    assert [j.id for j in pending_ml] == [j.id for j in reversed(ml[1:])]
    assert store.jobs_page(team="nobody", limit=5).jobs == []


def test_jobs_page_filters_by_part_of_the_name_in_any_case(store: SqlStore) -> None:
    names = ["llm-Finetune", "llm-pretrain", "vision", "run_done", "runxdone"]
    jobs = {n: store.create_job(make_spec(n), now=at(i)) for i, n in enumerate(names)}

    def named(part: str, **kw: object) -> list[str]:
        page = store.jobs_page(limit=10, name=part, **kw)  # type: ignore[arg-type]
        return [j.name for j in page.jobs]

    assert named("LLM") == ["llm-pretrain", "llm-Finetune"]
    assert named("finetune") == ["llm-Finetune"]
    assert named("n_d") == ["run_done"], "LIKE's wildcard _ is matched as itself"
    assert named("nothing") == []
    move(store, jobs["llm-pretrain"].id, S.PENDING, S.CANCELLED, at(20))
    assert named("llm", statuses={S.PENDING}) == ["llm-Finetune"]
    first = store.jobs_page(limit=1, name="done")
    assert [j.name for j in first.jobs] == ["runxdone"] and first.next is not None
    rest = store.jobs_page(limit=1, name="done", cursor=first.next)
    assert [j.name for j in rest.jobs] == ["run_done"] and rest.next is None


def test_jobs_page_is_stable_while_jobs_arrive(store: SqlStore) -> None:
    old = [store.create_job(make_spec(), now=at(i)) for i in range(6)]
    first = store.jobs_page(limit=4)
    store.create_job(make_spec("late"), now=at(50))  # newer than the cursor: not on later pages
    rest = store.jobs_page(limit=4, cursor=first.next)
    assert first.next is not None and rest.next is None
    seen = [j.id for j in [*first.jobs, *rest.jobs]]
    assert seen == [j.id for j in reversed(old)]


def test_jobs_page_refuses_a_cursor_it_did_not_make_and_an_empty_page(store: SqlStore) -> None:
    store.create_job(make_spec(), now=at(0))
    for bad in ("nope", "WyJ4Il0", "WyIyMDI1LTAzLTAxVDEyOjAwOjAwIiwgImoiXQ"):  # junk, ["x"], naive
        with pytest.raises(BadCursor, match="not a job listing cursor") as refused:
            store.jobs_page(limit=2, cursor=bad)
        assert bad not in str(refused.value), "the cursor is not quoted back"
    with pytest.raises(StoreError, match="at least one job"):
        store.jobs_page(limit=0)


def test_an_idempotency_key_stores_one_job(store: SqlStore) -> None:
    first = store.create_job(make_spec("a"), now=at(0), idempotency_key="k-1")
    again = store.create_job(make_spec("a"), now=at(1), idempotency_key="k-1")
    assert again == first
    other = store.create_job(make_spec("a"), now=at(2), idempotency_key="k-2")
    keyless = [store.create_job(make_spec("a"), now=at(3)) for _ in range(2)]
    assert len({first.id, other.id, *(j.id for j in keyless)}) == 4
    assert [j.id for j in store.list_jobs()] == [first.id, other.id, *(j.id for j in keyless)]
    found = store.job_by_idempotency_key("k-2")
    assert found is not None and found.id == other.id
    assert store.job_by_idempotency_key("k-3") is None


def test_ledger_for_reads_many_jobs_lines_at_once(store: SqlStore) -> None:
    from spotd.core.values import LedgerEntry

    a, b, c = (store.create_job(make_spec(), now=at(0)) for _ in range(3))

    def line(job_id: str, attempt: int, usd: float) -> LedgerEntry:
        return LedgerEntry(
            job_id=job_id, attempt=attempt, provider="sim", region="r", zone="r-a",
            instance_type="t", gpu="H100", gpus=1, nodes=1, fabric="ethernet", market="spot",
            kind="compute", start=at(attempt), end=at(attempt + 1), billed_seconds=60.0,
            usd=usd, on_demand_usd=2 * usd, job_status="running",
        )  # fmt: skip

    store.replace_ledger(a.id, [line(a.id, 1, 1.0), line(a.id, 2, 2.0)])
    store.replace_ledger(b.id, [line(b.id, 1, 5.0)])
    got = store.ledger_for([a.id, b.id, c.id, "j-none"])
    assert {k: [e.usd for e in v] for k, v in got.items()} == {
        a.id: [1.0, 2.0], b.id: [5.0], c.id: [], "j-none": [],
    }  # fmt: skip
    assert got[a.id] == store.ledger(job_id=a.id)


def test_racing_submits_of_one_key_store_one_job(store: SqlStore) -> None:
    results = race([
        partial(store.create_job, make_spec("r"), now=at(0), idempotency_key="same")
        for _ in range(4)
    ])  # fmt: skip
    ids = {r.id for r in results if isinstance(r, JobRecord)}
    assert len(ids) == 1, results
    assert [j.id for j in store.list_jobs()] == list(ids)


# -- compare-and-set -----------------------------------------------------------


def test_compare_and_set_writes_event_and_opens_attempt(store: SqlStore) -> None:
    job = store.create_job(make_spec(), now=T0)
    change = Transition(
        job.id,
        S.PENDING,
        S.PROVISIONING,
        cause="placed",
        detail="p5 spot",
        open_attempt=new_attempt(),
    )
    updated = store.compare_and_set(change, now=at(1))

    assert (updated.status, updated.updated_at, updated.submitted_at) == (S.PROVISIONING, at(1), T0)
    assert store.get_job(job.id) == updated
    last = store.events(job.id)[-1]
    assert (last.from_status, last.to_status, last.cause, last.detail, last.at) == (
        S.PENDING,
        S.PROVISIONING,
        "placed",
        "p5 spot",
        at(1),
    )
    [attempt] = store.attempts(job.id)
    assert (attempt.seq, attempt.client_token, attempt.instance_ids) == (1, f"{job.id}-a1", ())
    assert (attempt.started_at, attempt.running_at, attempt.ended_at) == (at(1), None, None)
    assert attempt.open and attempt.end_reason is None
    assert attempt.resume_from == "s3://ck/1"


def test_compare_and_set_closes_and_opens_in_one_transaction(store: SqlStore) -> None:
    job = store.create_job(make_spec(), now=T0)
    move(store, job.id, S.PENDING, S.PROVISIONING, at(1), open_attempt=new_attempt())
    first = store.attempts(job.id)[0]

    store.compare_and_set(
        Transition(
            job.id,
            S.PROVISIONING,
            S.RECOVERING,
            cause=AttemptEnd.MIGRATED,
            close_attempt=AttemptClose(first.id, AttemptEnd.MIGRATED),
            open_attempt=new_attempt(POOL_B, Market.ON_DEMAND),
        ),
        now=at(2),
    )

    closed, opened = store.attempts(job.id)
    assert (closed.ended_at, closed.end_reason) == (at(2), AttemptEnd.MIGRATED)
    assert (opened.seq, opened.pool, opened.market, opened.started_at) == (
        2,
        POOL_B,
        Market.ON_DEMAND,
        at(2),
    )
    assert opened.open
    assert [e.to_status for e in store.events(job.id)] == [S.PENDING, S.PROVISIONING, S.RECOVERING]


def test_failure_cause_is_stored(store: SqlStore) -> None:
    job = store.create_job(make_spec(), now=T0)
    move(store, job.id, S.PENDING, S.FAILED, at(1), failure=FailureCause.NO_CAPACITY)
    assert store.get_job(job.id).failure is FailureCause.NO_CAPACITY


@pytest.mark.parametrize(
    "close",
    [
        pytest.param(lambda own, other: AttemptClose(other, AttemptEnd.LOST), id="other-jobs"),
        pytest.param(lambda own, other: AttemptClose(own, AttemptEnd.LOST), id="already-closed"),
        pytest.param(lambda own, other: AttemptClose(999_999, AttemptEnd.LOST), id="unknown"),
    ],
)
def test_bad_attempt_close_applies_nothing(
    store: SqlStore, close: Callable[[int, int], AttemptClose]
) -> None:
    job = store.create_job(make_spec(), now=T0)
    other = store.create_job(make_spec(), now=T0)
    move(store, job.id, S.PENDING, S.PROVISIONING, at(1), open_attempt=new_attempt())
    move(store, other.id, S.PENDING, S.PROVISIONING, at(1), open_attempt=new_attempt())
    own_id = store.attempts(job.id)[0].id
    move(
        store,
        job.id,
        S.PROVISIONING,
        S.RECOVERING,
        at(2),
        close_attempt=AttemptClose(own_id, AttemptEnd.NO_CAPACITY),
    )
    before = (store.get_job(job.id), store.events(job.id), store.attempts(job.id))

    with pytest.raises(StoreError, match="not an open attempt"):
        store.compare_and_set(
            Transition(
                job.id,
                S.RECOVERING,
                S.PROVISIONING,
                cause=EventCause.PLACED,
                close_attempt=close(own_id, store.attempts(other.id)[0].id),
                open_attempt=new_attempt(),
            ),
            now=at(3),
        )

    assert (store.get_job(job.id), store.events(job.id), store.attempts(job.id)) == before
    assert store.attempts(other.id)[0].open


def test_lost_transition_names_job_and_statuses(store: SqlStore) -> None:
    job = store.create_job(make_spec(), now=T0)
    move(store, job.id, S.PENDING, S.CANCELLED, at(1))
    before = store.events(job.id)

    with pytest.raises(LostTransition) as lost:
        move(store, job.id, S.PENDING, S.PROVISIONING, at(2), open_attempt=new_attempt())

    message = str(lost.value)
    assert job.id in message and "pending" in message and "cancelled" in message
    assert store.get_job(job.id).status is S.CANCELLED
    assert store.events(job.id) == before
    assert store.attempts(job.id) == []


def test_compare_and_set_unknown_job(store: SqlStore) -> None:
    with pytest.raises(JobNotFound):
        move(store, "j-0000000000", S.PENDING, S.CANCELLED, T0)


def test_a_waiting_reason_is_written_once_with_its_event_and_cleared_by_a_move(
    store: SqlStore,
) -> None:
    job = store.create_job(make_spec(), now=T0)
    assert job.waiting is None
    assert store.set_waiting(job.id, S.PENDING, "no spot capacity", now=at(1))
    waiting = store.get_job(job.id)
    assert waiting.waiting == "no spot capacity"
    # The version counts it (the engine reads the record again); updated_at is when the
    # status last changed, and stays (scheduling.no_capacity_timeout_hours counts from it).
    assert (waiting.version, waiting.updated_at) == (job.version + 1, T0)
    last = store.events(job.id)[-1]
    assert (last.at, last.from_status, last.to_status, last.cause, last.detail) == (
        at(1), S.PENDING, S.PENDING, "waiting", "no spot capacity",
    )  # fmt: skip
    # The same reason again, or a job no longer in that status: nothing is written.
    assert not store.set_waiting(job.id, S.PENDING, "no spot capacity", now=at(2))
    assert not store.set_waiting(job.id, S.RECOVERING, "other", now=at(2))
    assert len(store.events(job.id)) == 2
    assert store.get_job(job.id).version == waiting.version
    assert store.set_waiting(job.id, S.PENDING, "team full", now=at(3), cause=EventCause.HELD)
    assert store.events(job.id)[-1].cause is EventCause.HELD
    # A change of status clears it.
    move(store, job.id, S.PENDING, S.PROVISIONING, at(4), open_attempt=new_attempt())
    assert store.get_job(job.id).waiting is None


# -- event causes and facts -------------------------------------------------------


def test_events_keep_their_typed_cause_and_facts(store: SqlStore) -> None:
    """Causes come back as the enum they were written as (an attempt end or an event
    cause), and facts field for field; an event without facts stores SQL null."""
    job = store.create_job(make_spec(), now=T0)
    move(store, job.id, S.PENDING, S.PROVISIONING, at(1), open_attempt=new_attempt())
    [attempt] = store.attempts(job.id)
    facts = EventFacts(exit_code=137, signal=9, node="i-0ab", rank=1, provider="sim")
    store.compare_and_set(
        Transition(job.id, S.PROVISIONING, S.FAILED, AttemptEnd.USER_FAILED, "command failed",
                   failure=FailureCause.USER_COMMAND_FAILED, facts=facts,
                   close_attempt=AttemptClose(attempt.id, AttemptEnd.USER_FAILED, 137)),
        now=at(2),
    )  # fmt: skip

    created, placed, failed = store.events(job.id)
    assert created.cause is EventCause.SUBMITTED and created.facts == EMPTY_FACTS
    assert placed.cause is EventCause.PLACED and placed.facts == EMPTY_FACTS
    assert failed.cause is AttemptEnd.USER_FAILED
    assert failed.facts == facts and failed.facts.signal_name == "SIGKILL"
    with store.engine.connect() as conn:
        stored = conn.execute(
            text("SELECT facts FROM events WHERE job_id = :j ORDER BY id"), {"j": job.id}
        ).scalars().all()  # fmt: skip
    assert stored[:2] == [None, None], "no facts: SQL null, not a JSON null or {}"


def test_launch_error_facts_round_trip(store: SqlStore) -> None:
    job = store.create_job(make_spec(), now=T0)
    facts = EventFacts(error_class="CapacityError", error_code="provider-capacity",
                       provider="sim", provider_code="InsufficientInstanceCapacity")  # fmt: skip
    move(store, job.id, S.PENDING, S.PROVISIONING, at(1), open_attempt=new_attempt())
    [attempt] = store.attempts(job.id)
    store.compare_and_set(
        Transition(job.id, S.PROVISIONING, S.RECOVERING, AttemptEnd.NO_CAPACITY, facts=facts,
                   close_attempt=AttemptClose(attempt.id, AttemptEnd.NO_CAPACITY)),
        now=at(2),
    )  # fmt: skip
    last = store.events(job.id)[-1]
    assert (last.cause, last.facts) == (AttemptEnd.NO_CAPACITY, facts)


def _raw_event(store: SqlStore, job_id: str, cause: str, facts: str | None) -> None:
    """An event row as another version of spotd could have written it."""
    with store.engine.begin() as conn:
        conn.execute(
            text("INSERT INTO events (job_id, at, to_status, cause, detail, facts)"
                 " VALUES (:j, :at, 'pending', :cause, '', :facts)"),
            {"j": job_id, "at": at(5).replace(tzinfo=None), "cause": cause, "facts": facts},
        )  # fmt: skip


def test_facts_a_newer_spotd_added_are_skipped(store: SqlStore) -> None:
    job = store.create_job(make_spec(), now=T0)
    _raw_event(store, job.id, "held", '{"exit_code": 3, "gpu_xid": 79}')
    assert store.events(job.id)[-1].facts == EventFacts(exit_code=3)


@pytest.mark.parametrize(
    ("cause", "facts", "said"),
    [
        pytest.param("from the future", None, "'from the future' is no event cause", id="cause"),
        pytest.param("held", '{"exit_code": "3"}', "exit_code is '3', expected int", id="fact"),
    ],
)
def test_an_event_this_spotd_cannot_read_is_a_store_error(
    store: SqlStore, cause: str, facts: str | None, said: str
) -> None:
    """Not a cause of another type, nor a string that no code matches: a clear error
    naming the event and its job."""
    job = store.create_job(make_spec(), now=T0)
    _raw_event(store, job.id, cause, facts)
    with pytest.raises(StoreError, match=re.escape(said)) as error:
        store.events(job.id)
    assert error.value.job_id == job.id and "newer spotd" in str(error.value)


def test_event_facts_survive_the_migration_down_and_up(empty_store_url: str) -> None:
    """Down to 0001 drops the facts and keeps the events; up again reads them empty."""
    store = open_store(empty_store_url)
    try:
        job = store.create_job(make_spec(), now=T0)
        move(store, job.id, S.PENDING, S.CANCELLED, at(1))
        downgrade_schema(store.engine, "0001")
        columns = {c["name"] for c in inspect(store.engine).get_columns("events")}
        assert "facts" not in columns and "cause" in columns
        upgrade_schema(store.engine)
        assert schema_revision(store.engine) == LATEST
        assert [(e.cause, e.facts) for e in store.events(job.id)] == [
            (EventCause.SUBMITTED, EMPTY_FACTS), (EventCause.CANCELLED, EMPTY_FACTS),
        ]  # fmt: skip
    finally:
        store.close()


def test_concurrent_writers_exactly_one_wins(store_url: str) -> None:
    first, second = stores = open_store(store_url), open_store(store_url)
    try:
        jobs = [first.create_job(make_spec(), now=T0) for _ in range(6)]
        for job in jobs:
            results = race([partial(_place, s, job.id) for s in stores])
            winners = [r for r in results if not isinstance(r, BaseException)]
            losers = [r for r in results if isinstance(r, BaseException)]
            assert len(winners) == 1, results
            assert len(losers) == 1 and isinstance(losers[0], LostTransition), results
            assert len(first.events(job.id)) == 2
            assert len(second.attempts(job.id)) == 1
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("write", ["instances", "running"])
def test_attempt_writes_lock_the_job_first_like_a_transition(store_url: str, write: str) -> None:
    """A transition locks the job's row, then its attempt's (a cancel closing the
    attempt); the attempt writes must take the same order, or the two deadlock."""
    store = open_store(store_url)
    try:
        job = store.create_job(make_spec(), now=T0)
        move(store, job.id, S.PENDING, S.PROVISIONING, at(0), open_attempt=new_attempt())
        attempt_id = store.attempts(job.id)[0].id
        with store.engine.connect() as transition:
            transition.begin()
            transition.execute(text("SELECT id FROM jobs WHERE id = :j FOR UPDATE"), {"j": job.id})
            if write == "instances":
                writer = partial(store.set_attempt_instances, attempt_id, ["i-1"])
            else:
                writer = partial(store.mark_attempt_running, attempt_id, at=at(1))
            done: list[BaseException | None] = []

            def run() -> None:
                try:
                    writer()
                    done.append(None)
                except BaseException as exc:
                    done.append(exc)

            thread = threading.Thread(target=run)
            thread.start()
            thread.join(timeout=0.5)  # the writer now waits for the job's row
            transition.execute(
                text("UPDATE attempts SET end_reason = 'cancelled' WHERE id = :a"),
                {"a": attempt_id},
            )
            transition.commit()
        thread.join(timeout=30)
        assert done == [None], done
    finally:
        store.close()


def _place(store: SqlStore, job_id: str) -> JobRecord:
    change = Transition(job_id, S.PENDING, S.PROVISIONING, EventCause.PLACED,
                        open_attempt=new_attempt())  # fmt: skip
    return store.compare_and_set(change, now=at(1))


def test_writer_waits_for_the_other_transaction_then_loses(store_url: str) -> None:
    first, second = open_store(store_url), open_store(store_url)
    try:
        job = first.create_job(make_spec(), now=T0)
        outcome: list[object] = []
        with first.engine.begin() as held:
            # Another writer's transaction has changed the row but not committed.
            held.execute(
                text("UPDATE jobs SET status = 'cancelled' WHERE id = :id"), {"id": job.id}
            )
            waiter = threading.Thread(
                target=lambda: outcome.append(_outcome(partial(_place, second, job.id)))
            )
            waiter.start()
            waiter.join(timeout=0.5)
            assert waiter.is_alive(), f"did not wait for the row lock: {outcome}"
        waiter.join(timeout=30)
        assert len(outcome) == 1 and isinstance(outcome[0], LostTransition), outcome
        assert "cancelled" in str(outcome[0])
        assert second.attempts(job.id) == []
        assert len(second.events(job.id)) == 1
    finally:
        first.close()
        second.close()


def _outcome(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except Exception as exc:
        return exc


# -- attempts --------------------------------------------------------------------


def test_attempt_history_reconstructs_cost(store: SqlStore) -> None:
    job = store.create_job(make_spec(), now=T0)
    move(store, job.id, S.PENDING, S.PROVISIONING, at(0), open_attempt=new_attempt())
    [one] = store.attempts(job.id)
    store.set_attempt_instances(one.id, ["i-1", "i-2"])
    store.mark_attempt_running(one.id, at=at(3))
    move(store, job.id, S.PROVISIONING, S.RUNNING, at(3))
    move(store, job.id, S.RUNNING, S.CHECKPOINTING, at(58))
    move(
        store,
        job.id,
        S.CHECKPOINTING,
        S.RECOVERING,
        at(60),
        close_attempt=AttemptClose(one.id, AttemptEnd.PREEMPTED),
    )
    move(
        store,
        job.id,
        S.RECOVERING,
        S.PROVISIONING,
        at(61),
        open_attempt=new_attempt(POOL_B, Market.ON_DEMAND),
    )
    two = store.attempts(job.id)[1]
    store.set_attempt_instances(two.id, ["i-3", "i-4"])
    store.mark_attempt_running(two.id, at=at(65))
    move(store, job.id, S.PROVISIONING, S.RUNNING, at(65))
    move(
        store,
        job.id,
        S.RUNNING,
        S.SUCCEEDED,
        at(91),
        close_attempt=AttemptClose(two.id, AttemptEnd.SUCCEEDED),
    )

    one, two = store.attempts(job.id)
    assert [a.seq for a in (one, two)] == [1, 2]
    assert (one.pool, one.market, one.instance_ids) == (POOL_A, Market.SPOT, ("i-1", "i-2"))
    assert (one.started_at, one.running_at, one.ended_at) == (at(0), at(3), at(60))
    assert one.end_reason is AttemptEnd.PREEMPTED
    assert (two.pool, two.market, two.client_token) == (POOL_B, Market.ON_DEMAND, f"{job.id}-a2")
    assert (two.started_at, two.running_at, two.ended_at) == (at(61), at(65), at(91))
    assert two.end_reason is AttemptEnd.SUCCEEDED
    # 2 nodes at $12.50 per node-hour: 60 min + 30 min, by the ledger's rules, and the
    # checkpoint's move from us-east-1 to eu-west-1.
    lines = ledger_so_far(job, [one, two], (), at(91))
    assert sum(e.usd for e in lines if e.kind != "egress") == pytest.approx(25.0 + 12.5)
    assert [e.attempt for e in lines if e.kind == "egress"] == [2]
    assert [e.to_status for e in store.events(job.id)] == [
        S.PENDING,
        S.PROVISIONING,
        S.RUNNING,
        S.CHECKPOINTING,
        S.RECOVERING,
        S.PROVISIONING,
        S.RUNNING,
        S.SUCCEEDED,
    ]


def test_attempt_updates(store: SqlStore) -> None:
    job = store.create_job(make_spec(), now=T0)
    move(store, job.id, S.PENDING, S.PROVISIONING, at(0), open_attempt=new_attempt())
    attempt_id = store.attempts(job.id)[0].id
    versions = [store.get_job(job.id).version]

    def changed() -> bool:
        versions.append(store.get_job(job.id).version)
        return versions[-1] != versions[-2]

    store.set_attempt_instances(attempt_id, ["i-a"])
    assert changed()
    store.set_attempt_instances(attempt_id, ["i-b", "i-c"])
    assert changed()
    store.mark_attempt_running(attempt_id, at=at(2))
    assert changed()
    store.mark_attempt_running(attempt_id, at=at(7))  # the first time stays
    assert not changed()
    store.claim_jobs("me", now=at(8), lease_seconds=60)
    assert not changed(), "a lease renewal changes neither the job nor its attempts"

    [attempt] = store.attempts(job.id)
    assert (attempt.instance_ids, attempt.running_at) == (("i-b", "i-c"), at(2))
    with pytest.raises(StoreError, match="no attempt"):
        store.set_attempt_instances(999_999, ["i-x"])
    with pytest.raises(StoreError, match="no attempt"):
        store.mark_attempt_running(999_999, at=at(3))


def test_datetimes_come_back_aware_utc(store: SqlStore) -> None:
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2025, 3, 1, 14, 0, tzinfo=plus_two)
    job = store.create_job(make_spec(), now=local)
    move(store, job.id, S.PENDING, S.PROVISIONING, local, open_attempt=new_attempt())
    attempt_id = store.attempts(job.id)[0].id
    store.mark_attempt_running(attempt_id, at=local)
    move(
        store,
        job.id,
        S.PROVISIONING,
        S.CANCELLED,
        local,
        close_attempt=AttemptClose(attempt_id, AttemptEnd.CANCELLED),
    )
    store.create_job(make_spec(), now=local)
    store.claim_jobs("d1", now=local, lease_seconds=30)

    got = store.get_job(job.id)
    [attempt] = store.attempts(job.id)
    stamps = [
        got.submitted_at,
        got.updated_at,
        attempt.started_at,
        attempt.running_at,
        attempt.ended_at,
        *(e.at for e in store.events(job.id)),
        *(j.lease_until for j in store.list_jobs([S.PENDING])),
    ]
    for stamp in stamps:
        assert stamp is not None and stamp.tzinfo is UTC, stamp
        assert stamp == T0 + (timedelta(seconds=30) if stamp > T0 else timedelta(0))


def test_naive_datetime_is_refused(store: SqlStore) -> None:
    with pytest.raises(StoreError, match="naive"):
        store.create_job(make_spec(), now=datetime(2025, 1, 1))
    assert store.list_jobs() == []


def test_client_token_is_unique(store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    one = store.create_job(make_spec(), now=T0)
    two = store.create_job(make_spec(), now=T0)
    move(store, one.id, S.PENDING, S.PROVISIONING, at(1), open_attempt=new_attempt())
    token = store.attempts(one.id)[0].client_token

    with store.engine.connect() as conn, pytest.raises(IntegrityError):
        conn.execute(
            text(
                "INSERT INTO attempts (job_id, seq, provider, region, zone, instance_type,"
                " market, nodes, price_per_node_hour, client_token, instance_ids, started_at)"
                " VALUES (:job, 1, 'p', 'r', 'z', 't', 'spot', 1, 1.0, :token, '[]', :at)"
            ),
            {"job": two.id, "token": token, "at": T0.replace(tzinfo=None)},
        )

    # Our own conflict surfaces as a StoreError, and the whole transition rolls back.
    monkeypatch.setattr(sql, "client_token", lambda job_id, seq: token)
    with pytest.raises(StoreError) as conflict:
        move(store, two.id, S.PENDING, S.PROVISIONING, at(2), open_attempt=new_attempt())
    assert isinstance(conflict.value.__cause__, IntegrityError)
    assert store.get_job(two.id).status is S.PENDING
    assert store.attempts(two.id) == []
    assert len(store.events(two.id)) == 1


# -- leases ------------------------------------------------------------------------


def test_claim_jobs_leases(store: SqlStore) -> None:
    a = store.create_job(make_spec("a"), now=T0)
    b = store.create_job(make_spec("b"), now=T0)
    done = store.create_job(make_spec("done"), now=T0)
    move(store, done.id, S.PENDING, S.CANCELLED, T0)
    both = sorted([a.id, b.id])

    assert store.claim_jobs("d1", now=at(0), lease_seconds=60) == both
    assert store.claim_jobs("d2", now=at(0.5), lease_seconds=60) == []
    # Renewal extends d1's lease past the time it would have run out.
    assert store.claim_jobs("d1", now=at(0.9), lease_seconds=60) == both
    assert store.get_job(a.id).lease_until == at(1.9)
    assert store.claim_jobs("d2", now=at(1.5), lease_seconds=60) == []
    # Expired: d2 takes over and d1 no longer holds anything.
    assert store.claim_jobs("d2", now=at(2), lease_seconds=60) == both
    assert (store.get_job(b.id).owner, store.get_job(b.id).lease_until) == ("d2", at(3))
    assert store.claim_jobs("d1", now=at(2.5), lease_seconds=60) == []
    # A job that ends is not claimed again.
    move(store, a.id, S.PENDING, S.CANCELLED, at(2.6))
    assert store.claim_jobs("d2", now=at(2.7), lease_seconds=60) == [b.id]
    assert store.claim_jobs("d1", now=at(10), lease_seconds=60) == [b.id]
    assert store.get_job(done.id).owner is None


def test_claim_jobs_concurrently_is_exclusive(store_url: str) -> None:
    first, second = open_store(store_url), open_store(store_url)
    try:
        ids = {first.create_job(make_spec(), now=T0).id for _ in range(30)}
        for round_ in range(3):
            now = at(10 * round_)  # each round starts after the last leases ran out
            mine, theirs = race(
                [
                    partial(s.claim_jobs, owner, now=now, lease_seconds=60)
                    for s, owner in ((first, "d1"), (second, "d2"))
                ]
            )
            assert isinstance(mine, list) and isinstance(theirs, list), (mine, theirs)
            assert set(mine).isdisjoint(theirs)
            assert set(mine) | set(theirs) == ids
    finally:
        first.close()
        second.close()


# -- schema ----------------------------------------------------------------------

LATEST = "0008"


def test_the_migrations_make_the_schema_of_the_tables(empty_store_url: str) -> None:
    """From an empty database, the migrations make exactly the schema ``tables.py``
    declares: alembic finds no table, column, type, nullability, index, unique or
    foreign key to add, drop or change."""
    store = open_store(empty_store_url)
    try:
        assert schema_revision(store.engine) == LATEST
        names = set(inspect(store.engine).get_table_names())
        assert names == set(SQLModel.metadata.tables) | {"alembic_version"}
        with store.engine.connect() as conn:
            drift = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
        assert drift == []
    finally:
        store.close()


def test_migrations_rerun_as_no_op_and_go_down_and_up_again(empty_store_url: str) -> None:
    store = open_store(empty_store_url)
    try:
        job = store.create_job(make_spec(), now=T0)
    finally:
        store.close()

    again = open_store(empty_store_url)
    try:
        assert schema_revision(again.engine) == LATEST
        assert again.get_job(job.id).id == job.id

        downgrade_schema(again.engine, "base")
        assert schema_revision(again.engine) is None
        assert set(inspect(again.engine).get_table_names()) <= {"alembic_version"}

        upgrade_schema(again.engine)
        assert again.list_jobs() == []
    finally:
        again.close()


def test_each_test_gets_a_migrated_database_of_its_own(store: SqlStore) -> None:
    """The fixtures copy one migrated template: at the newest revision, with nothing in
    it that another test wrote."""
    assert schema_revision(store.engine) == LATEST
    assert store.list_jobs() == []
    assert store.report_changes(0)[0] == []


def test_attempts_keep_their_work_rate(store: SqlStore) -> None:
    """An attempt keeps what it does per hour, the checkpoint interval and whether a
    notice saves its work; one placed without them reads them as None."""
    bare = store.create_job(make_spec(), now=T0)
    move(store, bare.id, JobStatus.PENDING, JobStatus.PROVISIONING, at(1),
         open_attempt=new_attempt())  # fmt: skip
    (old,) = store.attempts(bare.id)
    assert (old.work_per_hour, old.checkpoint_interval_hours, old.saves_on_notice) == (
        None, None, None,
    )  # fmt: skip

    job = store.create_job(make_spec(), now=T0)
    placed = NewAttempt(
        pool=POOL_A, market=Market.SPOT, nodes=1, price_per_node_hour=1.0,
        resume_from=None, work_per_hour=0.7, checkpoint_interval_hours=0.4,
        saves_on_notice=True,
    )  # fmt: skip
    move(store, job.id, JobStatus.PENDING, JobStatus.PROVISIONING, at(1), open_attempt=placed)
    (mine,) = store.attempts(job.id)
    assert (mine.work_per_hour, mine.checkpoint_interval_hours, mine.saves_on_notice) == (
        0.7, 0.4, True,
    )  # fmt: skip


@pytest.mark.parametrize("empty_store_url", ["sqlite"], indirect=True)
def test_sqlite_setup(empty_store_url: str) -> None:
    """WAL for readers beside the writer, a long busy timeout, enforced foreign keys,
    and the database's folder created."""
    store = open_store(empty_store_url)
    try:
        assert Path(empty_store_url.removeprefix("sqlite:///")).is_file()
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
            with pytest.raises(IntegrityError, match="FOREIGN KEY"):
                conn.execute(
                    text(
                        "INSERT INTO events (job_id, at, to_status, cause, detail)"
                        " VALUES ('j-missing', '2025-01-01 00:00:00', 'pending', 'x', '')"
                    )
                )
    finally:
        store.close()


def test_is_a_store(store: SqlStore) -> None:
    """mypy checks the assignment: SqlStore has every method of the Store protocol."""
    as_protocol: Store = store
    assert as_protocol is store


def test_a_failed_job_keeps_the_facts_of_the_event_that_failed_it(store: SqlStore) -> None:
    """Why it failed, typed, on the job itself (its status and the dashboard read it
    without its events); any other job has none, and so does a job failed by a
    transition without facts."""
    job = store.create_job(make_spec(), now=T0)
    facts = EventFacts(exit_code=127, exit_cause=ExitCause.NOT_FOUND, node="i-1",
                       provider="aws")  # fmt: skip
    move(store, job.id, S.PENDING, S.PROVISIONING, at(1), open_attempt=new_attempt(),
         facts=EventFacts(provider="aws"))  # fmt: skip
    assert store.get_job(job.id).failure_facts == EMPTY_FACTS
    move(store, job.id, S.PROVISIONING, S.FAILED, at(2),
         failure=FailureCause.USER_COMMAND_FAILED, facts=facts)  # fmt: skip
    failed = store.get_job(job.id)
    assert failed.failure_facts == facts and failed.failure_facts.exit_cause is ExitCause.NOT_FOUND
    assert store.list_jobs([S.FAILED])[0].failure_facts == facts
    bare = store.create_job(make_spec(), now=T0)
    move(store, bare.id, S.PENDING, S.FAILED, at(1), failure=FailureCause.OVER_BUDGET)
    assert store.get_job(bare.id).failure_facts == EMPTY_FACTS


def test_an_exit_report_keeps_the_agents_count_of_oom_kills(store: SqlStore) -> None:
    job = store.create_job(make_spec(), now=T0)
    store.save_report(InstanceReport("i-1", "aws", job.id, 1, heartbeat_at=at(1)))
    assert store.reports(job.id)[0].oom_kills is None
    store.save_report(InstanceReport("i-1", "aws", job.id, 1, exit_code=137, oom_kills=1))
    (kept,) = store.reports(job.id)
    assert (kept.exit_code, kept.oom_kills, kept.heartbeat_at) == (137, 1, at(1))


def test_gang_reports_merge_and_sum(store: SqlStore) -> None:
    """What a gang's agents report: GPU samples add up, other fields replace, and a
    report of a heartbeat alone leaves the rest None."""
    job = store.create_job(make_spec(), now=T0)
    store.save_report(InstanceReport("i-old", "aws", job.id, 1, heartbeat_at=at(1)))
    (old,) = store.reports(job.id)
    assert (old.heartbeat_at, old.address, old.gpu_samples) == (at(1), None, None)

    beat = InstanceReport("i-1", "aws", job.id, 1, heartbeat_at=at(2), step=10,
                          gpu_util_sum=90.0, gpu_samples=1, gpu_low_samples=0)  # fmt: skip
    store.save_report(InstanceReport("i-1", "aws", job.id, 1, address="10.0.0.1",
                                     ports="29500,29501", joined_at=at(1)))  # fmt: skip
    # Asked again: the join stays the first ask's.
    store.save_report(InstanceReport("i-1", "aws", job.id, 1, joined_at=at(4)))
    store.save_report(beat)
    store.save_report(replace(beat, heartbeat_at=at(3), step=20, gpu_util_sum=40.0,
                              gpu_low_samples=1))  # fmt: skip
    (mine,) = [r for r in store.reports(job.id) if r.instance_id == "i-1"]
    assert (mine.address, mine.ports, mine.step) == ("10.0.0.1", "29500,29501", 20)
    assert mine.joined_at == at(1)
    assert (mine.gpu_samples, mine.gpu_low_samples) == (2, 1)
    assert mine.gpu_util_mean_pct == 65.0
