"""Jobs as ``spotd status``, ``events`` and ``logs`` print them."""

from __future__ import annotations

import itertools
import sys
from typing import TYPE_CHECKING

from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from spotd.cli.render.cells import SLUG_BREAKS, Breakable, FittedTable
from spotd.cli.render.console import out, when
from spotd.core.timefmt import Precision

if TYPE_CHECKING:
    from spotd.daemon.views import EventFactsView, EventView, JobView, WarningView

_WARNING_TAILS = {
    "market": "the job is stored and waits until the market offers what it needs",
    "no-email": "the job is stored and runs without email",
    "no-address": "the job is stored and runs without a job-end email",
    "over-budget": "the job is stored; it will likely fail over budget before it ends",
}
"""What each kind of submit warning (``SubmitWarningKind``) means for the stored job."""


def _where(job: JobView) -> str:
    if not job.attempts:
        return "-"
    a = job.attempts[-1]
    return f"{a.provider}/{a.zone}/{a.instance_type} ({a.market})"


def status_table(jobs: list[JobView]) -> Table:
    """One row per job: id, name, status, where it runs, attempts, preemptions, cost."""
    table = FittedTable(box=None, header_style="bold")
    # The id is what every other command takes: never cut. Narrow terminals, and a pipe
    # (80 columns to rich), fold the other cells instead, losing nothing.
    table.add_column("ID", no_wrap=True, min_width=max((len(j.id) for j in jobs), default=2))
    for column in ("NAME", "STATUS", "WHERE", "ATTEMPTS", "PREEMPTED", "COST USD"):
        right = column in ("ATTEMPTS", "COST USD")
        table.add_column(column, justify="right" if right else "left", overflow="fold")
    colour = {"succeeded": "green", "failed": "red", "cancelled": "yellow"}
    for j in jobs:
        status = j.status if not j.failure else f"{j.status} ({j.failure})"
        table.add_row(
            j.id,
            # Wrapped between names, never inside one (spotd.cli.render.cells).
            Breakable(j.name, breaks=SLUG_BREAKS),
            f"[{colour.get(j.status, 'cyan')}]{escape(status)}[/]",
            Breakable(_where(j)),
            str(len(j.attempts)),
            str(j.preemptions),
            f"{j.cost_usd:,.2f}",
        )
    return table


def print_jobs(jobs: list[JobView], *, one: bool) -> None:
    """The status table and why jobs wait; for ``one`` job also its progress, restarts,
    attempts and gang. Headed by the clock's note when its times are not real ones."""
    clock = next((j.clock for j in jobs if j.clock), None)
    if clock:
        out.print(f"[yellow]times on the {escape(clock)}[/]", highlight=False)
    out.print(status_table(jobs))
    for waits in waiting_lines(jobs, one=one):
        out.print(waits, highlight=False)
    for why in failure_lines(jobs, one=one):
        out.print(why, highlight=False)
    for kept in held_lines(jobs, one=one):
        out.print(kept, highlight=False)
    if one and jobs:
        line = progress_line(jobs[0])
        if line is not None:
            out.print(line)
        line = forecast_line(jobs[0])
        if line is not None:
            out.print(line, highlight=False)
        line = restart_line(jobs[0])
        if line is not None:
            out.print(line, highlight=False)
        print_attempts(jobs[0])
        for line in repair_lines(jobs[0]):
            out.print(line, highlight=False)
        for line in gang_lines(jobs[0]):
            out.print(line, highlight=False)


def waiting_lines(jobs: list[JobView], *, one: bool) -> list[str]:
    """Why each job the engine has placed nowhere yet waits (``waiting: ...``), under
    the table; each prefixed with its id in a list of several."""
    return [
        escape(f"{'' if one else j.id + ' '}waiting: {j.waiting}")
        for j in jobs
        if j.waiting is not None
    ]


def failure_lines(jobs: list[JobView], *, one: bool) -> list[str]:
    """Why each failed job failed (``failed: command not found (exit 127)``), under the
    table; each prefixed with its id in a list of several. Nothing from a daemon too old
    to say."""
    return [
        f"[red]{escape(('' if one else j.id + ' ') + 'failed: ' + j.failure_reason)}[/]"
        for j in jobs
        if j.failure_reason is not None
    ]


def held_lines(jobs: list[JobView], *, one: bool) -> list[str]:
    """The nodes each failed job keeps for inspection (``keep_on_failure``), with their
    addresses and when they are stopped; each prefixed with its id in a list of several."""
    lines = []
    for j in jobs:
        h = j.held
        if h is None:
            continue
        where = ", ".join(h.addresses) or "no address reported"
        lines.append(escape(
            f"{'' if one else j.id + ' '}kept for inspection until "
            f"{when(h.until, Precision.MINUTE)}: attempt {h.attempt}'s "
            f"{', '.join(h.instance_ids)} at {where} (`spotd release {j.id}` stops them now)"
        ))  # fmt: skip
    return lines


