"""The :class:`~spotd.core.contracts.Store` on SQLAlchemy: SQLite or PostgreSQL.

Every write is one transaction. A change of status is a guarded ``UPDATE ...
WHERE status = :expected``, so two daemons (or two threads) racing on one job
cannot both win, and the event and attempt rows that go with it commit or
roll back together with it.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    and_,
    cast,
    create_engine,
    event,
    func,
    insert,
    or_,
    select,
    text,
    tuple_,
    type_coerce,
    union,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError, StatementError

from spotd.core.contracts import JobPage
from spotd.core.errors import BadCursor, JobNotFound, LostTransition, StoreError
from spotd.core.spec import JobSpec, spec_to_json
from spotd.core.states import ACTIVE, WAITING_CAUSE, JobStatus, Transition
from spotd.core.values import (
    AttemptClose,
    AttemptRecord,
    EventRecord,
    InstanceReport,
    JobRecord,
    LedgerEntry,
    NewAttempt,
    Offering,
    Pool,
    PricePoint,
)
from spotd.store import history, ledger_sql, sessions
from spotd.store.rows import attempt_record, chunks, event_record, job_record
from spotd.store.tables import (
    ATTEMPTS,
    EVENTS,
    JOBS,
    LEASES,
    LEDGER,
    UtcDateTime,
    conflict_insert,
)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
"""The alembic script folder, found next to this module so it works from a wheel."""

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another writer's lock before failing."""

_PG_MIGRATION_LOCK = 0x5350_4F54_4400
"""Advisory lock key that serialises migrations of daemons sharing a database."""

_PG_CLAIM_LOCK = 0x5350_4F54_4401
"""Advisory lock key that serialises the lease claims of daemons sharing a database."""

_WRITE = "spotd_write"
"""Execution option marking a transaction that will write (see ``_sqlite_begin``)."""

_ACTIVE = tuple(s.value for s in ACTIVE)

HELD_BY_OWNER = datetime(9999, 1, 1, tzinfo=UTC)
"""``jobs.lease_until`` of a job held by its owner's row in ``owner_leases``: far
enough ahead that a daemon of a version before that table never takes the job."""


def new_job_id() -> str:
    """A fresh job id: ``j-`` and 10 hex digits."""
    return "j-" + uuid.uuid4().hex[:10]


def client_token(job_id: str, seq: int) -> str:
    """The launch idempotency token of attempt ``seq`` of a job."""
    return f"{job_id}-a{seq}"


# -- engine and schema -------------------------------------------------------


def open_store(url: str) -> SqlStore:
    """Connect to ``url``, bring the schema to the newest revision, return the store.

    ``url`` is ``sqlite:///path/to/spotd.db`` (the folder is created) or
    ``postgresql+psycopg://user@host/db``.
    """
    engine = make_engine(url)
    try:
        upgrade_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return SqlStore(engine)


def make_engine(url: str) -> Engine:
    """An engine for ``url``, with SQLite set up for several processes at once."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True)
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, connect_args={"check_same_thread": False})
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # sqlite3's own BEGIN handling skips SELECTs and DDL; we emit BEGIN ourselves.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    # A writer takes the write lock up front: a deferred transaction that read
    # first cannot wait for the lock later (SQLITE_BUSY at once under WAL).
    immediate = conn.get_execution_options().get(_WRITE, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def alembic_config(connection: Connection | None = None) -> Config:
    """An alembic config for the packaged migrations, bound to ``connection``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_schema(engine: Engine, revision: str = "head") -> None:
    """Migrate the database up to ``revision``; a no-op when it is there already."""
    with _db_errors(), engine.execution_options(**{_WRITE: True}).begin() as conn:
        _lock_migrations(conn)
        command.upgrade(alembic_config(conn), revision)


def downgrade_schema(engine: Engine, revision: str = "base") -> None:
    """Migrate the database down to ``revision`` (``base`` drops every table)."""
    with _db_errors(), engine.execution_options(**{_WRITE: True}).begin() as conn:
        _lock_migrations(conn)
        command.downgrade(alembic_config(conn), revision)


def schema_revision(engine: Engine) -> str | None:
    """The revision the database is at, None when it was never migrated."""
    with _db_errors(), engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _lock_migrations(conn: Connection) -> None:
    # Two daemons starting at once on one PostgreSQL must not both create tables.
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})


