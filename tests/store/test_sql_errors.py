"""The store's boundary: a database error reaches the caller as a StoreError with the
driver's short reason, never SQLAlchemy's text (statement, parameters, link)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.exc import (
    ArgumentError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    StatementError,
)

from spotd.core.errors import JobNotFound, StoreError, StoreUnavailable
from spotd.core.spec import JobSpec
from spotd.store import open_store
from spotd.store.base import store_error

SQLALCHEMY_WORDS = ("[SQL", "[parameters", "sqlalche.me", "Background on this error", "sqlite3.")


def _spec() -> JobSpec:
    return JobSpec.model_validate(
        {"name": "t", "command": ["true"], "resources": {"gpus": ["A100"], "gpus_per_node": 1}}
    )


def _statement(cls: type[StatementError], orig: BaseException) -> StatementError:
    """``cls`` as SQLAlchemy raises it for a statement that failed with ``orig``."""
    return cls("INSERT INTO jobs (id) VALUES (?)", ("j-secret",), orig)  # type: ignore[arg-type]


def _told(error: StoreError) -> str:
    text = str(error)
    for word in SQLALCHEMY_WORDS:
        assert word not in text, text
    return text


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (_statement(OperationalError, sqlite3.OperationalError("database or disk is full")),
         "database or disk is full"),
        (_statement(OperationalError, sqlite3.OperationalError("database is locked")),
         "database is locked"),
        (_statement(OperationalError, OSError(
            'connection failed: connection to server at "10.0.0.5", port 5432 failed: '
            "Connection refused\n\tIs the server running on that host?")),
         'connection failed: connection to server at "10.0.0.5", port 5432 failed: '
         "Connection refused"),
        (_statement(InterfaceError, OSError("connection already closed")),
         "connection already closed"),
    ],
    ids=["disk-full", "locked", "refused", "closed"],
)  # fmt: skip
def test_a_failing_database_is_unavailable_with_its_own_first_line(
    exc: StatementError, cause: str
) -> None:
    error = store_error(exc)
    assert type(error) is StoreUnavailable and error.cause == cause
    assert _told(error) == f"the store is unavailable: {cause}"


def test_a_lost_connection_of_any_kind_is_unavailable() -> None:
    exc = _statement(ProgrammingError, OSError("server closed the connection unexpectedly"))
    exc.connection_invalidated = True  # type: ignore[attr-defined]
    assert isinstance(store_error(exc), StoreUnavailable)


def test_other_errors_keep_their_kind_and_lose_the_statement() -> None:
    conflict = store_error(_statement(IntegrityError, sqlite3.IntegrityError(
        "UNIQUE constraint failed: jobs.id")))  # fmt: skip
    assert type(conflict) is StoreError
    assert _told(conflict) == "store conflict: UNIQUE constraint failed: jobs.id"
    bad = store_error(_statement(ProgrammingError, sqlite3.ProgrammingError("no such column: x")))
    assert type(bad) is StoreError and _told(bad) == "store error: no such column: x"
    own = store_error(ArgumentError("not a valid URL"))
    assert _told(own) == "store error: not a valid URL"
    refused = StoreError("naive datetime given to the store")
    ours = store_error(StatementError("(in a bound parameter)", "UPDATE jobs", (), refused))
    assert _told(ours) == "naive datetime given to the store"


def test_a_full_sqlite_database_is_told_in_one_short_line(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'full.db'}")
    try:
        with store.engine.connect() as conn:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar()

        def capped(dbapi: sqlite3.Connection, _record: object) -> None:
            dbapi.execute(f"PRAGMA max_page_count={pages}")

        event.listen(store.engine, "connect", capped)
        store.engine.dispose()
        with pytest.raises(StoreUnavailable) as full:
            for _ in range(200):  # a few pages are free: fill them
                store.create_job(_spec(), now=datetime.now(UTC))
        assert _told(full.value) == "the store is unavailable: database or disk is full"
        assert isinstance(full.value.__cause__, OperationalError), "the log keeps the cause"
        assert store.list_jobs(), "reads still work"
    finally:
        store.close()


def test_an_unknown_job_names_its_id(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        with pytest.raises(JobNotFound) as gone:
            store.get_job("j-0000000009")
        assert gone.value.job_id == "j-0000000009"
    finally:
        store.close()