def warning_line(warning: WarningView) -> str:
    """A submit warning as ``spotd submit`` prints it: what will not happen as asked, and
    what that means for the stored job (by its kind)."""
    tail = _WARNING_TAILS.get(warning.kind, "the job is stored")
    return f"[yellow]warning:[/yellow] {escape(warning.detail)}; {tail}"


def restart_line(job: JobView) -> str | None:
    """``restarts: 1 of 3 (exit 137)`` for a job with ``retry.max_restarts_on_errors``;
    None for a job that restarts on no error."""
    if not job.max_restarts and not job.restarts:
        return None
    line = f"restarts: {job.restarts} of {job.max_restarts}"
    if job.restarts and job.last_exit_code is not None:
        line += f" (exit {job.last_exit_code})"
    return line


def progress_line(job: JobView) -> str | None:
    """One line on how far the job is, e.g. for a running deadline job
    ``progress: 12.4 of 24.0 compute hours (estimate); deadline in 30.5 h, 18.9 h of
    slack; 13.1 h to go at the current rate``; None from a daemon too old to say."""
    p = job.progress
    if p is None:
        return None
    if p.compute_hours is None and job.status == "succeeded":
        return "progress: complete"  # no hours stated to count against, and its command said so
    of = f" of {p.compute_hours:.1f}" if p.compute_hours is not None else ""
    source = "estimate"
    if p.from_job and p.step is not None:
        source = f"the job's step {p.step:,} of {p.total_steps:,}"
    parts = [f"progress: {p.done_hours:.1f}{of} compute hours ({source})"]
    late = False
    if p.hours_to_deadline is not None and p.hours_to_deadline < 0:
        parts.append(f"[red]deadline passed {-p.hours_to_deadline:.1f} h ago[/]")
        late = True
    elif p.hours_to_deadline is not None:
        deadline = f"deadline in {p.hours_to_deadline:.1f} h"
        if p.slack_hours is not None:
            slack = f"{p.slack_hours:.1f} h of slack"
            deadline += f", [red]{slack}[/]" if p.slack_hours < 0 else f", {slack}"
        parts.append(deadline)
        late = p.finish_in_hours is not None and p.finish_in_hours > p.hours_to_deadline
    if p.finish_in_hours is not None:
        pace = f"{p.finish_in_hours:.1f} h to go at the current rate"
        parts.append(f"[red]{pace}[/]" if late else pace)
    return "; ".join(parts)


def forecast_line(job: JobView) -> str | None:
    """The cost to finish, e.g. ``to finish: 41.20 USD expected (P90 55.80), ends
    2026-12-05 03:10Z (P90 2026-12-05 07:40Z) on sim-aws/... spot``, with the job's total
    against its budget where it has one; None without a forecast."""
    f = job.forecast
    if f is None:
        return None
    line = (f"to finish: {f.expected_usd:,.2f} USD expected (P90 {f.p90_usd:,.2f}), ends "
            f"{when(f.finish_at, Precision.MINUTE)} (P90 {when(f.p90_finish_at, Precision.MINUTE)})"
            f" on {escape(f.offering)}")  # fmt: skip
    budget = (job.spec.get("budget") or {}).get("max_usd")
    if budget is not None:
        total = job.cost_usd + f.expected_usd
        said = f"{total:,.2f} of its {float(budget):,.2f} USD budget in all"
        line += f"; [red]{said}[/]" if total > float(budget) else f"; {said}"
    return line


def repair_lines(job: JobView) -> list[str]:
    """``attempt 2: node 1 replaced, node 0 kept (i-0...)`` for every attempt that kept
    nodes of the one before it: a gang that lost a node and got a new one beside the
    others (``[gang] on_node_failure``)."""
    from spotd.engine.repair import nodes_said

    lines = []
    for before, after in itertools.pairwise(job.attempts):
        kept = tuple(i if i in before.instance_ids else None for i in after.instance_ids)
        if not any(kept) or all(kept):
            continue
        held = ", ".join(i for i in kept if i is not None)
        lines.append(f"attempt {after.seq}: {nodes_said(kept, None)} replaced, "
                     f"{nodes_said(kept, 'kept')} kept ({escape(held)})")  # fmt: skip
    return lines


