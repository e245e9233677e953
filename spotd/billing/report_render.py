"""``spotd report`` in four formats: text and HTML (jinja2 templates), JSON and CSV.

All four show the same :class:`~spotd.billing.report_model.Report`; money is shown
to the cent in text, HTML and CSV, and unrounded in JSON.
"""

from __future__ import annotations

import base64
import csv
import io
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import cache

import jinja2

from spotd.billing.report_model import Report, usd
from spotd.core.timefmt import Precision, shown, zone_named

CHART_NAMES = ("daily", "jobs", "gpus")
"""The charts of the HTML report, by the name their image is referenced with."""

CSV_COLUMNS = (
    "row",
    "job_id",
    "name",
    "status",
    "spend_usd",
    "on_demand_usd",
    "savings_usd",
    "savings_pct",
    "gpu_hours",
    "preemptions",
    "recovery_hours",
    "to_finish_usd",
    "to_finish_p90_usd",
    "drills",
    "drill_usd",
)
"""CSV columns: ``row`` is ``job`` for each job and ``total`` for the last row (whose
job_id, name and status are empty); USD and hours to 2 decimals; ``savings_pct`` of
the on-demand equivalent; ``recovery_hours`` are changeover hours. A job that failed or
was cancelled has empty ``savings_usd`` and ``savings_pct`` (its spend claims no saving);
a running job's status is ``running, so far`` (its spend up to the report's end), and
``to_finish_usd`` and ``to_finish_p90_usd`` are what it is expected to spend until it
ends and the 90th percentile of that, where the daemon made the report (empty
otherwise); ``drills`` are the preemptions drills asked for (not in ``preemptions``) and
``drill_usd`` what resuming from them cost."""


def render_json(report: Report) -> str:
    """The whole report as indented JSON (unrounded figures)."""
    return report.model_dump_json(indent=2)


def render_csv(report: Report) -> str:
    """One row per job and a totals row (see :data:`CSV_COLUMNS`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for job in report.jobs:
        writer.writerow(
            [
                "job", job.job_id, job.name, job.status_shown,
                _cents(job.spend_usd), _cents(job.on_demand_usd), _maybe(job.savings_usd),
                _maybe(None if job.savings_usd is None else _pct(job.savings_usd,
                                                                   job.on_demand_usd)),
                _cents(job.gpu_hours),
                job.preemptions, _cents(job.recovery_hours),
                _maybe(job.to_finish_usd), _maybe(job.to_finish_p90_usd),
                job.drills, _cents(job.drill_usd),
            ]
        )  # fmt: skip
    t = report.totals
    writer.writerow(
        [
            "total", "", "", "",
            _cents(t.spend_usd), _cents(t.on_demand_usd), _cents(t.savings_usd),
            _cents(t.savings_pct), _cents(t.gpu_hours), t.preemptions, _cents(t.recovery_hours),
            "", "", t.drills, _cents(t.drill_usd),
        ]
    )  # fmt: skip
    return out.getvalue()


def render_text(report: Report) -> str:
    """The report as plain text (``report.txt.j2``), for terminals and text mail."""
    return _environment().get_template("report.txt.j2").render(report=report)


def render_html(report: Report, charts: Mapping[str, str]) -> str:
    """The report as one HTML page (``report.html.j2``), styles inline for mail clients.

    ``charts`` maps chart names (:data:`CHART_NAMES`) to image sources:
    ``cid:<name>`` for a mail with the PNGs attached inline
    (:func:`cid_sources`), ``data:`` URIs for a file opened in a browser
    (:func:`data_uri_sources`). Charts left out are not shown.
    """
    template = _environment().get_template("report.html.j2")
    shown = {name: charts[name] for name in CHART_NAMES if name in charts}
    return template.render(report=report, charts=shown)


def cid_sources(names: Iterable[str] = CHART_NAMES) -> dict[str, str]:
    """``{name: "cid:<name>"}``: images attached to the mail with Content-ID ``<name>``."""
    return {name: f"cid:{name}" for name in names}


def data_uri_sources(pngs: Mapping[str, bytes]) -> dict[str, str]:
    """The PNGs as ``data:`` URIs, for an HTML file that stands alone."""
    return {
        name: "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        for name, png in pngs.items()
    }


def _cents(value: float) -> str:
    return f"{value:.2f}"


def _maybe(value: float | None) -> str:
    """Cents, or empty where no figure is claimed (a failed job's saving)."""
    return "" if value is None else _cents(value)


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


@cache
def _environment() -> jinja2.Environment:
    # HTML templates escape every value; the text one must not (no "&amp;" in mail text).
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("spotd.billing", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["usd"] = usd
    env.filters["cents"] = lambda v: "–" if v is None else f"{v:,.2f}"
    env.filters["hours"] = lambda v: f"{v:,.1f}"
    env.filters["pct"] = lambda part, whole: f"{_pct(part, whole):.0f} %"
    env.filters["when"] = _when
    return env


def _when(at: datetime, zone: str) -> str:
    """A report's time to the minute, in its zone (:func:`spotd.core.timefmt.shown`)."""
    return shown(at, zone_named(zone), Precision.MINUTE)
