"""A plan as ``spotd plan`` prints it: the choice, what its expected cost covers, its
deadline verdict, the candidates (each figure with its unit), the exclusions."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from spotd.cli.render.console import out, when
from spotd.core.outlook import CostBasis, DeadlineVerdict

if TYPE_CHECKING:
    from spotd.daemon.planning import CandidateView, CoversView, DeadlineView, PlanView

_VERDICT_STYLE = {
    DeadlineVerdict.MEETS: "green",
    DeadlineVerdict.AT_RISK: "yellow",
    DeadlineVerdict.CANNOT_MEET: "red",
}


def print_plan(view: PlanView, *, top: int, excluded: bool) -> None:
    """The policy's choice, what its figures cover, its deadline verdict, the ``top``
    usable candidates, the choice's environment, and the excluded offerings: each one
    with ``excluded``, else counted by kind of rule."""
    c = view.choice
    one_hour = view.covers is not None and view.covers.basis is CostBasis.ONE_HOUR
    if c is None:
        out.print(f"[red]{escape(view.policy)}: no offering passes the filters[/red]")
    else:
        per = " per compute hour" if one_hour else ""
        out.print(
            f"[bold]{escape(view.policy)}[/bold] chooses {c.provider}/{c.zone}/{c.instance_type} "
            f"{c.market}: {c.price_per_hour:,.2f} USD/h, expected {c.expected_cost_usd:,.2f} USD"
            f"{per}",
            highlight=False,
        )
    if view.covers is not None:
        _print_covers(view.covers)
    if view.deadline is not None:
        _print_deadline(view.deadline, view.covers)
    usable = [x for x in view.candidates if x.excluded is None]
    out_of = [x for x in view.candidates if x.excluded is not None]
    if usable:
        out.print(_usable_table(usable[:top]))
    if c is not None:
        _print_environment(view, c)
    if excluded:
        out.print(_excluded_table(out_of))
    elif out_of:
        _print_exclusions(view, len(view.candidates))


def _setup(covers: CoversView) -> str:
    """The reference setup a compute hour is an hour on: ``1 node of 8 A100``."""
    nodes = f"{covers.nodes} node" + ("s" if covers.nodes != 1 else "")
    fabric = f" on {covers.reference_fabric}" if covers.reference_fabric else ""
    return f"{nodes} of {covers.gpus_per_node} {covers.reference_gpu}{fabric}"


def _print_covers(covers: CoversView) -> None:
    """What EXPECTED pays for; without compute hours, a warning that it is one hour's."""
    if covers.basis is CostBasis.ONE_HOUR:
        out.print(f"EXPECTED: the cost of 1 compute hour of work (an hour on {_setup(covers)})",
                  highlight=False)  # fmt: skip
        warning = ("no deadline.compute_hours, so each expected figure is for 1 hour of work, "
                   "not the whole job")  # fmt: skip
        out.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
        return
    out.print(f"EXPECTED: the cost to finish the {covers.compute_hours:,.4g} compute hours left "
              f"(hours on {_setup(covers)})", highlight=False)  # fmt: skip


def _print_deadline(d: DeadlineView, covers: CoversView | None) -> None:
    """The verdict on ``finish_by`` and its slack, with the figures it comes from."""
    head = f"deadline {when(d.finish_by)}"
    if d.verdict is None or d.slack_hours is None:
        out.print(f"{head}: no verdict, the job gives no deadline.compute_hours to weigh",
                  highlight=False)  # fmt: skip
        return
    style = _VERDICT_STYLE[d.verdict]
    verdict, why = _verdict_text(d, d.slack_hours, covers)
    out.print(f"{head}: [{style}]{verdict}[/{style}]{escape(why)}", highlight=False)


def _verdict_text(d: DeadlineView, slack: float, covers: CoversView | None) -> tuple[str, str]:
    """(the verdict, the figures behind it, punctuated to follow it) as people read them."""
    figures = f"{max(d.hours_left, 0.0):,.1f} h left, {d.expected_hours or 0.0:,.1f} h expected"
    if d.verdict is DeadlineVerdict.MEETS:
        return "meets it", f" with {slack:,.1f} h of slack ({figures})"
    if d.verdict is DeadlineVerdict.AT_RISK and slack < 0:
        return "at risk", (f", {-slack:,.1f} h late in expectation: in time only with fewer "
                           f"preemptions than expected ({figures})")  # fmt: skip
    if d.verdict is DeadlineVerdict.AT_RISK:
        margin = f"under the {d.margin_hours or 0.0:,.2f} h margin"
        return "at risk", f", {slack:,.1f} h of slack, {margin} ({figures})"
    if d.hours_left <= 0:
        return "cannot meet it", f": it passed {-d.hours_left:,.1f} h ago"
    if d.fails_at_once:
        work = f"its {covers.compute_hours:,.4g} compute hours" if covers else "its compute hours"
        return "cannot meet it", (f": {work} do not fit in the {d.hours_left:,.1f} h left, "
                                  "and spotd fails such a new job at once")  # fmt: skip
    return "cannot meet it", f", {-slack:,.1f} h short ({figures})"