def gang_lines(job: JobView) -> list[str]:
    """What the agents of the latest attempt said: gang, preflight, step, GPUs."""
    if not job.attempts or job.attempts[-1].gang is None:
        return []
    from spotd.core.agent_wire import GPU_UTIL_THRESHOLD_PCT
    from spotd.engine.gang import preflight_summary

    a = job.attempts[-1]
    gang = a.gang
    assert gang is not None
    where = escape(", ".join(gang.addresses)) or "no address yet"
    lines = [f"attempt {a.seq}: {gang.joined} of {a.nodes} node(s) joined, "
             f"{gang.started} passed preflight ({where})"]  # fmt: skip
    if gang.preflight is not None:
        summary = escape(preflight_summary(gang.preflight))
        lines.append(f"  {summary}" if gang.preflight.passed else f"  [red]{summary}[/]")
    if gang.step is not None:
        of = f" of {gang.total_steps:,}" if gang.total_steps else ""
        kept = f", last checkpoint {escape(gang.checkpoint)}" if gang.checkpoint else ""
        lines.append(f"  step {gang.step:,}{of} (from the job){kept}")
    for g in gang.gpus:
        utils = " ".join(f"{u:.0f}" for u in g.util_pct)
        low = ""
        if g.low_share:
            share = f"{g.low_share:.0%} of {g.samples} samples"
            low = f", under {GPU_UTIL_THRESHOLD_PCT:g} % in {share}"
        lines.append(f"  GPUs of {escape(g.instance_id)}: {utils} % now{low}")
    return lines


def _times(clock: str | None) -> str:
    """A table title's note of the clock its times are on, when not the wall's."""
    return f" (times: {clock})" if clock else ""


def print_attempts(job: JobView) -> None:
    """The job's attempts: where each ran, its price, times, why it ended and its cost."""
    table = Table(title=f"attempts{_times(job.clock)}", box=None, header_style="bold")
    columns = ("#", "PROVIDER", "ZONE", "TYPE", "MARKET", "USD/H", "START", "END", "REASON", "COST")
    for column in columns:
        table.add_column(column)
    for a in job.attempts:
        table.add_row(
            str(a.seq), a.provider, a.zone, a.instance_type, a.market,
            f"{a.price_per_node_hour * a.nodes:.2f}",
            when(a.started_at, Precision.MINUTE),
            when(a.ended_at, Precision.MINUTE) if a.ended_at else "-",
            escape(a.end_reason or "-"),
            f"{a.cost_usd:.2f}",
        )
    out.print(table)


def events_table(rows: list[EventView]) -> Table:
    """Every transition of a job: when, from and to which status, its cause and detail,
    and its facts (exit code, node, error class) where any event has some."""
    clock = rows[0].clock if rows else None
    table = FittedTable(title=f"events{_times(clock)}" if clock else None, box=None,
                        header_style="bold")  # fmt: skip
    facts = [facts_text(e.facts) for e in rows]
    columns = ["AT", "FROM", "TO", "CAUSE", "DETAIL"] + (["FACTS"] if any(facts) else [])
    for column in columns:
        table.add_column(column, no_wrap=column == "AT", overflow="fold")
    for e, said in zip(rows, facts, strict=True):
        # A detail's paths (a checkpoint's) go on lines of their own, broken at "/" only.
        cells: list[RenderableType] = [
            when(e.at), e.from_status or "-", e.to_status, escape(e.cause), Breakable(e.detail)
        ]
        table.add_row(*cells, *([Breakable(said)] if len(columns) > len(cells) else []))
    return table


def facts_text(facts: EventFactsView) -> str:
    """An event's exit, node and error in a few words (``killed by SIGKILL (exit 137),
    node i-0ab rank 1``; the exit said as the daemon says it, else as its code and
    signal); empty when it has none of them. The provider is left to the detail,
    which names the pool."""
    parts = []
    if facts.exit_said is not None:
        parts.append(facts.exit_said)
    elif facts.exit_code is not None:
        parts.append(" ".join(filter(None, (f"exit {facts.exit_code}", facts.signal_name))))
    if facts.node is not None:
        rank = f" rank {facts.rank}" if facts.rank is not None else ""
        parts.append(f"node {facts.node}{rank}")
    if facts.error_class is not None:
        parts.append(facts.error_class)
    if facts.check is not None:
        parts.append(f"check {facts.check} failed")
    if facts.drill:
        parts.append("drill")
    return ", ".join(parts)


def write_log(header: str | None, text: str) -> None:
    """``text`` of one node's output, under a rule naming it when ``header`` is given."""
    if header is not None:
        out.rule(escape(header))
    sys.stdout.write(text)
    sys.stdout.flush()
