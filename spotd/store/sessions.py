"""The dashboard's logged-out sessions (``ended_sessions``), inside a transaction.

A session cookie is signed, so a daemon can check it without the database;
only a logout needs the database, to refuse a copy of the cookie that
outlives the browser that logged out, on every daemon sharing the store.
A row is kept until the cookie would have expired anyway, then dropped by
the next logout.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, delete, exists, select

from spotd.store.tables import ENDED_SESSIONS, conflict_insert


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
