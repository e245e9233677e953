"""``spotd simulate``: replay traces under the baselines and product policies, print the results.

The main CLI registers :func:`simulate` with ``app.command()(simulate)``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TimeElapsedColumn
from rich.table import Table

from spotd.core.errors import SpotdError
from spotd.core.exit_codes import ExitCode, exit_code

if TYPE_CHECKING:
    from spotd.simulate.metrics import PolicyMetrics
    from spotd.simulate.runner import JobReport, OnStep, ScenarioReport, Step

__all__ = ["COLUMNS", "replay_progress", "simulate", "table_rows"]

COLUMNS = (
    "policy", "cost", "p75", "saved", "misses", "gap", "spot", "preempt/job",
    "starts/job", "goodput",
)
"""Columns of the results table: mean and p75 cost normalised by on-demand only, savings,
deadline misses, gap to the omniscient optimum, spot share of paid hours, preemptions and
instance starts per job, goodput (share of paid hours that made kept progress)."""

ScenarioOpt = Annotated[
    Path | None,
    typer.Option("--scenario", "-s", help="Scenario TOML file (or give --trace).",
                 show_default=False),
]
TraceOpt = Annotated[
    list[Path] | None,
    typer.Option("--trace", "-t", help="Trace file, or folder of them, to replay without a "
                 "scenario (repeatable; the files form one market): reference cost model, "
                 "one job.",
                 show_default=False),
]
ComputeOpt = Annotated[
    float | None, typer.Option("--compute-hours", min=0.01, help="With --trace: the job's "
                               "compute hours (default: 48).", show_default=False)
]
FractionOpt = Annotated[
    float | None, typer.Option("--deadline-fraction", min=0.01, max=1.0, help="With --trace: "
                               "compute hours over hours to the deadline (default: 0.8).",
                               show_default=False)
]
NodesOpt = Annotated[
    int | None, typer.Option("--nodes", min=1, help="With --trace: nodes the job needs, each "
                             "tick counting as up where the trace shows that many "
                             "(default: 1).", show_default=False)
]
TickOpt = Annotated[
    float | None, typer.Option("--tick-seconds", min=1, help="With --trace: resample to this "
                               "tick (default: the traces' own).", show_default=False)
]
PolicyOpt = Annotated[
    list[str] | None,
    typer.Option("--policy", "-p", help="Product policy to replay too (repeatable).",
                 show_default=False),
]
TracesOpt = Annotated[
    Path | None,
    typer.Option("--traces", help="Root of relative trace paths (default: $SPOTD_TRACES, "
                 "else the scenario's traces_root, else its folder).", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
PlotOpt = Annotated[
    Path | None, typer.Option("--plot", help="Write PNG plots into this folder.",
                              show_default=False)
]
StartsOpt = Annotated[
    int | None, typer.Option("--starts", min=1, help="Start points per job (overrides "
                             "the scenario).", show_default=False)
]
HindsightOpt = Annotated[
    bool, typer.Option("--hindsight-stats", help="Also replay each --policy shown the whole "
                       "trace's statistics, future included: what a better market model "
                       "could buy.")
]
SeedOpt = Annotated[
    int | None, typer.Option("--seed", help="Seed of the start points (overrides the "
                             "scenario).", show_default=False)
]


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table_rows(job: JobReport) -> list[list[str]]:
    """One row of text cells per policy, in :data:`COLUMNS` order."""
    def row(m: PolicyMetrics) -> list[str]:
        return [
            m.policy, f"{m.mean_cost:.3f}", f"{m.p75_cost:.3f}", f"{m.savings:.1%}",
            str(m.misses), f"{m.gap:+.3f}", _num(m.spot_share, ".1%"),
            _num(m.preemptions, ".2f"), _num(m.launches, ".2f"), _num(m.goodput, ".1%"),
        ]
    return [row(m) for m in job.metrics]


def job_title(report: ScenarioReport, job: JobReport) -> str:
    """Scenario, job and the model's settings in one line."""
    j, w = job.prepared.job, job.prepared.world
    return (
        f"{report.scenario.name} / {j.name}: {j.compute_hours:g} h compute, deadline "
        f"{j.window_hours:g} h, {j.nodes} node(s), d = {j.changeover_hours:g} h, "
        f"tick {w.tick_hours * 3600:g} s, {len(job.prepared.starts)} start points, "
        f"{report.scenario.cost_model} cost model"
    )