@contextmanager
def _db_errors() -> Iterator[None]:
    """Turn database errors into :class:`StoreError`, keeping the cause."""
    try:
        yield
    except IntegrityError as exc:
        raise StoreError(f"store conflict: {exc.orig}") from exc
    except StatementError as exc:
        # Our own type refused a value (a naive datetime): pass its message on.
        if isinstance(exc.orig, StoreError):
            raise StoreError(str(exc.orig)) from exc
        raise StoreError(f"store error: {exc}") from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"store error: {exc}") from exc


# -- the store ---------------------------------------------------------------


class SqlStore:
    """Jobs, events and attempts in a SQL database (see :func:`open_store`)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = engine.execution_options(**{_WRITE: True})
        self._postgres = engine.dialect.name == "postgresql"

    @property
    def engine(self) -> Engine:
        """The engine, for migrations and tests."""
        return self._engine

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with _db_errors(), self._engine.begin() as conn:
            yield conn

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with _db_errors(), self._writer.begin() as conn:
            yield conn

    # jobs

    def create_job(
        self, spec: JobSpec, *, now: datetime, idempotency_key: str | None = None
    ) -> JobRecord:
        """Insert a new PENDING job (and its first event).

        With an ``idempotency_key`` another job already holds, nothing is inserted
        and that job is returned: the unique column decides between two racing
        submits of one key, the loser reading the winner's job.
        """
        job_id = new_job_id()
        try:
            with self._write() as conn:
                if idempotency_key is not None:
                    held = _job_with_key(conn, idempotency_key)
                    if held is not None:
                        return held
                return self._insert_job(conn, job_id, spec, now, idempotency_key)
        except StoreError:
            held = self.job_by_idempotency_key(idempotency_key) if idempotency_key else None
            if held is None:
                raise
            return held

    def job_by_idempotency_key(self, key: str) -> JobRecord | None:
        """The job submitted with this idempotency key, None when there is none."""
        with self._read() as conn:
            return _job_with_key(conn, key)

    @staticmethod
    def _insert_job(
        conn: Connection, job_id: str, spec: JobSpec, now: datetime, key: str | None
    ) -> JobRecord:
        conn.execute(
            insert(JOBS).values(
                id=job_id,
                name=spec.name,
                spec_json=spec_to_json(spec),
                status=JobStatus.PENDING.value,
                failure=None,
                submitted_at=now,
                updated_at=now,
                version=0,
                idempotency_key=key,
            )
        )
        _insert_event(
            conn,
            job_id,
            at=now,
            from_status=None,
            to_status=JobStatus.PENDING,
            cause="submitted",
            detail="",
        )
        return _load_job(conn, job_id)

    def get_job(self, job_id: str) -> JobRecord:
        """The job with this id, or :class:`~spotd.core.errors.JobNotFound`."""
        with self._read() as conn:
            return _load_job(conn, job_id)

    def find_job(self, ref: str) -> JobRecord:
        """A job by id, unique id prefix, or name (the newest of that name)."""
        with self._read() as conn:
            job_id = _resolve_ref(conn, ref)
            return _load_job(conn, job_id)

    def list_jobs(self, statuses: Collection[JobStatus] | None = None) -> list[JobRecord]:
        """Jobs, oldest first, optionally only those in ``statuses``."""
        query = _job_rows().order_by(*_creation_order())
        if statuses is not None:
            query = query.where(JOBS.c.status.in_([s.value for s in statuses]))
        with self._read() as conn:
            return [job_record(row) for row in conn.execute(query)]

    def jobs_page(
        self,
        *,
        statuses: Collection[JobStatus] | None = None,
        team: str | None = None,
        limit: int,
        cursor: str | None = None,
        name: str | None = None,
    ) -> JobPage:
        """Up to ``limit`` jobs, newest first (by submit time, then id), optionally only
        those in ``statuses``, of ``team`` and whose name contains ``name`` (any case),
        starting after ``cursor`` (a page's ``next``).

        A keyset read on ``(submitted_at, id)`` (indexed, with and without the
        status): no OFFSET, so a deep page costs what the first does, and the
        order key never changes, so a job is on one page only. ``team`` is read
        from the stored spec's JSON and ``name`` matched with LIKE: both filtered
        along the index walk, not indexed (a name no job has reads every row once).
        """
        if limit < 1:
            raise StoreError(f"a page holds at least one job, not {limit}")
        order = (JOBS.c.submitted_at.desc(), JOBS.c.id.desc())
        query = _job_rows().order_by(*order).limit(limit + 1)
        if statuses is not None:
            query = query.where(JOBS.c.status.in_([s.value for s in statuses]))
        if team is not None:
            query = query.where(_spec_team(self._engine.dialect.name) == team)
        if name:
            query = query.where(JOBS.c.name.icontains(name, autoescape=True))
        if cursor is not None:
            at, job_id = _read_cursor(cursor)
            query = query.where(tuple_(JOBS.c.submitted_at, JOBS.c.id) < tuple_(at, job_id))
        with self._read() as conn:
            rows = conn.execute(query).all()
        jobs = [job_record(row) for row in rows[:limit]]
        more = len(rows) > limit
        return JobPage(jobs=jobs, next=_make_cursor(jobs[-1]) if more else None)

    def compare_and_set(self, change: Transition, *, now: datetime) -> JobRecord:
        """Apply ``change`` if the job is still in ``change.expected``.

        In one transaction: the status update guarded by the expected status,
        the event row, and the attempt closed and/or opened with it. Raises
        :class:`~spotd.core.errors.LostTransition` when the guard fails,
        :class:`~spotd.core.errors.JobNotFound` for an unknown job and
        :class:`~spotd.core.errors.StoreError` when the attempt to close is not an
        open attempt of this job; nothing is applied in any of these cases.
        """
        with self._write() as conn:
            _guarded_status_update(conn, change, now)
            _insert_event(
                conn,
                change.job_id,
                at=now,
                from_status=change.expected,
                to_status=change.new,
                cause=change.cause,
                detail=change.detail,
            )
            if change.close_attempt is not None:
                _close_attempt(conn, change.job_id, change.close_attempt, now)
            if change.open_attempt is not None:
                _open_attempt(conn, change.job_id, change.open_attempt, now)
            return _load_job(conn, change.job_id)

    def set_waiting(
        self, job_id: str, status: JobStatus, reason: str, *, now: datetime,
        cause: str = WAITING_CAUSE,
    ) -> bool:
        """Record why the job, still in ``status``, waits: the reason on the job and an
        event (``status`` to ``status``, ``cause``, the reason as detail), in one
        transaction, and only if the job is in ``status`` and its reason is another.
        Whether it wrote. The version counts it; ``updated_at`` (when the status last
        changed) does not move.
        """
        with self._write() as conn:
            changed = conn.execute(
                update(JOBS)
                .where(
                    JOBS.c.id == job_id,
                    JOBS.c.status == status.value,
                    or_(JOBS.c.waiting.is_(None), JOBS.c.waiting != reason),
                )
                .values(waiting=reason, version=JOBS.c.version + 1)
            )
            if changed.rowcount != 1:
                return False
            _insert_event(conn, job_id, at=now, from_status=status, to_status=status,
                          cause=cause, detail=reason)  # fmt: skip
            return True

    def job_owners(self) -> list[str]:
        """Every daemon owner name that holds or held a job's lease, sorted."""
        query = select(JOBS.c.owner).where(JOBS.c.owner.is_not(None)).distinct()
        with self._read() as conn:
            return sorted(str(o) for o in conn.execute(query).scalars())

    def claim_jobs(
        self, owner: str, *, now: datetime | None = None, lease_seconds: float
    ) -> list[str]:
        """Take or renew the lease of active jobs free or already ours; return their ids
        (sorted): :meth:`claim_job_versions`."""
        return sorted(self.claim_job_versions(owner, now=now, lease_seconds=lease_seconds))

    def claim_job_versions(
        self,
        owner: str,
        *,
        now: datetime | None = None,
        lease_seconds: float,
        share_of: int = 1,
    ) -> dict[str, int]:
        """Renew ``owner``'s lease, take the active jobs that are free, and return every
        active job ``owner`` holds with its version.

        The lease is the owner's row in ``owner_leases``: every job it holds is
        held until then, so a renewal writes one row, however many jobs. A job
        is free when it has no owner, or when its owner's lease ran out (by the
        owner's row, or by the job's own ``lease_until`` for an owner without
        one: a daemon of an older version). On PostgreSQL claims take turns (an
        advisory lock): a renewal writes no job row, so a job's row lock alone
        would not keep another daemon from taking a job whose owner is renewing
        its lease at that moment. The jobs taken are locked in id order, against
        the writes of daemons that renew per job. ``now`` None
        measures the lease on the database's clock (PostgreSQL's ``now()``,
        this machine's on SQLite), which every daemon shares however far their
        own clocks drift. ``share_of``: how many daemons share the work; a
        claim takes free jobs (lowest id first) only up to ``owner``'s share of
        all active jobs (rounded up), so a burst of submissions is split between
        the daemons rather than taken whole by the first to pass (``_room_for``).
        """
        current: Any = now
        if current is None:
            current = func.now() if self._postgres else datetime.now(UTC)
        held = select(JOBS.c.id, JOBS.c.version).where(
            JOBS.c.owner == owner, JOBS.c.status.in_(_ACTIVE)
        )
        with self._write() as conn:
            if self._postgres:
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_CLAIM_LOCK})
            _renew_owner(conn, owner, current + timedelta(seconds=lease_seconds))
            _take_free_jobs(conn, owner, current, share_of=share_of)
            # fetchall, not a row at a time: tens of thousands of rows on every pass.
            return {str(i): int(v) for i, v in conn.execute(held).all()}

    def renew_lease(self, owner: str, *, lease_seconds: float) -> None:
        """Renew ``owner``'s lease and take no job: a daemon that has just started is
        counted among the daemons sharing the free jobs before its first pass, so a
        peer's first pass does not take a whole backlog (:func:`_room_for`)."""
        with self._write() as conn:
            now: Any = func.now() if self._postgres else datetime.now(UTC)
            _renew_owner(conn, owner, now + timedelta(seconds=lease_seconds))

    def job_versions(self, job_ids: Collection[str]) -> dict[str, int]:
        """The version of each of these jobs that exists, by id (one query per chunk)."""
        found: dict[str, int] = {}
        with self._read() as conn:
            for chunk in chunks(list(job_ids)):
                query = select(JOBS.c.id, JOBS.c.version).where(JOBS.c.id.in_(chunk))
                found.update((str(i), int(v)) for i, v in conn.execute(query))
        return found

    def jobs_by_id(self, job_ids: Collection[str]) -> dict[str, JobRecord]:
        """These jobs, those that exist, by id (one query per chunk)."""
        found: dict[str, JobRecord] = {}
        with self._read() as conn:
            for chunk in chunks(list(job_ids)):
                for row in conn.execute(_job_rows().where(JOBS.c.id.in_(chunk))):
                    found[row.id] = job_record(row)
        return found

    # attempts and events

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        """All attempts of a job in order (by ``seq``)."""
        query = select(ATTEMPTS).where(ATTEMPTS.c.job_id == job_id).order_by(ATTEMPTS.c.seq)
        with self._read() as conn:
            return [attempt_record(row) for row in conn.execute(query)]

    def attempts_for(self, job_ids: Collection[str]) -> dict[str, list[AttemptRecord]]:
        """The attempts of many jobs at once (one query per chunk), by job id."""
        found: dict[str, list[AttemptRecord]] = {job_id: [] for job_id in job_ids}
        with self._read() as conn:
            for chunk in chunks(list(found)):
                query = (
                    select(ATTEMPTS)
                    .where(ATTEMPTS.c.job_id.in_(chunk))
                    .order_by(ATTEMPTS.c.job_id, ATTEMPTS.c.seq)
                )
                for row in conn.execute(query):
                    found[row.job_id].append(attempt_record(row))
        return found

    def set_attempt_instances(self, attempt_id: int, instance_ids: Sequence[str]) -> None:
        """Record the instances a launch returned (replacing any recorded before)."""
        change = (
            update(ATTEMPTS)
            .where(ATTEMPTS.c.id == attempt_id)
            .values(instance_ids=json.dumps(list(instance_ids)))
        )
        with self._write() as conn:
            _count_change_of(conn, attempt_id)
            if conn.execute(change).rowcount == 0:
                raise StoreError(f"no attempt {attempt_id}")

    def mark_attempt_running(self, attempt_id: int, *, at: datetime) -> None:
        """Record when all nodes of the attempt started running the job.

        The first time recorded stays: reconciling the same running attempt
        again does not move it.
        """
        change = (
            update(ATTEMPTS)
            .where(ATTEMPTS.c.id == attempt_id, ATTEMPTS.c.running_at.is_(None))
            .values(running_at=at)
        )
        with self._write() as conn:
            _count_change_of(conn, attempt_id, ATTEMPTS.c.running_at.is_(None))
            if conn.execute(change).rowcount == 0:
                _require_attempt(conn, attempt_id)

    def events(self, job_id: str) -> list[EventRecord]:
        """All events of a job in order."""
        query = select(EVENTS).where(EVENTS.c.job_id == job_id).order_by(EVENTS.c.id)
        with self._read() as conn:
            return [event_record(row) for row in conn.execute(query)]

    # market and agents

    def record_prices(self, offerings: Sequence[Offering], *, at: datetime) -> int:
        """Keep the offerings' prices as history; returns the rows written."""
        with self._write() as conn:
            return history.insert_prices(conn, offerings, at)

    def price_history(self, pool: Pool, *, since: datetime) -> list[PricePoint]:
        """The pool's polled prices since ``since``, oldest first."""
        with self._read() as conn:
            return history.select_history(conn, pool, since)

    def save_report(self, report: InstanceReport) -> None:
        """Merge an agent's report into what is known of its instance."""
        with self._write() as conn:
            history.upsert_report(conn, report)

    def reports(self, job_id: str) -> list[InstanceReport]:
        """What the agents of a job's instances reported."""
        with self._read() as conn:
            return history.select_reports(conn, job_id)

    def reports_for(self, job_ids: Collection[str]) -> dict[str, list[InstanceReport]]:
        """The agents' reports of many jobs at once, by job id."""
        found: dict[str, list[InstanceReport]] = {job_id: [] for job_id in job_ids}
        with self._read() as conn:
            for chunk in chunks(list(found)):
                for report in history.select_reports_of(conn, chunk):
                    found[report.job_id].append(report)
        return found

    def report_changes(self, since: int) -> tuple[list[InstanceReport], int]:
        """The agents' reports written since ``since`` (0: all of them), and the ``since``
        of the next read (:func:`spotd.store.history.report_changes`)."""
        with self._read() as conn:
            return history.report_changes(conn, since)

    def report_cursor(self) -> int:
        """The ``since`` from which :meth:`report_changes` returns every report written later."""
        with self._read() as conn:
            return history.report_cursor(conn)

    def close(self) -> None:
        """Release connections."""
        self._engine.dispose()

    # ledger and notifications

    def replace_ledger(self, job_id: str, entries: Sequence[LedgerEntry]) -> None:
        """Replace all ledger lines of ``job_id`` with ``entries``, in one transaction."""
        with self._write() as conn:
            try:
                ledger_sql.replace_job(conn, job_id, entries)
            except ValueError as exc:
                raise StoreError(str(exc)) from exc

    def ledger(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        job_id: str | None = None,
    ) -> list[LedgerEntry]:
        """Ledger lines starting in ``[since, until)``, of one job or all, oldest first."""
        with self._read() as conn:
            return ledger_sql.select_entries(conn, since=since, until=until, job_id=job_id)

    def unbilled_jobs(self, owner: str) -> list[str]:
        """The ended jobs last held by ``owner`` with an ended attempt that ran nodes and
        has no ledger line: a daemon killed between a job's end and its bill left them."""
        billed = select(LEDGER.c.id).where(
            LEDGER.c.job_id == ATTEMPTS.c.job_id, LEDGER.c.attempt == ATTEMPTS.c.seq
        )
        query = (
            select(JOBS.c.id)
            .distinct()
            .join(ATTEMPTS, ATTEMPTS.c.job_id == JOBS.c.id)
            .where(
                JOBS.c.owner == owner,
                JOBS.c.status.in_([s.value for s in JobStatus if s.terminal]),
                ATTEMPTS.c.ended_at.is_not(None),
                ATTEMPTS.c.instance_ids != "[]",
                ~billed.exists(),
            )
            .order_by(JOBS.c.id)
        )
        with self._read() as conn:
            return [row.id for row in conn.execute(query)]

    def ledger_for(self, job_ids: Collection[str]) -> dict[str, list[LedgerEntry]]:
        """The ledger lines of many jobs at once (one query per chunk), by job id."""
        found: dict[str, list[LedgerEntry]] = {job_id: [] for job_id in job_ids}
        with self._read() as conn:
            for chunk in chunks(list(found)):
                query = (
                    select(LEDGER)
                    .where(LEDGER.c.job_id.in_(chunk))
                    .order_by(LEDGER.c.start, LEDGER.c.job_id, LEDGER.c.attempt, LEDGER.c.id)
                )
                for row in conn.execute(query):
                    found[row.job_id].append(ledger_sql.entry_record(row))
        return found

    def claim_notification(self, key: str, *, at: datetime) -> bool:
        """Record that notification ``key`` goes out; True only for the first claimer."""
        with self._write() as conn:
            return ledger_sql.claim(conn, key, at)

    # dashboard sessions

    def end_session(self, session_id: str, *, until: datetime) -> None:
        """Refuse dashboard session ``session_id`` from now on (:mod:`spotd.store.sessions`)."""
        with self._write() as conn:
            sessions.end(conn, session_id, until, datetime.now(UTC))

    def session_ended(self, session_id: str) -> bool:
        """Whether dashboard session ``session_id`` was logged out of."""
        with self._read() as conn:
            return sessions.ended(conn, session_id)


