"""Several daemons on one database: who runs, who leads, and whose clock counts.

- **One daemon per data_dir, and on SQLite one per database.** A daemon holds
  an exclusive ``flock`` on ``<data_dir>/daemon.lock`` for its life, and on
  SQLite one beside the database file: SQLite serves one daemon; several need
  PostgreSQL. The lock goes with the process, however it ends.
- **One daemon per owner name on PostgreSQL.** A session-level advisory lock
  keyed by the owner, on a connection held for the daemon's life: a second
  daemon with the same ``daemon.owner`` would take over the first's jobs as
  its own.
- **Who is alive.** The owner locks share one lock class, so
  :meth:`Coordinator.live_daemons` counts them in ``pg_locks``: each daemon
  claims its share of the free jobs, not all of them (see
  :meth:`~spotd.store.sql.SqlStore.claim_jobs`).
- **One leader.** Another advisory lock, tried on every pass: whoever holds it
  does the singleton work. When the leader dies its connection closes, the
  server frees the lock, and the next daemon to try takes it, within one
  pass (``daemon.tick_seconds``) plus the time the server takes to notice a
  dead connection (at once for a killed process on the same host; TCP
  keepalive bounds it across hosts).
- **The database's clock.** :meth:`Coordinator.database_time` is the server's
  ``now()``, so job leases are measured on one clock however far the
  daemons' own clocks drift apart.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from sqlalchemy import Connection, Engine, text

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.errors import ConfigError

log = logging.getLogger(__name__)

LEADER_KEY = "spotd:leader"
OWNER_CLASS = 0x53504F54
"""The first key of every owner lock (``pg_try_advisory_lock(int4, int4)``): ``SPOT``."""


def advisory_key(name: str) -> int:
    """A signed 64-bit key for ``pg_try_advisory_lock`` derived from ``name``."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def owner_key(owner: str) -> int:
    """The second, signed 32-bit key of ``owner``'s advisory lock."""
    digest = hashlib.sha256(f"spotd:owner:{owner}".encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


class FileLock:
    """An exclusive, non-blocking ``flock`` on a file, holding the holder's pid."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[str] | None = None

    def acquire(self, refused: str) -> None:
        """Take the lock, or raise :class:`ConfigError` with ``refused`` and the holder's pid."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise ConfigError(f"{refused} (pid {holder}, lock {self.path})") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        """Let go of the lock (the process's end does the same)."""
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


class Coordinator:
    """The locks and the clock that let several daemons share one database.

    On SQLite there is one daemon (the file lock sees to it), so it always
    leads and the database's clock is this machine's: ``wall``.
    """

    def __init__(self, engine: Engine, *, wall: Clock = WALL) -> None:
        self._engine = engine
        self._wall = wall
        self._postgres = engine.dialect.name == "postgresql"
        self._conn: Connection | None = None
        self._file_locks: list[FileLock] = []
        self.leading = not self._postgres

    @property
    def shared(self) -> bool:
        """Whether several daemons may use this database (PostgreSQL)."""
        return self._postgres

    def claim_daemon(self, data_dir: Path, owner: str) -> None:
        """Refuse to run beside a live daemon on ``data_dir``, on a SQLite database, or
        under ``owner`` on the same PostgreSQL database; hold those claims from now on."""
        lock = FileLock(data_dir / "daemon.lock")
        lock.acquire(f"another spotd daemon is running on data_dir {data_dir}")
        self._file_locks.append(lock)
        if not self._postgres:
            database = self._engine.url.database or ""
            if database and database != ":memory:":
                db_lock = FileLock(Path(f"{database}.daemon.lock"))
                db_lock.acquire(
                    f"another spotd daemon uses the SQLite database {database}: SQLite serves "
                    "one daemon; to run several, give them one PostgreSQL database_url"
                )
                self._file_locks.append(db_lock)
            return
        if not self._try_owner_lock(owner):
            self.release()
            raise ConfigError(
                f"a spotd daemon with daemon.owner {owner!r} is already running on this "
                "database: give each daemon its own owner (the default is the host name)"
            )

    def try_lead(self) -> bool:
        """Take (or keep) the leadership if nobody holds it; whether this daemon leads."""
        if not self._postgres:
            return True
        was = self.leading
        try:
            self.leading = self.leading or self._try_lock(LEADER_KEY)
        except Exception as exc:  # a lost connection: nobody can tell, so do not lead
            log.warning("leadership unknown, connection lost: %s", exc)
            self._drop_connection()
            self.leading = False
        if self.leading and not was:
            log.info("this daemon now leads: it does the singleton work")
        return self.leading

    def live_daemons(self) -> int:
        """How many daemons hold an owner lock on this database now (1 on SQLite).

        A failed read says 1: a daemon that cannot count its peers claims as
        if alone, which is slower to share, never a lost job.
        """
        if not self._postgres:
            return 1
        query = text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = :cls AND objsubid = 2"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        try:
            with self._engine.connect() as conn:
                return max(1, int(conn.execute(query, {"cls": OWNER_CLASS}).scalar_one()))
        except Exception as exc:
            log.warning("could not count the live daemons: %s", exc)
            return 1

    def database_time(self) -> datetime:
        """The database server's clock (``wall`` on SQLite), timezone-aware UTC."""
        if not self._postgres:
            return self._wall.now()
        with self._engine.connect() as conn:
            value: datetime = conn.execute(text("SELECT now()")).scalar_one()
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    def release(self) -> None:
        """Give up every claim: leadership, owner and file locks."""
        self._drop_connection()
        self.leading = not self._postgres
        for lock in self._file_locks:
            lock.release()
        self._file_locks.clear()

    def _try_lock(self, name: str) -> bool:
        conn = self._connection()
        got = conn.execute(
            text("SELECT pg_try_advisory_lock(:key)"), {"key": advisory_key(name)}
        ).scalar_one()
        conn.commit()
        return bool(got)

    def _try_owner_lock(self, owner: str) -> bool:
        conn = self._connection()
        got = conn.execute(
            text("SELECT pg_try_advisory_lock(:cls, :key)"),
            {"cls": OWNER_CLASS, "key": owner_key(owner)},
        ).scalar_one()
        conn.commit()
        return bool(got)

    def _connection(self) -> Connection:
        # Session-level advisory locks live as long as this one connection.
        if self._conn is None:
            self._conn = self._engine.connect()
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                # Invalidate, not just close: a pooled connection would keep its
                # session, and so its advisory locks, after going back to the pool.
                self._conn.invalidate()
                self._conn.close()
            except Exception:  # already broken: the server frees its locks anyway
                log.debug("closing the coordination connection failed", exc_info=True)
            self._conn = None
