"""Webhooks on job transitions: their settings, what they carry, and one HTTP POST.

A webhook is a ``[webhooks.<name>]`` table of the daemon's config
(:class:`~spotd.mail.webhook_settings.WebhookSettings`). For every transition
it asks for, the daemon POSTs one JSON body to its URL, in one of two formats:

``json``
    A generic event (:func:`json_payload`): the job's id, name and team, the
    statuses from and to, the cause and detail, the failure cause of a failed
    job, the time of the transition on the engine's clock, and the job's cost so
    far by its ledger.
``slack``
    What Slack's incoming webhooks (and the services that accept their format)
    take (:func:`slack_payload`): ``{"text": ...}``, and with ``slack_blocks``
    the same as Block Kit blocks.

Every POST carries ``X-Spotd-Delivery: <webhook>:<event id>``, the same for
every try of one event, so a receiver can drop a repeat. With a ``secret``, it
also carries ``X-Spotd-Timestamp`` (Unix seconds) and ``X-Spotd-Signature:
sha256=<hex>``, the HMAC-SHA256 of ``<timestamp>.<body>`` keyed with the
secret (see :func:`signature`). The URL, the secret and the extra headers'
values are secret strings: no log line or repr shows them (a Slack webhook's
URL is its credential).

Which daemon sends, when, and how failures are retried is
:mod:`spotd.mail.webhook_worker`'s.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from spotd import __version__
from spotd.core.errors import WebhookUndelivered
from spotd.core.states import JobStatus
from spotd.core.values import EventRecord, JobRecord
from spotd.mail.webhook_settings import (
    DEFAULT_TRANSITIONS,
    DELIVERY_HEADER,
    PREEMPTED,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookName,
    WebhookSettings,
)

__all__ = [
    "DEFAULT_TRANSITIONS",
    "DELIVERY_HEADER",
    "PREEMPTED",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "JobTransition",
    "WebhookName",
    "WebhookSettings",
    "WebhookUndelivered",
    "body",
    "delivery_id",
    "json_payload",
    "post",
    "request_headers",
    "signature",
    "slack_payload",
]


@dataclass(frozen=True, slots=True)
class JobTransition:
    """One job's transition as webhooks tell it: the event, the job, its cost so far."""

    event: EventRecord
    job: JobRecord
    cost_usd: float
    """The job's spend by its ledger when the delivery was made ready (its final cost
    for an ended job the engine has billed)."""


def delivery_id(webhook: str, event_id: int) -> str:
    """What ``X-Spotd-Delivery`` and the JSON's ``delivery_id`` say: one per event and
    webhook, the same on every try."""
    return f"{webhook}:{event_id}"


def json_payload(webhook: str, t: JobTransition) -> dict[str, Any]:
    """The generic event (``format = "json"``)."""
    e, job = t.event, t.job
    return {
        "delivery_id": delivery_id(webhook, e.id),
        "event_id": e.id,
        "job_id": job.id,
        "job_name": job.name,
        "team": job.spec.team,
        "from_status": str(e.from_status) if e.from_status is not None else None,
        "to_status": str(e.to_status),
        "cause": e.cause,
        "detail": e.detail,
        # The failure cause belongs to the job's failed end, not to earlier events.
        "failure": str(job.failure)
        if e.to_status is JobStatus.FAILED and job.failure is not None
        else None,
        "terminal": e.to_status.terminal,
        "at": e.at.astimezone(UTC).isoformat(),
        "cost_usd": round(t.cost_usd, 6),
    }


def slack_payload(t: JobTransition, *, blocks: bool = False) -> dict[str, Any]:
    """A Slack incoming-webhook message (``format = "slack"``): the ``text`` always (the
    notification and fallback), and Block Kit ``blocks`` if asked."""
    e, job = t.event, t.job
    moved = f"{e.from_status} → {e.to_status}" if e.from_status is not None else str(e.to_status)
    headline = f"spotd: job *{_mrkdwn(job.name)}* (`{job.id}`) {moved}: {_mrkdwn(e.cause)}"
    lines = [headline]
    if e.detail:
        lines.append(_mrkdwn(e.detail))
    lines.append(f"Cost so far: {t.cost_usd:,.2f} USD")
    text = "\n".join(lines)
    message: dict[str, Any] = {"text": text}
    if blocks:
        context = [f"event {e.id}", f"{e.at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"]
        if job.spec.team:
            context.insert(0, f"team {_mrkdwn(job.spec.team)}")
        message["blocks"] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(context)}]},
        ]
    return message


def _mrkdwn(text: str) -> str:
    # Slack reads &, < and > as markup (links, mentions): a job's detail must not be.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def body(webhook: str, settings: WebhookSettings, t: JobTransition) -> bytes:
    """The request body of ``t`` for the webhook, as UTF-8 JSON."""
    payload = (
        slack_payload(t, blocks=settings.slack_blocks)
        if settings.format == "slack"
        else json_payload(webhook, t)
    )
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def signature(secret: str, timestamp: int, content: bytes) -> str:
    """``sha256=`` and the hex HMAC-SHA256 of ``<timestamp>.<content>`` keyed with
    ``secret``: a receiver recomputes it, compares in constant time, and refuses an
    old timestamp (a replay)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + content, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def request_headers(
    settings: WebhookSettings, delivery: str, content: bytes, *, now: datetime
) -> dict[str, str]:
    """The headers of one POST: the configured ones, then spotd's own and the signature."""
    headers = {name: value.get_secret_value() for name, value in settings.headers.items()}
    headers.update(
        {
            "Content-Type": "application/json",
            "User-Agent": f"spotd/{__version__}",
            DELIVERY_HEADER: delivery,
        }
    )
    if settings.secret is not None:
        timestamp = int(now.timestamp())
        headers[TIMESTAMP_HEADER] = str(timestamp)
        headers[SIGNATURE_HEADER] = signature(
            settings.secret.get_secret_value(), timestamp, content
        )
    return headers


def post(settings: WebhookSettings, content: bytes, headers: dict[str, str]) -> None:
    """POST ``content`` to the webhook's URL; :class:`WebhookUndelivered` unless a 2xx.

    Redirects are not followed (a webhook URL that moved is a configuration to
    fix, and a redirect would carry the signature elsewhere). Proxies come from
    the usual environment variables.
    """
    # Here, not at the top: the daemon's config imports this module's settings, and a
    # command that only reads the config should not load an HTTP client for it.
    import httpx

    try:
        reply = httpx.post(
            settings.url.get_secret_value(),
            content=content,
            headers=headers,
            timeout=settings.timeout_seconds,
            follow_redirects=False,
        )
    except httpx.HTTPError as exc:
        # httpx's own message names no URL; the URL may be the credential.
        raise WebhookUndelivered(f"{type(exc).__name__}: {exc}") from None
    if not 200 <= reply.status_code < 300:
        answer = reply.text[:200].strip().replace("\n", " ")
        raise WebhookUndelivered(f"HTTP {reply.status_code}: {answer}")
