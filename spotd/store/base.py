"""What every part of the SQL store shares: the engine, its transactions, and the
translation of database errors into :class:`~spotd.core.errors.StoreError`.

Each part of :class:`~spotd.store.sql.SqlStore` derives from :class:`SqlBase` and
reaches the database only through :meth:`SqlBase._read` and :meth:`SqlBase._write`,
so every public method of the store tells a failure as a ``StoreError`` (a failing
database as :class:`~spotd.core.errors.StoreUnavailable`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
    StatementError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.errors import StoreError, StoreUnavailable

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another writer's lock before failing."""

WRITE = "spotd_write"
"""Execution option marking a transaction that will write (see ``_sqlite_begin``)."""


# -- the engine --------------------------------------------------------------


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
    immediate = conn.get_execution_options().get(WRITE, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


# -- errors at the boundary --------------------------------------------------


@contextmanager
def db_errors() -> Iterator[None]:
    """Turn database errors into :class:`StoreError` (:func:`store_error`), keeping the
    cause for the log."""
    try:
        yield
    except SQLAlchemyError as exc:
        raise store_error(exc) from exc


_UNAVAILABLE = (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)
"""The database's failures that are not about the statement: a full disk, a lock held
past the wait, a lost connection, a pool with none free. The same call may pass later."""


def store_error(exc: SQLAlchemyError) -> StoreError:
    """The :class:`StoreError` a user is told for ``exc``: the database driver's own short
    reason, never SQLAlchemy's text (the statement, its parameters, a link to its docs).

    A failure of the database itself is :class:`StoreUnavailable`
    (``database or disk is full``); a broken constraint a conflict.
    """
    if isinstance(exc, StatementError) and isinstance(exc.orig, StoreError):
        # Our own column type refused a value (a naive datetime): its message is ours.
        return StoreError(str(exc.orig))
    cause = _cause(exc)
    if isinstance(exc, _UNAVAILABLE) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        return StoreUnavailable(f"the store is unavailable: {cause}", cause=cause)
    if isinstance(exc, IntegrityError):
        return StoreError(f"store conflict: {cause}")
    return StoreError(f"store error: {cause}")


def _cause(exc: SQLAlchemyError) -> str:
    """The first line of the driver's message (``database or disk is full``), else of
    SQLAlchemy's own without its statement and link; the class name when both are empty."""
    orig = exc.orig if isinstance(exc, StatementError) else None
    said = str(orig) if orig is not None else str(exc.args[0]) if exc.args else ""
    first = said.strip().partition("\n")[0].strip()
    return first or type(orig or exc).__name__


# -- the base of the store's parts -------------------------------------------


class SqlBase:
    """The engine and the transactions the parts of the SQL store run in.

    ``wall`` is the clock of this machine, for what the database keeps no clock of its
    own for (SQLite): see :class:`~spotd.store.sql.SqlStore`.
    """

    def __init__(self, engine: Engine, *, wall: Clock = WALL) -> None:
        self._engine = engine
        self._wall = wall
        self._writer = engine.execution_options(**{WRITE: True})
        self._postgres = engine.dialect.name == "postgresql"

    @property
    def engine(self) -> Engine:
        """The engine, for migrations and tests."""
        return self._engine

    def close(self) -> None:
        """Release connections."""
        self._engine.dispose()

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        """A transaction that only reads, its errors told as :class:`StoreError`."""
        with db_errors(), self._engine.begin() as conn:
            yield conn

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """A transaction that writes (on SQLite it takes the write lock at once), its
        errors told as :class:`StoreError`."""
        with db_errors(), self._writer.begin() as conn:
            yield conn