# -- statements used inside a transaction ------------------------------------


def _creation_order() -> tuple[ColumnElement[Any], ...]:
    # Jobs submitted at the same instant (a simulated clock) keep their
    # insertion order through the id of their creation event.
    first_event = (
        select(func.min(EVENTS.c.id)).where(EVENTS.c.job_id == JOBS.c.id).scalar_subquery()
    )
    return (JOBS.c.submitted_at, first_event, JOBS.c.id)


def _make_cursor(last: JobRecord) -> str:
    """The opaque cursor after ``last``: its order key, base64 of JSON."""
    key = json.dumps([last.submitted_at.isoformat(), last.id]).encode()
    return base64.urlsafe_b64encode(key).decode().rstrip("=")


def _read_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, job_id = json.loads(raw)
        when = datetime.fromisoformat(at)
    except (ValueError, TypeError) as exc:
        raise BadCursor(f"not a job listing cursor ({len(cursor)} characters)") from exc
    if when.tzinfo is None or not isinstance(job_id, str):
        raise BadCursor(f"not a job listing cursor ({len(cursor)} characters)")
    return when, job_id


def _spec_team(dialect: str) -> ColumnElement[Any]:
    """The ``team`` of the job's stored spec, in SQL (the spec is JSON text)."""
    extracted: ColumnElement[Any]
    if dialect == "postgresql":
        extracted = cast(JOBS.c.spec_json, JSONB)["team"].astext
    else:
        extracted = func.json_extract(JOBS.c.spec_json, "$.team")
    return extracted