def _print_tables(report: ScenarioReport, out: Console) -> None:
    for job in report.jobs:
        table = Table(title=escape(job_title(report, job)), title_justify="left",
                      header_style="bold")  # fmt: skip
        for i, column in enumerate(COLUMNS):
            table.add_column(column, justify="left" if i == 0 else "right")
        for cells in table_rows(job):
            table.add_row(*cells)
        out.print(table)
    where = report.path or ", ".join(str(t) for t in report.traces)
    out.print(f"[dim]{escape(str(where))}: {report.seconds:.1f} s[/dim]")


@contextmanager
def replay_progress(console: Console) -> Iterator[OnStep]:
    """A progress bar per job on ``console`` while the block replays them, told by the
    :data:`~spotd.simulate.runner.OnStep` it yields; gone when the block ends. Only
    on a terminal: a pipe or a log file gets no bar, and stdout (``--json``) none ever."""
    bars = Progress(
        "[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=console, transient=True,
        disable=not console.is_terminal,
    )  # fmt: skip
    tasks: dict[str, TaskID] = {}

    def on_step(step: Step) -> None:
        if step.job not in tasks:
            tasks[step.job] = bars.add_task("", total=step.total)
        what = f"{escape(step.job)}: {escape(step.policy)}"
        bars.update(tasks[step.job], completed=step.done, description=what)

    with bars:
        yield on_step


def _usage(message: str) -> NoReturn:
    _error(message)
    raise typer.Exit(ExitCode.BAD_INPUT)


def _error(message: str) -> None:
    # soft_wrap: a path in the message is never broken mid-word at the terminal's width.
    Console(stderr=True).print(f"[red]error:[/red] {escape(message)}", highlight=False,
                               soft_wrap=True)  # fmt: skip


def simulate(
    scenario: ScenarioOpt = None,
    *,
    trace: TraceOpt = None,
    compute_hours: ComputeOpt = None,
    deadline_fraction: FractionOpt = None,
    nodes: NodesOpt = None,
    tick_seconds: TickOpt = None,
    policy: PolicyOpt = None,
    traces: TracesOpt = None,
    as_json: JsonOpt = False,
    plot: PlotOpt = None,
    starts: StartsOpt = None,
    seed: SeedOpt = None,
    hindsight_stats: HindsightOpt = False,
) -> None:
    """Replay spot availability traces under baselines and policies; report costs."""
    # Here, not at the top: every spotd command registers this one, and the
    # simulator (numpy and the policies) would add half a second to each.
    from spotd.simulate.runner import report_json, run_scenario
    from spotd.simulate.scenario import scenario_from_traces

    err = Console(stderr=True)
    job = {"compute_hours": compute_hours, "deadline_fraction": deadline_fraction,
           "nodes": nodes, "tick_seconds": tick_seconds}  # fmt: skip
    if (scenario is None) == (not trace):
        _usage("give either --scenario FILE or one or more --trace FILE")
    if trace and traces is not None:
        _usage("--traces: for --scenario only; give --trace the files' own paths")
    given = [f"--{name.replace('_', '-')}" for name, v in job.items() if v is not None]
    if scenario is not None and given:
        _usage(f"{', '.join(given)}: for --trace only; a scenario sets its jobs and tick in "
               "its file")  # fmt: skip
    try:
        with replay_progress(err) as on_step:
            if scenario is not None:
                report = run_scenario(
                    scenario, policy or [], traces=traces, starts=starts, seed=seed,
                    hindsight=hindsight_stats, on_step=on_step,
                )
            else:
                made = scenario_from_traces(
                    trace or [], compute_hours=compute_hours,
                    deadline_fraction=deadline_fraction, nodes=nodes, tick_seconds=tick_seconds,
                )
                report = run_scenario(made, policy or [], starts=starts, seed=seed,
                                      hindsight=hindsight_stats, on_step=on_step)  # fmt: skip
        if plot is not None:
            from spotd.simulate.plots import plot_report

            written = plot_report(report, plot)
            if not as_json:
                err.print(f"wrote {len(written)} plots into {escape(str(plot))}")
    except SpotdError as exc:
        _error(str(exc))
        raise typer.Exit(exit_code(exc)) from exc
    except KeyboardInterrupt:
        err.print("[yellow]stopped:[/yellow] interrupted before the results were printed",
                  highlight=False)  # fmt: skip
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    if as_json:
        sys.stdout.write(json.dumps(report_json(report), indent=2) + "\n")
    else:
        console = Console()
        # Pipes get 80 columns from rich; the table needs about 110 to stay readable.
        _print_tables(report, Console(width=max(console.width, 120)))


def main() -> None:
    """Run ``simulate`` alone (``python -m spotd.simulate.cli``)."""
    typer.run(simulate)


if __name__ == "__main__":
    main()
