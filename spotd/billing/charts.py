"""The report's charts as PNG bytes, drawn with matplotlib's Agg backend.

Figures are made with :class:`matplotlib.figure.Figure` directly, never
through ``pyplot``: no global figure state, so the daemon may render reports
from any thread, and no GUI backend is ever touched.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Literal

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from spotd.billing.report_model import JobRow, Report, Rollup

WIDTH_IN, HEIGHT_IN, DPI = 6.64, 3.0, 100
"""664 x 300 pixels: the width of the HTML report's content column."""

PALETTE = ("#0969da", "#bf8700", "#8250df", "#1a7f37", "#cf222e", "#57606a")
SAVED = "#1a7f37"
ON_DEMAND = "#cf222e"
MAX_BARS = 12
"""Jobs or GPU/fabric groups shown; the rest are summed into "others"."""


def render_charts(report: Report) -> dict[str, bytes]:
    """``daily``, ``jobs`` and ``gpus`` charts of the report, as PNG bytes by name."""
    return {
        "daily": _png(_daily, report),
        "jobs": _png(_jobs, report),
        "gpus": _png(_gpus, report),
    }


def _png(draw: Callable[[Axes, Report], None], report: Report) -> bytes:
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    style_axes(ax)
    draw(ax, report)
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI, facecolor="white")
    return out.getvalue()


def _daily(ax: Axes, report: Report) -> None:
    """Spend per day stacked by provider, and the on-demand equivalent as a line."""
    days = [d.day.strftime("%m-%d") for d in report.daily]
    if not days:
        _empty(ax)
        return
    providers = sorted({p for d in report.daily for p in d.by_provider})
    bottom = [0.0] * len(days)
    for n, provider in enumerate(providers):
        heights = [d.by_provider.get(provider, 0.0) for d in report.daily]
        ax.bar(days, heights, bottom=bottom, label=provider, color=PALETTE[n % len(PALETTE)])
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.plot(
        days, [d.on_demand_usd for d in report.daily], color=ON_DEMAND, marker="o",
        linewidth=2, label="on-demand equivalent",
    )  # fmt: skip
    ax.set_ylabel("USD per day")
    ax.legend(fontsize=8, frameon=False, loc="upper left")


def _jobs(ax: Axes, report: Report) -> None:
    """Spend and savings per job, the most expensive first."""
    rows = report.jobs[:MAX_BARS]
    if not rows:
        _empty(ax)
        return
    # Bars at positions, not at their labels: matplotlib puts equal labels on one bar.
    where = range(len(rows))
    spend = [r.spend_usd for r in rows][::-1]
    # A failed or cancelled job's bar is its spend alone: no saving is claimed for it.
    saved = [max(0.0, r.savings_usd or 0.0) for r in rows][::-1]
    ax.barh(where, spend, color=PALETTE[0], label="spend")
    ax.barh(where, saved, left=spend, color=SAVED, label="saved vs on-demand")
    ax.set_yticks(where, job_labels(rows)[::-1])
    ax.set_xlabel("USD")
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    ax.tick_params(axis="y", labelsize=8)


def job_labels(rows: Sequence[JobRow]) -> list[str]:
    """Each job's bar label: its name, cut to 18 characters, and where two jobs share
    one, the job's id after it, so that no two bars read alike."""
    names = [r.name if len(r.name) <= 18 else r.name[:17] + "…" for r in rows]
    shared = {n for n in names if names.count(n) > 1}
    return [f"{n} ({r.job_id})" if n in shared else n for n, r in zip(names, rows, strict=True)]


def _gpus(ax: Axes, report: Report) -> None:
    """Spend by GPU type and fabric."""
    groups = _top(report.by_gpu_fabric)
    if not groups:
        _empty(ax)
        return
    keys = [g.key for g in groups][::-1]
    ax.barh(keys, [g.spend_usd for g in groups][::-1], color=PALETTE[2])
    ax.set_xlabel("USD")
    ax.tick_params(axis="y", labelsize=8)


def _top(rows: Sequence[Rollup]) -> list[Rollup]:
    if len(rows) <= MAX_BARS:
        return list(rows)
    head, rest = list(rows[: MAX_BARS - 1]), rows[MAX_BARS - 1 :]
    others = Rollup(
        key=f"{len(rest)} others",
        spend_usd=sum(r.spend_usd for r in rest),
        on_demand_usd=sum(r.on_demand_usd for r in rest),
        savings_usd=sum(r.savings_usd for r in rest),
        gpu_hours=sum(r.gpu_hours for r in rest),
    )
    return [*head, others]


def style_axes(ax: Axes, grid: Literal["both", "x", "y"] = "both") -> None:
    """The charts' look: no top or right frame, a light grid, small tick labels."""
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(axis=grid, color="#eaeef2", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.tick_params(labelsize=8)


def _empty(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no spend in this period", ha="center", va="center", color="#57606a")
    ax.set_xticks([])
    ax.set_yticks([])