def _print_environment(view: PlanView, c: CandidateView) -> None:
    """The fabric variables and the preflight floor the choice's gang would get."""
    nodes = f"{c.nodes} node" + ("s" if c.nodes != 1 else "")
    head = f"environment for {c.interconnect.fabric} ({c.instance_type}, {nodes})"
    env = view.environment or {}
    lines = [f"{head}:", *(f"  {name}={value}" for name, value in env.items())]
    if not env:
        why = "one node: nothing crosses the fabric" if c.nodes <= 1 else "[fabric_env] removes all"
        lines = [f"{head}: none, {why}"]
    # soft_wrap: one line each, never folded, so a NAME=value line pastes as is.
    for line in [*lines, _preflight_line(view, c)]:
        out.print(escape(line), highlight=False, soft_wrap=True)


def _preflight_line(view: PlanView, c: CandidateView) -> str:
    """What the preflight would hold the gang to, and whose figure that is."""
    floor, source = view.preflight_min_busbw_gbps, view.preflight_threshold_source
    if source == "disabled":
        return "preflight: off ([preflight] enabled = false)"
    if floor is not None:
        # The fabric's figure is NCCL's: a gang without GPUs (the simulated market) runs
        # gloo and is held to none.
        whose = (
            "the job's [preflight] min_busbw_gbps" if source == "spec"
            else "the fabric's floor, for NCCL on GPU nodes"
        )  # fmt: skip
        return f"preflight: all-reduce bus bandwidth must exceed {floor:g} GB/s ({whose})"
    if c.nodes <= 1:
        return "preflight: no bus bandwidth floor (one node)"
    return (
        f"preflight: no bus bandwidth floor ({c.interconnect.fabric} has no default; "
        "set [preflight] min_busbw_gbps for one)"
    )


def _offering_cell(x: CandidateView) -> str:
    return escape(f"{x.provider}/{x.zone}/{x.instance_type}")


USABLE_COLUMNS = {
    "fabric": "FABRIC\nGbps/GPU",
    "price": "PRICE\nUSD/h",
    "speed": "SPEED\n×",
    "loss": "LOSS\nh",
    "move": "MOVE\nUSD",
    "expected": "EXPECTED\nUSD",
}
"""The usable table's figure columns: a name, and its unit on the line below."""


def _usable_table(rows: list[CandidateView]) -> Table:
    # One space between columns, units under the names, and the move column only where
    # a move costs anything: the table then fits 80 columns for the usual offering names.
    moves = any(x.breakdown.get("migration_usd", 0.0) for x in rows)
    table = Table(box=None, header_style="bold", padding=(0, 1, 0, 0), pad_edge=False)
    table.add_column("OFFERING", no_wrap=True)
    table.add_column(USABLE_COLUMNS["fabric"], no_wrap=True)
    table.add_column("MARKET", no_wrap=True)
    keys = ("price", "speed", "loss", *(("move",) if moves else ()), "expected")
    for key in keys:
        table.add_column(USABLE_COLUMNS[key], justify="right", no_wrap=True)
    for x in rows:
        b = x.breakdown
        move = (f"{b.get('migration_usd', 0.0):.2f}",) if moves else ()
        # Work a running hour there does against an hour on the reference setup.
        speed = b.get("efficiency", 1.0) * b.get("gpu_speed", 1.0)
        table.add_row(
            _offering_cell(x), f"{x.interconnect.fabric} {x.interconnect.gbps_per_gpu:g}",
            x.market, f"{x.price_per_hour:,.2f}", f"{speed:.2f}",
            f"{b.get('preemption_overhead_hours', 0.0):.2f}", *move,
            f"{x.expected_cost_usd:,.2f}",
        )  # fmt: skip
    return table


def _excluded_table(rows: list[CandidateView]) -> Table:
    table = Table(box=None, header_style="bold")
    table.add_column("OFFERING", overflow="fold")
    table.add_column("MARKET")
    table.add_column("PRICE USD/h", justify="right")
    table.add_column("KIND", no_wrap=True)
    table.add_column("EXCLUDED BECAUSE", overflow="fold")
    for x in rows:
        table.add_row(_offering_cell(x), x.market, f"{x.price_per_hour:,.2f}", _kind(x),
                      escape(x.excluded or ""))  # fmt: skip
    return table


def _kind(x: CandidateView) -> str:
    """The kind of rule that excluded ``x`` (``other`` from a daemon that does not say)."""
    return str(x.excluded_kind) if x.excluded_kind is not None else "other"


def _print_exclusions(view: PlanView, total: int) -> None:
    """How many offerings each kind of rule excluded, most first, with what they have in
    common (the daemon's summary; the kind alone from a daemon too old to give one)."""
    groups = [(g.count, str(g.kind), g.summary) for g in view.exclusions]
    if not groups:
        kinds = Counter(_kind(x) for x in view.candidates if x.excluded is not None)
        groups = [(n, kind, "") for kind, n in kinds.most_common()]
    width = max(len(kind) for _, kind, _ in groups)
    excluded = sum(n for n, _, _ in groups)
    out.print(f"{excluded} of {total} candidates excluded (--excluded lists each):")
    for n, kind, summary in groups:
        out.print(f"  {n:>4}  {kind:<{width}}  {escape(summary)}".rstrip(), highlight=False)
