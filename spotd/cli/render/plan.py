"""A plan as ``spotd plan`` prints it: the choice, the candidates, the exclusions."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from spotd.cli.render.console import out

if TYPE_CHECKING:
    from spotd.daemon.planning import CandidateView, PlanView


def print_plan(view: PlanView, *, top: int, excluded: bool) -> None:
    """The policy's choice, the ``top`` usable candidates, the choice's environment, and
    the excluded offerings: each one with ``excluded``, else counted by kind of rule."""
    c = view.choice
    if c is None:
        out.print(f"[red]{escape(view.policy)}: no offering passes the filters[/red]")
    else:
        out.print(
            f"[bold]{escape(view.policy)}[/bold] chooses {c.provider}/{c.zone}/{c.instance_type} "
            f"{c.market}: {c.price_per_hour:,.2f} USD/h, expected {c.expected_cost_usd:,.2f} USD",
            highlight=False,
        )
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


def _usable_table(rows: list[CandidateView]) -> Table:
    # One space between columns and the move column only where a move costs anything:
    # the table then fits 80 columns for the usual offering names.
    moves = any(x.breakdown.get("migration_usd", 0.0) for x in rows)
    table = Table(box=None, header_style="bold", padding=(0, 1, 0, 0), pad_edge=False)
    table.add_column("OFFERING", no_wrap=True)
    table.add_column("FABRIC", no_wrap=True)
    table.add_column("MARKET", no_wrap=True)
    for column in ("USD/H", "EFF", "LOSS H", *(("MOVE USD",) if moves else ()), "EXPECTED"):
        table.add_column(column, justify="right", no_wrap=True)
    for x in rows:
        b = x.breakdown
        move = (f"{b.get('migration_usd', 0.0):.2f}",) if moves else ()
        table.add_row(
            _offering_cell(x), f"{x.interconnect.fabric} {x.interconnect.gbps_per_gpu:g}",
            x.market, f"{x.price_per_hour:,.2f}", f"{b.get('efficiency', 1.0):.2f}",
            f"{b.get('preemption_overhead_hours', 0.0):.2f}", *move,
            f"{x.expected_cost_usd:,.2f}",
        )  # fmt: skip
    return table


def _excluded_table(rows: list[CandidateView]) -> Table:
    table = Table(box=None, header_style="bold")
    table.add_column("OFFERING", overflow="fold")
    table.add_column("MARKET")
    table.add_column("USD/H", justify="right")
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
