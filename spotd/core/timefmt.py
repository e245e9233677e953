"""How times are shown to people: one zone, 24-hour ISO 8601, everywhere.

The CLI, the daemon's log, the dashboard, reports and email all format a
moment through :func:`shown`, so a time read in one place can be found in
another. The zone is UTC unless ``[display] timezone`` names another (an
IANA name such as ``Europe/Berlin``); machines keep UTC in the store and on
the wire whatever it is.
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


class Precision(StrEnum):
    """How much of a moment :func:`shown` gives."""

    SECOND = "second"
    MINUTE = "minute"
    DAY = "day"


_PATTERNS = {
    Precision.SECOND: "%Y-%m-%d %H:%M:%S",
    Precision.MINUTE: "%Y-%m-%d %H:%M",
    Precision.DAY: "%Y-%m-%d",
}


def zone_named(name: str) -> tzinfo:
    """The zone for an IANA name (``UTC``, ``Europe/Berlin``); ValueError if unknown."""
    if name.upper() in ("UTC", "Z"):
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}: give an IANA name such as "
                         "'UTC' or 'Europe/Berlin'") from None  # fmt: skip


def suffix(at: datetime) -> str:
    """``Z`` for UTC, else the offset as ``+01:00`` (ISO 8601)."""
    offset = at.utcoffset()
    if not offset:
        return "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def shown(
    at: datetime, zone: tzinfo = UTC, precision: Precision = Precision.SECOND
) -> str:
    """``at`` as people read it: ``2026-12-04 15:21:44Z`` (RFC 3339 with a space).

    A naive ``at`` is taken as UTC, which is what the store and the clocks give.
    Days carry no zone suffix.
    """
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    local = aware.astimezone(zone)
    text = local.strftime(_PATTERNS[precision])
    return text if precision is Precision.DAY else text + suffix(local)
