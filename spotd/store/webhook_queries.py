"""The reads behind job-transition webhooks: which events a webhook has yet to settle.

A webhook's progress is kept in the store's ``notifications`` table, the one
the mailer's claims use, so it is shared by every daemon on the database and
survives restarts: ``<prefix><event id>`` is claimed once an event was
delivered to the webhook (or given up on), and ``webhook-start:<name>`` when
the webhook was first seen, on the engine's clock. This module only reads;
the claims are made through :meth:`~spotd.store.sql.SqlStore.claim_notification`.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import Engine, String, and_, cast, exists, func, literal, or_, select

from spotd.core.states import WAITING_CAUSE, JobStatus
from spotd.core.values import EventRecord
from spotd.store.rows import event_record
from spotd.store.sql import SqlStore
from spotd.store.tables import EVENTS, NOTIFICATIONS


class WebhookQueries:
    """Reads of the events table and of the notification claims, for one database."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @classmethod
    def of(cls, store: object) -> WebhookQueries | None:
        """The queries over ``store``'s database; None for a store that is not SQL."""
        return cls(store.engine) if isinstance(store, SqlStore) else None

    def claimed_at(self, key: str) -> datetime | None:
        """When notification ``key`` was claimed; None when it never was."""
        query = select(NOTIFICATIONS.c.at).where(NOTIFICATIONS.c.key == key)
        with self._engine.begin() as conn:
            at: datetime | None = conn.execute(query).scalar()
            return at

    def last_event_id(self) -> int:
        """The highest event id so far (0 for none): one read of the primary key's end."""
        with self._engine.begin() as conn:
            return int(conn.execute(select(func.max(EVENTS.c.id))).scalar() or 0)

    def unsettled(
        self,
        prefix: str,
        *,
        statuses: Collection[JobStatus],
        causes: Collection[str],
        since: datetime,
        after_id: int,
    ) -> list[EventRecord]:
        """Events past ``after_id`` at ``since`` or later, to one of ``statuses`` or with
        one of ``causes``, that have no ``<prefix><event id>`` claim yet; oldest first.

        The claim is looked up per event by the notifications' primary key, so the
        cost is that of the events read, which ``after_id`` keeps to the recent ones
        once a first scan has been made.
        """
        matching = []
        if statuses:
            # A new waiting reason stays in its status: it is sent by its cause alone.
            into = EVENTS.c.to_status.in_([s.value for s in statuses])
            matching.append(and_(into, EVENTS.c.cause != WAITING_CAUSE))
        if causes:
            matching.append(EVENTS.c.cause.in_(list(causes)))
        if not matching:
            return []
        key = literal(prefix, String) + cast(EVENTS.c.id, String)
        settled = exists().where(NOTIFICATIONS.c.key == key)
        query = (
            select(EVENTS)
            .where(EVENTS.c.id > after_id, EVENTS.c.at >= since, or_(*matching), ~settled)
            .order_by(EVENTS.c.id)
        )
        with self._engine.begin() as conn:
            return [event_record(row) for row in conn.execute(query)]


