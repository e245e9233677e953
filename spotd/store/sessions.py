"""The sessions part of the SQL store: the dashboard's logged-out sessions
(``ended_sessions``), the :class:`~spotd.core.contracts.SessionStore`.

A session cookie is signed, so a daemon can check it without the database;
only a logout needs the database, to refuse a copy of the cookie that
outlives the browser that logged out, on every daemon sharing the store.
A row is kept until the cookie would have expired anyway, then dropped by
the next logout.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, delete, exists, select

from spotd.store.base import SqlBase
from spotd.store.tables import ENDED_SESSIONS, conflict_insert


class SessionRows(SqlBase):
    """The dashboard sessions logged out of, kept in the SQL database for every daemon
    on it to refuse."""

    def end_session(self, session_id: str, *, until: datetime) -> None:
        """Refuse dashboard session ``session_id`` from now on, until its cookie expires
        at ``until`` (:func:`end`)."""
        with self._write() as conn:
            end(conn, session_id, until, self._wall.now())

    def session_ended(self, session_id: str) -> bool:
        """Whether dashboard session ``session_id`` was logged out of."""
        with self._read() as conn:
            return ended(conn, session_id)


def end(conn: Connection, session_id: str, until: datetime, now: datetime) -> None:
    """Record ``session_id`` as ended (twice is once: two tabs logging out together),
    and forget the sessions that expired before ``now``."""
    conn.execute(delete(ENDED_SESSIONS).where(ENDED_SESSIONS.c.until < now))
    stmt = conflict_insert(conn, ENDED_SESSIONS).values(session_id=session_id, until=until)
    conn.execute(stmt.on_conflict_do_nothing(index_elements=["session_id"]))


def ended(conn: Connection, session_id: str) -> bool:
    """Whether ``session_id`` was recorded as ended."""
    query = select(exists().where(ENDED_SESSIONS.c.session_id == session_id))
    return bool(conn.execute(query).scalar())
