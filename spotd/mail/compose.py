"""Report emails: the report rendered as text and HTML with its charts inline."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from spotd.mail.message import Composed

log = logging.getLogger(__name__)

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class BuildReport(Protocol[R_co]):
    """The shape of ``spotd.billing.reports.build_report`` with its store bound."""

    def __call__(self, *, since: datetime, until: datetime, job_id: str | None = None) -> R_co: ...


def report_email(
    report: R,
    *,
    text: Callable[[R], str],
    html: Callable[[R, Mapping[str, str]], str],
    charts: Callable[[R], Mapping[str, bytes]],
    subject: str,
) -> Composed:
    """The report as an email: its text, its HTML, and its charts inline.

    ``html`` receives chart name -> ``cid:`` reference for every chart that
    rendered. A failing chart renderer costs the charts, not the email.
    """
    images, refs = _inline_charts(report, charts)
    return Composed(subject, text(report), html(report, refs), images)


def _inline_charts(
    report: R, charts: Callable[[R], Mapping[str, bytes]]
) -> tuple[dict[str, bytes], dict[str, str]]:
    try:
        rendered = charts(report)
    except Exception:
        log.exception("rendering the report's charts failed; sending it without them")
        return {}, {}
    images: dict[str, bytes] = {}
    refs: dict[str, str] = {}
    for name, png in rendered.items():
        cid = f"{_slug(name)}.{uuid.uuid4().hex[:12]}@spotd"
        images[cid] = png
        refs[name] = f"cid:{cid}"
    return images, refs


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "chart"


@dataclass(frozen=True, slots=True)
class ReportKit(Generic[R]):
    """The report builder and renderers, bundled for :class:`Mailer`.

    Wire with the real ones: ``ReportKit(partial(reports.build_report, store),
    reports.render_text, reports.render_html, charts.render_charts)``.
    """

    build: BuildReport[R]
    text: Callable[[R], str]
    html: Callable[[R, Mapping[str, str]], str]
    charts: Callable[[R], Mapping[str, bytes]]

    def compose(
        self, *, since: datetime, until: datetime, subject: str, job_id: str | None = None
    ) -> Composed:
        """Build the report for the window and render it as an email."""
        report = self.build(since=since, until=until, job_id=job_id)
        return report_email(
            report, text=self.text, html=self.html, charts=self.charts, subject=subject
        )


class ReportComposer(Protocol):
    """What :class:`Mailer` needs of the reports: :class:`ReportKit` fits."""

    def compose(
        self, *, since: datetime, until: datetime, subject: str, job_id: str | None = None
    ) -> Composed:
        """Build and render the report for the window (and one job, if given)."""
        ...
