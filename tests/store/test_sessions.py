"""spotd.store.sessions: the dashboard's logged-out sessions (both backends)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from spotd.store import open_store
from spotd.store.sql import SqlStore
from spotd.store.tables import ENDED_SESSIONS


def _rows(store: SqlStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(ENDED_SESSIONS)).scalar_one())


def test_an_ended_session_is_refused_and_others_are_not(store: SqlStore) -> None:
    later = datetime.now(UTC) + timedelta(hours=12)
    assert not store.session_ended("a" * 32)
    store.end_session("a" * 32, until=later)
    assert store.session_ended("a" * 32)
    assert not store.session_ended("b" * 32)
    # Two tabs logging out of one session at once: the second is no error.
    store.end_session("a" * 32, until=later)
    assert store.session_ended("a" * 32) and _rows(store) == 1


def test_every_daemon_on_the_database_sees_the_logout(store_url: str) -> None:
    first, second = open_store(store_url), open_store(store_url)
    try:
        first.end_session("c" * 32, until=datetime.now(UTC) + timedelta(hours=1))
        assert second.session_ended("c" * 32)
    finally:
        first.close()
        second.close()


def test_sessions_past_their_expiry_are_forgotten_at_the_next_logout(store: SqlStore) -> None:
    now = datetime.now(UTC)
    store.end_session("old", until=now - timedelta(seconds=1))
    store.end_session("live", until=now + timedelta(hours=1))
    assert not store.session_ended("old"), "its cookie has expired: nothing left to refuse"
    assert store.session_ended("live") and _rows(store) == 1
