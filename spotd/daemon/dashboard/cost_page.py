"""The cost page: ``spotd report``'s figures and charts for a window the page chooses.

The report is built from the ledger by :func:`spotd.billing.reports.build_report`,
the charts drawn by :func:`spotd.billing.reports.render_charts`: the page shows
the figures the report, its email and ``/metrics`` show.

With ten thousand jobs a week's report takes about a second to build and half
a second to draw, so a window's report and charts are built behind the page
and kept: the page answers at once, with the figures when they are kept and
else with a line saying they are being built, and its script asks for them
again until they are there. Asked for after :data:`KEEP_SECONDS`, the kept
ones are shown while a thread builds the next. A window
that ends "now" is kept under that name, not under the time it was built at.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from spotd.billing import reports
from spotd.engine.reconcile import Engine

log = logging.getLogger(__name__)

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
    at: float
    """When it was built, monotonic seconds."""
    charts: dict[str, bytes] | None = None
    """Drawn at the first ask of one, or beside the report by a build behind the page."""
    drawing: threading.Lock = field(default_factory=threading.Lock)

    def chart(self, name: str) -> bytes | None:
        # One drawing for the page's three images, which the browser asks for at once.
        with self.drawing:
            if self.charts is None:
                self.charts = reports.render_charts(self.report)
        return self.charts.get(name)


class CostReports:
    """Reports and charts by window, each refreshed behind the answer once
    :data:`KEEP_SECONDS` old."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._built: dict[str, _Built] = {}
        self._building: set[str] = set()
        self._lock = threading.Lock()
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotd-cost")

    def report(self, window: Window) -> reports.Report:
        """The report of ``window``, from the ledger."""
        return self._get(window).report

    def ready(self, window: Window) -> reports.Report | None:
        """The report of ``window`` if one is kept, else None and its build started
        behind the answer (the page asks again until it is there)."""
        with self._lock:
            kept = self._built.get(window.key)
            if kept is None or time.monotonic() - kept.at > KEEP_SECONDS:
                self._start_build(window)
        return None if kept is None else kept.report

    def chart(self, window: Window, name: str) -> bytes | None:
        """The PNG of chart ``name`` (one of ``reports.CHART_NAMES``), None for no such."""
        if name not in reports.CHART_NAMES:
            return None
        return self._get(window).chart(name)

    def _get(self, window: Window) -> _Built:
        with self._lock:
            kept = self._built.get(window.key)
            if kept is not None and time.monotonic() - kept.at > KEEP_SECONDS:
                self._start_build(window)
        return kept if kept is not None else self._build(window)

    def _start_build(self, window: Window) -> None:
        """A build of ``window`` behind the answer, unless one is due (the lock is held).

        One build runs at a time, and at most :data:`MAX_PENDING` wait: a reader asking
        for one window after another cannot make the daemon build them all at once.
        A window turned away is asked for again by its page's script.
        """
        if window.key not in self._building and len(self._building) < MAX_PENDING:
            self._building.add(window.key)
            self._builder.submit(self._build_behind, window)

    def _build_behind(self, window: Window) -> None:
        try:
            self._build(window).chart(reports.CHART_NAMES[0])
        except Exception:
            # The page keeps the report it has; the next ask tries again.
            log.exception("the cost page's report of %s could not be built", window.key)

    def _build(self, window: Window) -> _Built:
        try:
            since, until = window.resolved(self._engine.clock.now())
            report = reports.build_report(self._engine.store, since=since, until=until)
            built = _Built(report, time.monotonic())
            with self._lock:
                self._built.pop(window.key, None)
                self._built[window.key] = built  # the newest last: dropped last
                while len(self._built) > MAX_WINDOWS:
                    del self._built[next(iter(self._built))]
            return built
        finally:
            with self._lock:
                self._building.discard(window.key)
