"""``spotd report``'s content: build a :class:`Report` from the ledger, render it.

One import path for the report's model (:mod:`spotd.billing.report_model`), its
renderers (:mod:`spotd.billing.report_render`) and charts (:mod:`spotd.billing.charts`).
"""

from __future__ import annotations

from spotd.billing.charts import render_charts
from spotd.billing.report_model import (
    DailySpend,
    JobRow,
    Period,
    Report,
    Rollup,
    Totals,
    build_report,
    report_from,
)
from spotd.billing.report_render import (
    CHART_NAMES,
    CSV_COLUMNS,
    cid_sources,
    data_uri_sources,
    render_csv,
    render_html,
    render_json,
    render_text,
)

__all__ = [
    "CHART_NAMES",
    "CSV_COLUMNS",
    "DailySpend",
    "JobRow",
    "Period",
    "Report",
    "Rollup",
    "Totals",
    "build_report",
    "cid_sources",
    "data_uri_sources",
    "render_charts",
    "render_csv",
    "render_html",
    "render_json",
    "render_text",
    "report_from",
]
