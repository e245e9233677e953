"""PNG plots of a scenario report: cost distribution per policy, and one job's timeline."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TypeVar

import matplotlib

matplotlib.use("Agg")  # files only: never open a window, work on headless machines

import matplotlib.pyplot as plt

from spotd.core.errors import SpotdError
from spotd.simulate.model import IDLE
from spotd.simulate.runner import JobReport, ScenarioReport

__all__ = ["PlotError", "plot_costs", "plot_report", "plot_timeline"]

T = TypeVar("T")


class PlotError(SpotdError):
    """The plot folder cannot be written."""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def _spans(values: list[T], wanted: T, width: float) -> list[tuple[float, float]]:
    """(start, length) of each run of ``wanted`` in ``values``, ticks scaled by ``width``."""
    spans: list[tuple[float, float]] = []
    begin: int | None = None
    for t, v in enumerate([*values, None]):
        if v == wanted and begin is None:
            begin = t
        elif v != wanted and begin is not None:
            spans.append((begin * width, (t - begin) * width))
            begin = None
    return spans


def plot_costs(job: JobReport, title: str, out: Path) -> Path:
    """Box plot of normalised cost per policy over the job's start points."""
    od = job.runs[0].costs
    names = [r.name for r in job.runs]
    data = [r.costs / od for r in job.runs]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names)), 4.0))
    ax.boxplot(data, showmeans=True)
    ax.set_xticks(range(1, len(names) + 1), names, rotation=30, ha="right")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_ylabel("cost / on-demand-only cost")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_timeline(job: JobReport, title: str, out: Path) -> Path:
    """The first start point: spot availability per zone, and where each policy ran."""
    p, w = job.prepared, job.prepared.world
    start = p.starts[0]
    rows = [(r.name, r.outcomes[0].modes) for r in job.runs if r.outcomes]
    hours = w.tick_hours
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(10.0, 0.45 * (w.n + len(rows)) + 1.5))
    y = 0
    labels = []
    for z in range(w.n):
        up = [bool(v) for v in w.avail[z, start : start + w.window]]
        ax.broken_barh(_spans(up, True, hours), (y, 0.8), color=colours(z % 10), alpha=0.35)
        labels.append(f"spot {w.labels[z]}")
        y += 1
    for name, modes in rows:
        for m in sorted(set(modes) - {IDLE}):
            colour = colours(m % 10) if m < w.n else "black"
            ax.broken_barh(_spans(list(modes), m, hours), (y, 0.8), color=colour)
        labels.append(name)
        y += 1
    ax.set_yticks([i + 0.4 for i in range(y)], labels)
    ax.set_xlim(0, w.window * hours)
    ax.set_xlabel("hours since the job started (black: on-demand, colour: spot zone)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_report(report: ScenarioReport, folder: Path) -> list[Path]:
    """Both plots for every job of the report, into ``folder``; the paths written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlotError(f"cannot create the plot folder {folder}: {exc.strerror or exc}") from exc
    written = []
    for job in report.jobs:
        stem = _slug(f"{report.scenario.name}-{job.prepared.job.name}")
        title = f"{report.scenario.name}: {job.prepared.job.name}"
        try:
            written.append(plot_costs(job, title, folder / f"{stem}-costs.png"))
            written.append(plot_timeline(job, title, folder / f"{stem}-timeline.png"))
        except OSError as exc:
            raise PlotError(f"cannot write plots into {folder}: {exc.strerror or exc}") from exc
    return written
