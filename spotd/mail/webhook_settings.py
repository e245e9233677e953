"""The ``[webhooks.<name>]`` tables of the daemon's config.

Kept apart from :mod:`spotd.mail.webhooks` (payloads, signatures, the POST) so
that reading a config loads no more than the settings need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints, field_validator

from spotd.core.states import WAITING_CAUSE

if TYPE_CHECKING:
    from spotd.core.values import JobStatus

PREEMPTED = "preempted"
"""A transition name that is no status: an attempt ended by a preemption (the job goes
to ``recovering``, or ``failed`` over its budget)."""

WAITING: str = WAITING_CAUSE.value
"""A transition name that is no status: a pending or recovering job's new waiting reason
(``spotd.engine.waiting``), an event that stays in its status. A status's own
transitions leave these out: they say why a job waits, they do not move it."""

DEFAULT_TRANSITIONS = ("succeeded", "failed", "cancelled", "recovering", PREEMPTED)
"""Every end, and every interruption of a running job."""

WebhookName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
"""What a webhook's ``<name>`` may be (it is part of its claims in the store)."""

DELIVERY_HEADER = "X-Spotd-Delivery"
TIMESTAMP_HEADER = "X-Spotd-Timestamp"
SIGNATURE_HEADER = "X-Spotd-Signature"
_OWN_HEADERS = frozenset(
    h.lower()
    for h in ("Content-Type", "User-Agent", DELIVERY_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER)
)


class WebhookSettings(BaseModel):
    """A ``[webhooks.<name>]`` table: where to POST which job transitions, and how."""

    # A refused URL or header is not shown back: it may be the credential.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    url: SecretStr
    """The ``http://`` or ``https://`` URL to POST to; secret, since a Slack webhook's
    URL is its credential."""
    format: Literal["json", "slack"] = "json"
    """``json``: spotd's generic event; ``slack``: a Slack-compatible ``{"text": ...}``."""
    transitions: tuple[str, ...] = DEFAULT_TRANSITIONS
    """Statuses whose transitions are sent (into that status), and ``preempted``."""
    secret: SecretStr | None = None
    """Key of the HMAC-SHA256 signature in ``X-Spotd-Signature``; None: unsigned."""
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    """Extra request headers (``Authorization = "Bearer ..."``), their values secret."""
    timeout_seconds: float = Field(default=10.0, gt=0)
    """Longest wait for one POST: connecting, sending and the answer."""
    max_tries: int = Field(default=8, ge=1)
    """POSTs of one event before it is dropped (logged as a warning)."""
    retry_base_seconds: float = Field(default=5.0, gt=0)
    """Wait after an event's first failed POST; doubles with every failure."""
    retry_max_seconds: float = Field(default=600.0, gt=0)
    """Longest wait between two POSTs of one event."""
    slack_blocks: bool = False
    """With ``format = "slack"``: add Block Kit ``blocks`` beside the ``text``."""

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: SecretStr) -> SecretStr:
        parts = urlsplit(value.get_secret_value())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        return value

    @field_validator("transitions")
    @classmethod
    def _check_transitions(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # A status (the transitions into it), or ``preempted``.
        from spotd.core.values import JobStatus

        unknown = sorted(set(value) - {*(s.value for s in JobStatus), PREEMPTED, WAITING})
        if unknown:
            raise ValueError(
                f"unknown transitions {unknown}: use statuses "
                f"({', '.join(s.value for s in JobStatus)}), {PREEMPTED!r} or {WAITING!r}"
            )
        return value

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        taken = sorted(h for h in value if h.lower() in _OWN_HEADERS)
        if taken:
            raise ValueError(f"{taken} are set by spotd itself")
        return value

    @property
    def statuses(self) -> frozenset[JobStatus]:
        """The statuses whose transitions are sent."""
        from spotd.core.values import JobStatus

        return frozenset(JobStatus(t) for t in self.transitions if t not in (PREEMPTED, WAITING))

    @property
    def causes(self) -> frozenset[str]:
        """The event causes that are sent whatever the status (a preemption's, a new
        waiting reason's)."""
        return frozenset(c for c in (PREEMPTED, WAITING) if c in self.transitions)

    @property
    def host(self) -> str:
        """The URL's host, the one part of it that log lines show."""
        return urlsplit(self.url.get_secret_value()).hostname or "?"
