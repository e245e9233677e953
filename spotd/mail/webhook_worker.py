"""Delivering webhooks: off the reconcile loop, durable, and once per event.

The daemon runs :meth:`WebhookDispatcher.run` as an APScheduler job every
tick. Each round, for each webhook:

1. **Find** the job events it asks for that it has not settled yet, from the
   store's ``events`` table (:class:`~spotd.store.webhook_queries.WebhookQueries`).
   The events are the record of every transition, whichever daemon, command or
   API call made it, so nothing depends on the engine calling back, and
   nothing a daemon holds in memory is needed to find them again after a
   restart.
2. **Send** each, oldest first; the body is built once (the job's cost so far
   by its ledger at that moment) and every retry sends the same bytes.
3. **Settle** it on success, or once ``max_tries`` POSTs failed (the event is
   then dropped, with a warning naming it): the claim
   ``webhook:<name>:<event id>`` in the store's ``notifications`` table, which
   every daemon on the database and every later start sees.

A failed POST is retried after ``retry_base_seconds``, doubled each time up
to ``retry_max_seconds``, and the webhook's later events wait behind it: they
arrive in order, and an endpoint that is down gets one POST per backoff, not
one per event. Nothing here raises into the scheduler.

**Once.** Only the daemon that leads (``leading()``, the leader lock of
:class:`~spotd.store.coordination.Coordinator`; always the one daemon on
SQLite) delivers, so two daemons never send the same event at once. A new
leader takes over every unsettled event from the store. An event is settled
right after its 2xx: a daemon that dies between the receiver's answer and that
commit sends the event again after its restart (or from the next leader), the
one case of a repeat, with the same ``X-Spotd-Delivery`` for the receiver to
drop. Retry counts are kept in memory: a restart gives every unsettled event
its ``max_tries`` again.

**From when.** A webhook sends the transitions from when a daemon first saw
it (claimed as ``webhook-start:<name>``, on the engine's clock), not the
store's whole history.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from spotd.billing.ledger import spend_so_far
from spotd.core.clock import WALL
from spotd.core.contracts import Clock, TransitionSource
from spotd.core.values import EventRecord
from spotd.mail.webhooks import (
    JobTransition,
    WebhookSettings,
    WebhookUndelivered,
    body,
    delivery_id,
    post,
    request_headers,
)
from spotd.store.webhook_queries import WebhookQueries

log = logging.getLogger(__name__)

BUILD_PER_ROUND = 200
"""Events made ready per webhook and round, at most: a backlog (a first start on a busy
store, a long outage) is worked through over several rounds, none of them long."""
LOOKBACK_EVENTS = 200
"""Event ids below the last one seen that every round reads again. On PostgreSQL ids are
handed out before commit, so a transaction can commit an id lower than one already
read; transitions are short, so one is never this far behind."""

Sender = Callable[[WebhookSettings, bytes, dict[str, str]], None]
"""Makes one POST (:func:`spotd.mail.webhooks.post`); raises WebhookUndelivered."""



def settled_key(webhook: str, event_id: int) -> str:
    """The claim that says the webhook is done with the event (sent, or dropped)."""
    return f"{_prefix(webhook)}{event_id}"


def start_key(webhook: str) -> str:
    """The claim whose time is when the webhook was first seen."""
    return f"webhook-start:{webhook}"


def _prefix(webhook: str) -> str:
    return f"webhook:{webhook}:"


@dataclass
class _Delivery:
    """One event on its way to one webhook."""

    event: EventRecord
    content: bytes
    tries: int = 0
    done: bool = False
    """Delivered (or dropped), maybe not yet settled in the store: never POSTed again."""


@dataclass
class _Hook:
    """What the dispatcher keeps of one webhook while it leads."""

    name: str
    settings: WebhookSettings
    since: datetime | None = None
    floor: int | None = None
    """Events above this id are read each round; None: not scanned yet (read them all)."""
    pending: dict[int, _Delivery] = field(default_factory=dict)
    due: float = 0.0
    """When (the wall clock's ``monotonic``) the webhook may be POSTed to again, after a
    failure."""


class WebhookDispatcher:
    """Sends the webhooks' job transitions (see the module doc).

    ``clock`` is the engine's (costs, claims); ``wall`` the real one (the
    signatures' timestamps, the retry backoff), which a simulated market's is not.
    """

    def __init__(
        self,
        webhooks: Mapping[str, WebhookSettings],
        store: TransitionSource,
        queries: WebhookQueries,
        clock: Clock,
        *,
        leading: Callable[[], bool] = lambda: True,
        sender: Sender = post,
        wall: Clock = WALL,
    ) -> None:
        self._hooks = [_Hook(name, s) for name, s in sorted(webhooks.items())]
        self._store = store
        self._queries = queries
        self._clock = clock
        self._leading = leading
        self._send = sender
        self.wall = wall
        self._stopping = threading.Event()

    @property
    def names(self) -> list[str]:
        """The webhooks' names."""
        return [h.name for h in self._hooks]

    def pending(self) -> dict[str, int]:
        """Events ready and not yet settled, per webhook (in this daemon's memory)."""
        return {h.name: len(h.pending) for h in self._hooks}

    def prepare(self) -> None:
        """Record when each webhook was first seen, before any transition of this start
        can happen (the daemon calls it before its scheduler runs); never raises. A
        failure is left to the first round."""
        for hook in self._hooks:
            try:
                hook.since = self._first_seen(hook.name)
            except Exception:
                log.exception("webhook %s: could not read or record its start", hook.name)

    def stop(self) -> None:
        """End the round in flight after its current POST; no round starts after."""
        self._stopping.set()

    def run(self) -> int:
        """One round over every webhook; the events delivered. Never raises."""
        if self._stopping.is_set():
            return 0
        try:
            leading = self._leading()
        except Exception:
            log.exception("webhooks: leadership unknown; not sending this round")
            leading = False
        if not leading:
            # The leader sends; should this daemon lead later, it starts from the store.
            for hook in self._hooks:
                hook.since, hook.floor, hook.pending, hook.due = None, None, {}, 0.0
            return 0
        delivered = 0
        for hook in self._hooks:
            try:
                self._find(hook)
                delivered += self._deliver(hook)
            except Exception:
                # A database hiccup or a bug: this webhook waits for the next round.
                log.exception("webhook %s: round failed; the next round retries", hook.name)
        return delivered

    # -- steps ------------------------------------------------------------------

    def _find(self, hook: _Hook) -> None:
        """Make ready the webhook's unsettled events this round can take."""
        if hook.since is None:
            hook.since = self._first_seen(hook.name)
        last = self._queries.last_event_id()
        found = self._queries.unsettled(
            _prefix(hook.name),
            statuses=hook.settings.statuses,
            causes=hook.settings.causes,
            since=hook.since,
            after_id=-1 if hook.floor is None else hook.floor,
        )
        fresh = [e for e in found if e.id not in hook.pending]
        left: EventRecord | None = None
        for i, event in enumerate(fresh):
            if i >= BUILD_PER_ROUND:
                left = event
                break
            try:
                hook.pending[event.id] = _Delivery(event, self._content(hook, event))
            except Exception:
                log.exception(
                    "webhook %s: event %d of job %s could not be made ready; "
                    "the next round tries again",
                    hook.name,
                    event.id,
                    event.job_id,
                )
                left = event
                break
        # Read again from where this round stopped, with a margin for late commits.
        upto = last if left is None else left.id - 1
        hook.floor = max(-1, upto - LOOKBACK_EVENTS)

    def _deliver(self, hook: _Hook) -> int:
        """POST the ready events in order, oldest first, until one fails.

        The webhook backs off as a whole: while its oldest event waits for its
        retry, the later ones wait behind it, so a receiver that is down gets
        one POST per backoff rather than one per event and round, and events
        arrive in the order they happened.
        """
        delivered = 0
        for event_id in sorted(hook.pending):
            if self._stopping.is_set():
                break
            d = hook.pending[event_id]
            if not d.done:
                if hook.due > self.wall.monotonic():
                    break
                try:
                    self._post(hook, d)
                except Exception as exc:
                    if not isinstance(exc, WebhookUndelivered):
                        # Not an answer of the endpoint's (an unmappable header, a bug):
                        # counted and backed off like one, so it is dropped in the end.
                        log.exception("webhook %s: POST raised", hook.name)
                        exc = WebhookUndelivered(f"{type(exc).__name__}: {exc}")
                    if not self._failed(hook, d, exc):
                        break
                    # Dropped for good: settled below like a delivery, and the next
                    # event is tried at the next round.
                    d.done = True
                    self._settle(hook, d)
                    break
                delivered += 1
                d.done = True
            self._settle(hook, d)
        return delivered

    # -- helpers --------------------------------------------------------------

    def _first_seen(self, name: str) -> datetime:
        key = start_key(name)
        self._store.claim_notification(key, at=self._clock.now())
        since = self._queries.claimed_at(key)
        if since is None:  # pragma: no cover - the claim above wrote it
            raise RuntimeError(f"the claim {key} is not in the store")
        return since

    def _content(self, hook: _Hook, event: EventRecord) -> bytes:
        job = self._store.get_job(event.job_id)
        cost = spend_so_far(
            job, self._store.attempts(job.id), self._store.ledger(job_id=job.id), self._clock.now()
        )
        return body(hook.name, hook.settings, JobTransition(event, job, cost))

    def _post(self, hook: _Hook, d: _Delivery) -> None:
        headers = request_headers(
            hook.settings, delivery_id(hook.name, d.event.id), d.content, now=self.wall.now()
        )
        d.tries += 1
        self._send(hook.settings, d.content, headers)
        log.info(
            "webhook %s: sent event %d of job %s (%s -> %s)",
            hook.name,
            d.event.id,
            d.event.job_id,
            d.event.from_status,
            d.event.to_status,
        )

    def _failed(self, hook: _Hook, d: _Delivery, exc: WebhookUndelivered) -> bool:
        """Count a failed POST; True when the event is dropped for good."""
        s = hook.settings
        if d.tries >= s.max_tries:
            log.warning(
                "webhook %s (%s): dropped event %d of job %s (%s -> %s) after %d tries: %s",
                hook.name,
                s.host,
                d.event.id,
                d.event.job_id,
                d.event.from_status,
                d.event.to_status,
                d.tries,
                exc,
            )
            return True
        wait = min(s.retry_base_seconds * 2 ** (d.tries - 1), s.retry_max_seconds)
        hook.due = self.wall.monotonic() + wait
        log.warning(
            "webhook %s (%s): event %d of job %s not delivered (try %d of %d), again in %.0f s: %s",
            hook.name,
            s.host,
            d.event.id,
            d.event.job_id,
            d.tries,
            s.max_tries,
            wait,
            exc,
        )
        return False

    def _settle(self, hook: _Hook, d: _Delivery) -> None:
        try:
            self._store.claim_notification(settled_key(hook.name, d.event.id), at=self._clock.now())
        except Exception:
            # Kept as done: the claim is retried next round, the POST is not repeated.
            log.exception(
                "webhook %s: could not record event %d as sent; retrying the record",
                hook.name,
                d.event.id,
            )
            return
        del hook.pending[d.event.id]


def build_dispatcher(
    webhooks: Mapping[str, WebhookSettings],
    store: TransitionSource,
    clock: Clock,
    *,
    leading: Callable[[], bool],
) -> WebhookDispatcher | None:
    """The dispatcher of the ``[webhooks]`` tables; None when there are none, or when
    ``store`` is not the SQL store (whose events and claims the webhooks read)."""
    if not webhooks:
        return None
    queries = WebhookQueries.of(store)
    if queries is None:
        log.warning("webhooks need the SQL store; %s has none: not sent", type(store).__name__)
        return None
    return WebhookDispatcher(webhooks, store, queries, clock, leading=leading)


def schedule_webhooks(scheduler: Any, dispatcher: WebhookDispatcher, *, seconds: float) -> str:
    """Add the ``webhooks`` job (a round every ``seconds``) to an APScheduler 3
    scheduler, after :meth:`WebhookDispatcher.prepare`; return its id."""
    dispatcher.prepare()
    scheduler.add_job(
        dispatcher.run,
        "interval",
        seconds=seconds,
        id="webhooks",
        max_instances=1,
        coalesce=True,
        next_run_time=dispatcher.wall.now(),
    )
    return "webhooks"