def _job_with_key(conn: Connection, key: str) -> JobRecord | None:
    row = conn.execute(_job_rows().where(JOBS.c.idempotency_key == key)).one_or_none()
    return None if row is None else job_record(row)


def _job_rows() -> Select[Any]:
    """``SELECT`` of job rows whose ``lease_until`` is the lease that holds the job: its
    owner's row where the owner has one, else the job's own (an older daemon's)."""
    by_owner = select(LEASES.c.lease_until).where(LEASES.c.owner == JOBS.c.owner)
    lease = func.coalesce(by_owner.scalar_subquery(), JOBS.c.lease_until)
    columns = [c for c in JOBS.c if c.name != "lease_until"]
    return select(*columns, type_coerce(lease, UtcDateTime()).label("lease_until"))


def _renew_owner(conn: Connection, owner: str, until: Any) -> None:
    stmt = conflict_insert(conn, LEASES).values(owner=owner, lease_until=until)
    conn.execute(stmt.on_conflict_do_update(index_elements=["owner"], set_={"lease_until": until}))


def _take_free_jobs(conn: Connection, owner: str, now: Any, *, share_of: int = 1) -> None:
    """Make ``owner`` the owner of the free active jobs (:meth:`SqlStore.claim_job_versions`),
    at most ``1 / share_of`` of them (rounded up).

    The candidates are found by index, each kind on its own (an ``OR`` of them
    would read every active job); the ``UPDATE`` checks each again, after
    PostgreSQL has locked it.
    """
    active = JOBS.c.status.in_(_ACTIVE)
    # SQLite, which keeps no statistics, would walk the status index (every active
    # job) where the lease's or the id's finds a few rows: as an expression, the
    # status is checked on the rows those find.
    still_active = (JOBS.c.status + "").in_(_ACTIVE)
    ran_out = select(LEASES.c.owner).where(LEASES.c.lease_until < now, LEASES.c.owner != owner)
    per_job = JOBS.c.owner.not_in(select(LEASES.c.owner))
    unowned_lease = (JOBS.c.lease_until.is_(None), JOBS.c.owner.is_not(None))
    ours = JOBS.c.owner == owner
    # Ours but leased per job (by this owner's older version): held by our row now.
    mine = [
        select(JOBS.c.id).where(ours, JOBS.c.lease_until < HELD_BY_OWNER, still_active),
        select(JOBS.c.id).where(ours, JOBS.c.lease_until.is_(None), still_active),
    ]
    free = [
        select(JOBS.c.id).where(JOBS.c.owner.is_(None), active),
        select(JOBS.c.id).where(JOBS.c.owner.in_(ran_out), active),
        select(JOBS.c.id).where(JOBS.c.lease_until < now, per_job, still_active),
        select(JOBS.c.id).where(*unowned_lease, per_job, still_active),
    ]
    if share_of > 1:
        # Claims take turns (the advisory lock above on PostgreSQL): these counts hold.
        free_ids = union(*free).subquery()
        count = conn.execute(select(func.count()).select_from(free_ids)).scalar_one()
        share = _room_for(conn, owner, now, share_of) if count else 0
        first = select(free_ids.c.id).order_by(free_ids.c.id).limit(share).subquery()
        free = [select(first.c.id)]
    candidates = union(*mine, *free)
    locked = select(JOBS.c.id).where(JOBS.c.id.in_(candidates)).order_by(JOBS.c.id)
    locked = locked.with_for_update()
    take = (
        update(JOBS)
        .where(JOBS.c.id.in_(locked), still_active, _free_for(owner, now))
        .values(owner=owner, lease_until=HELD_BY_OWNER)
    )
    conn.execute(take)


