"""The cost page: ``spotd report``'s figures and charts for a window the page chooses.

The report is built from the ledger by :func:`spotd.billing.reports.build_report`,
the charts drawn by :func:`spotd.billing.reports.render_charts`: the page shows
the figures the report, its email and ``/metrics`` show. A window's report and
charts are kept a few seconds, so that the page and its three chart images,
asked for together, build it once.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from spotd.billing import reports
from spotd.engine.reconcile import Engine
from spotd.market.ttl import TtlCache

DEFAULT_DAYS = 7
"""The window when the form names none: the last week on the records' clock."""
KEEP_SECONDS = 10.0
"""How long a window's report and charts are reused."""
JOBS_SHOWN = 20
"""The most expensive jobs listed (the jobs chart shows the top 12 too)."""


@dataclass(frozen=True)
class Window:
    """The reported period ``[since, until)`` and what the form said."""

    since: datetime
    until: datetime
    error: str | None = None
    """Why the form's dates were not taken (the default window is shown instead)."""

    @property
    def query(self) -> str:
        """The window as the chart images' query string."""
        return f"since={_minute(self.since)}&until={_minute(self.until)}"


def window_of(since: str | None, until: str | None, now: datetime) -> Window:
    """The window from the form: ISO dates or times (UTC unless they say otherwise);
    without ``since`` the last :data:`DEFAULT_DAYS` days up to ``until`` or ``now``."""
    try:
        end = _utc(until) if until else now
        start = _utc(since) if since else end - timedelta(days=DEFAULT_DAYS)
    except ValueError:
        return Window(now - timedelta(days=DEFAULT_DAYS), now,
                      error="dates must read like 2026-02-01 or 2026-02-01T12:00")  # fmt: skip
    if start >= end:
        return Window(now - timedelta(days=DEFAULT_DAYS), now,
                      error="the start must come before the end")  # fmt: skip
    return Window(start, end)


def _utc(text: str) -> datetime:
    moment = datetime.fromisoformat(text.strip())
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _minute(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


class CostReports:
    """Reports and charts by window, each kept :data:`KEEP_SECONDS`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._reports: TtlCache[tuple[datetime, datetime], reports.Report] = TtlCache(
            KEEP_SECONDS, max_items=8
        )
        self._charts: TtlCache[tuple[datetime, datetime], dict[str, bytes]] = TtlCache(
            KEEP_SECONDS, max_items=8
        )

    def report(self, window: Window) -> reports.Report:
        """The report of ``window``, from the ledger."""
        key = (window.since, window.until)
        return self._reports.get_or_load(key, lambda: reports.build_report(
            self._engine.store, since=window.since, until=window.until
        ))  # fmt: skip

    def chart(self, window: Window, name: str) -> bytes | None:
        """The PNG of chart ``name`` (one of ``reports.CHART_NAMES``), None for no such."""
        if name not in reports.CHART_NAMES:
            return None
        key = (window.since, window.until)
        drawn = self._charts.get_or_load(key, lambda: reports.render_charts(self.report(window)))
        return drawn.get(name)
