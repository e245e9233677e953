"""A job's attempts on a timeline, drawn by matplotlib as SVG.

One row per attempt: its changeover (launch to running) pale, its running
time solid, coloured by provider with one shade per zone, hatched on
on-demand. A preemption is a red cross at the attempt's end, a notice an
orange triangle where the agent reported it, and a passed or failed preflight
is written beside the bar with its bandwidth where it was measured.
Figures are made without pyplot, as the report's charts are
(:mod:`spotd.billing.charts`): the daemon draws from any thread.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from matplotlib import dates
from matplotlib.axes import Axes
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from spotd.billing.charts import PALETTE, style_axes
from spotd.daemon.views import AttemptView

date2num: Callable[[datetime], float] = dates.date2num
"""matplotlib's position of a time on a date axis (typed here: matplotlib's is not)."""

PREEMPTED = "#cf222e"
NOTICE = "#bf8700"
ROW_INCHES = 0.42
WIDTH_INCHES = 9.0


def timeline_svg(
    attempts: Sequence[AttemptView],
    notices: Mapping[int, Sequence[datetime]],
    now: datetime,
    clock: str | None,
) -> str:
    """The SVG of ``attempts``; ``notices``: notice times by attempt seq; ``now``
    ends the attempt still open; ``clock``: what clock the times are on."""
    rows = max(1, len(attempts))
    fig = Figure(figsize=(WIDTH_INCHES, 1.3 + ROW_INCHES * rows), layout="constrained")
    FigureCanvasSVG(fig)
    ax = fig.add_subplot()
    style_axes(ax, grid="x")
    if not attempts:
        ax.text(0.5, 0.5, "no attempt yet", ha="center", va="center", color="#57606a")
        ax.set_xticks([])
    else:
        colours = zone_colours(attempts)
        for row, a in enumerate(attempts):
            colour = colours[(a.provider, a.zone)]
            _attempt_row(ax, row, a, colour, notices=notices.get(a.seq, ()), now=now)
        _legend(ax, attempts, colours)
        ax.xaxis_date()
    ax.set_yticks(range(len(attempts)), [f"#{a.seq}" for a in attempts])
    ax.invert_yaxis()
    ax.set_xlabel("time (UTC" + (f", {clock} clock" if clock else "") + ")", fontsize=8)
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def zone_colours(attempts: Sequence[AttemptView]) -> dict[tuple[str, str], str]:
    """A colour per (provider, zone): the provider's from the palette, each further zone
    of that provider a lighter shade of it."""
    providers = sorted({a.provider for a in attempts})
    colours: dict[tuple[str, str], str] = {}
    for n, provider in enumerate(providers):
        base = to_rgb(PALETTE[n % len(PALETTE)])
        zones = sorted({a.zone for a in attempts if a.provider == provider})
        for z, zone in enumerate(zones):
            colours[(provider, zone)] = _shade(base, SHADES[z % len(SHADES)])
    return colours


SHADES = (0.0, 0.45, -0.35, 0.65, -0.55, 0.25, -0.2)
"""How far each further zone's colour moves from its provider's: towards white (>0) or
black (<0), never so far that it vanishes."""


def _shade(rgb: tuple[float, float, float], by: float) -> str:
    target = 1.0 if by > 0 else 0.0
    return _hex(tuple(c + (target - c) * abs(by) for c in rgb))


def _hex(rgb: tuple[float, ...]) -> str:
    return "#" + "".join(f"{round(c * 255):02x}" for c in rgb)


def _attempt_row(
    ax: Axes,
    row: int,
    a: AttemptView,
    colour: str,
    *,
    notices: Sequence[datetime],
    now: datetime,
) -> None:
    start = date2num(a.started_at)
    running = date2num(a.running_at) if a.running_at else None
    end = date2num(a.ended_at or now)
    hatch = "///" if a.market != "spot" else None
    boot_end = running if running is not None else end
    ax.barh(row, boot_end - start, left=start, height=0.55, color=colour, alpha=0.35,
            hatch=hatch, edgecolor=colour)  # fmt: skip
    if running is not None:
        ax.barh(row, end - running, left=running, height=0.55, color=colour, hatch=hatch,
                edgecolor="white" if hatch else colour)  # fmt: skip
    for at in notices:
        ax.plot(date2num(at), row - 0.42, marker="v", color=NOTICE, markersize=8)
    if a.end_reason == "preempted":
        ax.plot(end, row, marker="X", color=PREEMPTED, markersize=10,
                markeredgecolor="white")  # fmt: skip
    ax.annotate(_label(a), (end, row), xytext=(8, 0), textcoords="offset points",
                va="center", fontsize=7.5, color="#24292f")  # fmt: skip


def _label(a: AttemptView) -> str:
    """What the bar's end says: where, which market, how it ended, the preflight."""
    words = [f"{a.provider} {a.zone} {a.instance_type} {a.market}"]
    words.append(a.end_reason or ("open" if a.running_at is None else "running"))
    preflight = a.gang.preflight if a.gang else None
    if preflight is not None:
        verdict = "passed" if preflight.passed else "failed"
        bandwidth = f" {preflight.busbw_gbps:.1f} GB/s" if preflight.busbw_gbps else ""
        words.append(f"preflight {verdict}{bandwidth}")
    return " · ".join(words)


def _legend(
    ax: Axes, attempts: Sequence[AttemptView], colours: Mapping[tuple[str, str], str]
) -> None:
    handles: list[object] = [Patch(color=c, label=f"{p} {z}") for (p, z), c in colours.items()]
    if any(a.market != "spot" for a in attempts):
        handles.append(Patch(facecolor="white", edgecolor="#57606a", hatch="///",
                             label="on-demand"))  # fmt: skip
    ax.legend(handles=handles, fontsize=7, frameon=False, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))  # fmt: skip
    # Room on the right for the last bar's label.
    left, right = ax.get_xlim()
    ax.set_xlim(left, right + (right - left) * 0.45)