def _room_for(conn: Connection, owner: str, now: Any, share_of: int) -> int:
    """How many free jobs ``owner`` may take: its fair share of every active job, less
    what it holds already.

    The share is of all active jobs, not of the free ones: a share of the free
    ones shrinks with each claim, so a daemon that passes every 100 ms took a
    burst of submissions one share after another before a slower peer (the
    leader, busy with the market) passed once. The daemons counted are those
    alive on the database (``share_of``, by their owner locks) that renewed
    their lease lately: one that holds its lock but no longer passes is left
    out once its lease runs out, so its share, and the jobs it dropped, are
    taken by the others.
    """
    renewing = select(func.count()).where(LEASES.c.lease_until >= now)
    active = select(func.count()).where(JOBS.c.status.in_(_ACTIVE))
    held = select(func.count()).where(JOBS.c.owner == owner, JOBS.c.status.in_(_ACTIVE))
    counts = select(renewing.scalar_subquery(), active.scalar_subquery(), held.scalar_subquery())
    n_renewing, n_active, n_held = (int(n) for n in conn.execute(counts).one())  # one round trip
    peers = max(1, min(share_of, n_renewing))
    return max(0, -(-n_active // peers) - n_held)


def _free_for(owner: str, now: Any) -> ColumnElement[bool]:
    """Whether ``owner`` may take the job: see :meth:`SqlStore.claim_job_versions`."""
    by_owner = select(LEASES.c.lease_until).where(LEASES.c.owner == JOBS.c.owner)
    lease = func.coalesce(by_owner.scalar_subquery(), JOBS.c.lease_until)
    return or_(
        JOBS.c.owner.is_(None),
        and_(JOBS.c.owner == owner,
             or_(JOBS.c.lease_until.is_(None), JOBS.c.lease_until < HELD_BY_OWNER)),
        and_(JOBS.c.owner != owner, or_(lease.is_(None), lease < now)),
    )  # fmt: skip


def _load_job(conn: Connection, job_id: str) -> JobRecord:
    row = conn.execute(_job_rows().where(JOBS.c.id == job_id)).one_or_none()
    if row is None:
        raise JobNotFound(f"no job {job_id!r}")
    return job_record(row)


def _resolve_ref(conn: Connection, ref: str) -> str:
    """The id that ``ref`` names: an id, a unique id prefix, or a job name."""
    if conn.execute(select(JOBS.c.id).where(JOBS.c.id == ref)).first() is not None:
        return ref
    if ref:
        by_prefix = select(JOBS.c.id).where(JOBS.c.id.startswith(ref, autoescape=True))
        ids = sorted(str(i) for i in conn.execute(by_prefix.limit(11)).scalars())
        if len(ids) == 1:
            return ids[0]
        if ids:
            shown = ", ".join(ids[:10]) + (", ..." if len(ids) > 10 else "")
            raise StoreError(f"job reference {ref!r} is ambiguous: {shown}")
    newest = (
        select(JOBS.c.id)
        .where(JOBS.c.name == ref)
        .order_by(*(c.desc() for c in _creation_order()))
        .limit(1)
    )
    found = conn.execute(newest).scalar_one_or_none()
    if found is None:
        raise JobNotFound(f"no job with id, id prefix or name {ref!r}")
    return str(found)


def _guarded_status_update(conn: Connection, change: Transition, now: datetime) -> None:
    guarded = (
        update(JOBS)
        .where(JOBS.c.id == change.job_id, JOBS.c.status == change.expected.value)
        .values(
            status=change.new.value,
            failure=change.failure.value if change.failure is not None else None,
            updated_at=now,
            version=JOBS.c.version + 1,
            # A job that moves on waits no more for what it waited for.
            **({"waiting": None} if change.new is not change.expected else {}),
        )
    )
    if conn.execute(guarded).rowcount == 1:
        return
    actual = conn.execute(select(JOBS.c.status).where(JOBS.c.id == change.job_id)).scalar()
    if actual is None:
        raise JobNotFound(f"no job {change.job_id!r}")
    raise LostTransition(
        f"job {change.job_id}: expected {change.expected}, found {actual} "
        f"(wanted {change.expected} -> {change.new})"
    )


def _insert_event(
    conn: Connection,
    job_id: str,
    *,
    at: datetime,
    from_status: JobStatus | None,
    to_status: JobStatus,
    cause: str,
    detail: str,
) -> None:
    conn.execute(
        insert(EVENTS).values(
            job_id=job_id,
            at=at,
            from_status=from_status.value if from_status is not None else None,
            to_status=to_status.value,
            cause=cause,
            detail=detail,
        )
    )


def _close_attempt(conn: Connection, job_id: str, close: AttemptClose, now: datetime) -> None:
    closing = (
        update(ATTEMPTS)
        .where(
            ATTEMPTS.c.id == close.attempt_id,
            ATTEMPTS.c.job_id == job_id,
            ATTEMPTS.c.ended_at.is_(None),
        )
        .values(ended_at=now, end_reason=close.reason.value)
    )
    if conn.execute(closing).rowcount == 0:
        raise StoreError(f"job {job_id}: attempt {close.attempt_id} is not an open attempt of it")


def _open_attempt(conn: Connection, job_id: str, new: NewAttempt, now: datetime) -> None:
    # Safe from races: the guarded UPDATE before it holds the job's row lock.
    last = conn.execute(
        select(func.max(ATTEMPTS.c.seq)).where(ATTEMPTS.c.job_id == job_id)
    ).scalar()
    seq = int(last or 0) + 1
    conn.execute(
        insert(ATTEMPTS).values(
            job_id=job_id,
            seq=seq,
            provider=new.pool.provider,
            region=new.pool.region,
            zone=new.pool.zone,
            instance_type=new.pool.instance_type,
            market=new.market.value,
            nodes=new.nodes,
            price_per_node_hour=new.price_per_node_hour,
            client_token=client_token(job_id, seq),
            instance_ids="[]",
            resume_from=new.resume_from,
            started_at=now,
            work_per_hour=new.work_per_hour,
            checkpoint_interval_hours=new.checkpoint_interval_hours,
            saves_on_notice=new.saves_on_notice,
        )
    )


def _count_change_of(conn: Connection, attempt_id: int, *only_if: ColumnElement[bool]) -> None:
    """Bump the version of the attempt's job (where the attempt matches ``only_if``):
    readers that keep attempts between reads (the engine) know them by it.

    Called before the attempt's own update, so that like a transition it locks
    the job's row first and its attempt's second: two writers of one job never
    wait on each other in opposite orders (a deadlock on PostgreSQL).
    """
    owner = (
        select(ATTEMPTS.c.job_id).where(ATTEMPTS.c.id == attempt_id, *only_if).scalar_subquery()
    )
    conn.execute(update(JOBS).where(JOBS.c.id == owner).values(version=JOBS.c.version + 1))


def _require_attempt(conn: Connection, attempt_id: int) -> None:
    if conn.execute(select(ATTEMPTS.c.id).where(ATTEMPTS.c.id == attempt_id)).first() is None:
        raise StoreError(f"no attempt {attempt_id}")


if TYPE_CHECKING:
    from spotd.core.contracts import HistoryStore, JobStore, LedgerStore, SessionStore, Store

    # mypy proves here that SqlStore fits the whole Store contract, each part included,
    # and the dashboard's SessionStore.
    def _fits(
        store: SqlStore,
    ) -> tuple[Store, JobStore, HistoryStore, LedgerStore, SessionStore]:
        return store, store, store, store, store
