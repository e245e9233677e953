"""The cost page: ``spotd report``'s figures and charts for a window the page chooses.

The report is built from the ledger by :func:`spotd.billing.reports.build_report`,
the charts drawn by :func:`spotd.billing.reports.render_charts`: the page shows
the figures the report, its email and ``/metrics`` show, the running jobs' spend
so far among them (marked so), priced to the daemon's clock.

With ten thousand jobs a week's report takes about a second to build and half
a second to draw, so a window's report and charts are built behind the page
and kept: the page answers at once, with the figures when they are kept and
else with a line saying they are being built, and its script asks for them
again until they are there. Asked for after :data:`KEEP_SECONDS`, the kept
ones are shown while a thread builds the next. A window
that ends "now" is kept under that name, not under the time it was built at.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from spotd.billing import reports
from spotd.core.clock import WALL, clock_note
from spotd.core.contracts import Clock
from spotd.daemon.dashboard.kept import KeptBuilds
from spotd.daemon.reader import Reader

DEFAULT_DAYS = 7
"""The window when the form names no start: the week before its end."""
KEEP_SECONDS = 30.0
"""How long a window's report and charts are shown before a new build is started."""
MAX_WINDOWS = 16
"""Windows kept at once; the oldest kept is dropped first."""
MAX_PENDING = 4
"""Builds due at once, the one running included."""
JOBS_SHOWN = 20
"""The most expensive jobs listed (the jobs chart shows the top 12 too)."""


@dataclass(frozen=True)
class Window:
    """The period the form asked for: a start and an end, each None for the default
    (the end: now on the records' clock; the start: :data:`DEFAULT_DAYS` before the end)."""

    since: datetime | None = None
    until: datetime | None = None
    error: str | None = None
    """Why the form's dates were not taken (the default window is shown instead)."""

    def resolved(self, now: datetime) -> tuple[datetime, datetime]:
        """The period ``[since, until)`` as of ``now``."""
        until = self.until or now
        return self.since or until - timedelta(days=DEFAULT_DAYS), until

    @property
    def key(self) -> str:
        """What the window is kept under."""
        return f"{_minute(self.since) or '-'}|{_minute(self.until) or 'now'}"

    @property
    def query(self) -> str:
        """The window as the chart images' query string."""
        given = {"since": _minute(self.since), "until": _minute(self.until)}
        return urlencode({k: v for k, v in given.items() if v})


def window_of(since: str | None, until: str | None, now: datetime) -> Window:
    """The window from the form: ISO dates or times, UTC unless they say otherwise."""
    try:
        window = Window(_utc(since), _utc(until))
    except ValueError:
        return Window(error="dates must read like 2026-02-01 or 2026-02-01T12:00")
    start, end = window.resolved(now)
    if start >= end:
        return Window(error="the start must come before the end")
    return window


def _utc(text: str | None) -> datetime | None:
    if not text or not text.strip():
        return None
    moment = datetime.fromisoformat(text.strip())
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _minute(at: datetime | None) -> str:
    return "" if at is None else at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


@dataclass
class _Built:
    report: reports.Report
    charts: dict[str, bytes] | None = None
    """Drawn at the first ask of one, or right after a build behind the page kept the report."""
    drawing: threading.Lock = field(default_factory=threading.Lock)

    def chart(self, name: str) -> bytes | None:
        # One drawing for the page's three images, which the browser asks for at once.
        with self.drawing:
            if self.charts is None:
                self.charts = reports.render_charts(self.report)
        return self.charts.get(name)


class CostReports:
    """Reports and charts by window, each built behind the answer and refreshed once
    :data:`KEEP_SECONDS` old (:class:`~spotd.daemon.dashboard.kept.KeptBuilds`)."""

    def __init__(self, reader: Reader, wall: Clock = WALL) -> None:
        self._reader = reader
        self._kept: KeptBuilds[str, _Built] = KeptBuilds(
            KEEP_SECONDS, max_items=MAX_WINDOWS, name="spotd-cost", max_pending=MAX_PENDING,
            failure="the cost page's report of %s could not be built",
            # The figures are shown as soon as the report is kept; the charts are
            # drawn next, before the page's images ask for them.
            then=lambda built: built.chart(reports.CHART_NAMES[0]), clock=wall,
        )  # fmt: skip

    def report(self, window: Window) -> reports.Report:
        """The report of ``window``, from the ledger."""
        return self._get(window).report

    def ready(self, window: Window) -> reports.Report | None:
        """The report of ``window`` if one is kept, else None and its build started
        behind the answer (the page asks again until it is there)."""
        built = self._kept.ready(window.key, lambda: self._build(window))
        return None if built is None else built.report

    def chart(self, window: Window, name: str) -> bytes | None:
        """The PNG of chart ``name`` (one of ``reports.CHART_NAMES``), None for no such."""
        if name not in reports.CHART_NAMES:
            return None
        return self._get(window).chart(name)

    def _get(self, window: Window) -> _Built:
        return self._kept.get(window.key, lambda: self._build(window))

    def _build(self, window: Window) -> _Built:
        """``window``'s report (its charts are drawn at the first ask of one, or right
        after a build behind the page)."""
        since, until = window.resolved(self._reader.clock.now())
        reader = self._reader
        return _Built(reports.build_report(reader.store, since=since, until=until,
                                           zone=str(reader.zone),
                                           clock_note=clock_note(reader.clock),
                                           clock=reader.clock,
                                           to_finish=reader.planner.to_finish))  # fmt: skip
