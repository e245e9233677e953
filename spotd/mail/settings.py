"""The ``[email]`` settings and cron expressions for scheduled reports."""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from apscheduler.triggers.cron import CronTrigger
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, model_validator

from spotd.core.spec_fields import Email

log = logging.getLogger(__name__)

_DEFAULT_PORTS = {"starttls": 587, "tls": 465, "none": 25}
_WINDOW_RE = re.compile(r"(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?")


def parse_window(value: object) -> object:
    """``"7d"``, ``"1d12h"``, ``"2w"``, ``"90m"`` as a timedelta; other values unchanged.

    Unchanged values go on to pydantic's own timedelta parsing (seconds, ISO 8601).
    """
    if not isinstance(value, str):
        return value
    match = _WINDOW_RE.fullmatch(value.strip())
    if not value.strip() or match is None:
        raise ValueError(f'expected a duration like "1d", "7d" or "12h", got {value!r}')
    weeks, days, hours, minutes = (int(g) if g else 0 for g in match.groups())
    window = timedelta(weeks=weeks, days=days, hours=hours, minutes=minutes)
    if window <= timedelta(0):
        raise ValueError(f"must be longer than 0, got {value!r}")
    return window


Window = Annotated[timedelta, BeforeValidator(parse_window)]


def _default_schedules() -> dict[str, str]:
    return {"daily": "0 8 * * *", "weekly": "0 8 * * mon"}


def _default_windows() -> dict[str, timedelta]:
    return {"daily": timedelta(days=1), "weekly": timedelta(days=7)}


class EmailSettings(BaseModel):
    """The ``[email]`` table: SMTP server, recipients, report schedules, budget alerts.

    Email is off until ``host`` is set. The password is best given as
    ``SPOTD_EMAIL__PASSWORD`` rather than written into ``spotd.toml``.
    """

    model_config = ConfigDict(extra="forbid")

    host: str | None = None
    """SMTP server; None turns email off."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """None: 587 for starttls, 465 for tls, 25 for none."""
    security: Literal["starttls", "tls", "none"] = "starttls"
    """``starttls`` upgrades a plain connection; ``tls`` is TLS from the first byte."""
    username: str | None = None
    """Login name; no login when None."""
    password: SecretStr | None = None
    """Login password (``SPOTD_EMAIL__PASSWORD``); never logged or shown."""
    ca_file: Path | None = None
    """PEM file of the CAs to trust for the server's certificate; None: the system's."""
    sender: str = "spotd@localhost"
    """The From address, optionally with a display name (``spotd <spotd@example.com>``)."""
    to: tuple[Email, ...] = ()
    """Default recipients: scheduled reports and budget alerts."""
    timeout_seconds: float = Field(default=30.0, gt=0)
    """Socket timeout of one SMTP conversation."""
    schedules: dict[str, str] = Field(default_factory=_default_schedules)
    """Report name -> cron expression (minute hour day month weekday, UTC)."""
    report_windows: dict[str, Window] = Field(default_factory=_default_windows)
    """Report name -> how far back the report looks (``"1d"``, ``"7d"``)."""
    budget_thresholds: tuple[float, ...] = (0.8, 1.0)
    """Fractions of a job's budget whose crossing sends one alert each."""
    budget_check_seconds: float = Field(default=60.0, gt=0)
    """Real seconds between two budget checks of the active jobs."""
    flush_seconds: float = Field(default=60.0, gt=0)
    """Real seconds between two delivery rounds of the outbox."""
    retry_base_seconds: float = Field(default=60.0, gt=0)
    """Wait after a message's first failed send; doubles with every failure."""
    retry_max_seconds: float = Field(default=3600.0, gt=0)
    """Longest wait between two sends of one message."""

    @model_validator(mode="after")
    def _check(self) -> EmailSettings:
        for name, expression in self.schedules.items():
            if name not in self.report_windows:
                raise ValueError(f"schedule {name!r} has no entry in report_windows")
            try:
                cron_trigger(expression)
            except ValueError as exc:
                raise ValueError(f"schedule {name!r}: {exc}") from None
        if any(t <= 0 for t in self.budget_thresholds):
            raise ValueError("budget_thresholds must all be > 0")
        self.budget_thresholds = tuple(sorted(set(self.budget_thresholds)))
        return self

    @property
    def enabled(self) -> bool:
        """Whether email is configured at all."""
        return self.host is not None

    @property
    def effective_port(self) -> int:
        """The port to connect to, defaulted by ``security``."""
        return self.port or _DEFAULT_PORTS[self.security]


# Cron

_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DAY_ORDER = (1, 2, 3, 4, 5, 6, 0)


def cron_trigger(expression: str, timezone: str = "UTC") -> Any:
    """An APScheduler trigger for a five-field crontab expression, with crontab's weekdays.

    APScheduler 3 numbers weekdays from Monday = 0 while crontab uses Sunday
    = 0 (and 7); its ``from_crontab`` keeps the numbers, so ``0 8 * * 1``
    would fire on Tuesdays. The weekday field is therefore rewritten as day
    names. Crontab fires when *either* restricted day field matches and
    APScheduler when both do, so restricting both is refused rather than
    silently read differently.
    """
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 cron fields (minute hour day month weekday): {expression!r}")
    minute, hour, day, month, weekday = fields
    if day != "*" and weekday != "*":
        raise ValueError(f"restrict the day of month or the weekday, not both: {expression!r}")
    return CronTrigger(
        minute=minute,
        hour=hour,
        day=day,
        month=month,
        day_of_week=_crontab_weekdays(weekday),
        timezone=timezone,
    )


def _crontab_weekdays(spec: str) -> str:
    """Crontab's weekday field as a list of APScheduler day names."""
    if spec == "*":
        return "*"
    days: set[int] = set()
    for item in spec.lower().split(","):
        days.update(_weekday_item(item))
    return ",".join(_DAY_NAMES[d] for d in _DAY_ORDER if d in days)


def _weekday_item(item: str) -> set[int]:
    base, slash, step_text = item.partition("/")
    step = int(step_text) if slash and step_text.isdigit() else 1
    if slash and (not step_text.isdigit() or step < 1):
        raise ValueError(f"bad weekday step in {item!r}")
    if base == "*":
        low, high = 0, 6
    elif "-" in base:
        first, _, last = base.partition("-")
        low, high = _weekday_value(first), _weekday_value(last)
    else:
        low = _weekday_value(base)
        high = 6 if slash else low
    if low > high:
        raise ValueError(f"weekday range runs backwards in {item!r}")
    return {d % 7 for d in range(low, high + 1, step)}


def _weekday_value(text: str) -> int:
    if text.isdigit() and int(text) <= 7:
        return int(text)
    if text[:3] in _DAY_NAMES and len(text) == 3:
        return _DAY_NAMES.index(text)
    raise ValueError(f"bad weekday {text!r} (0-7 or sun..sat)")
