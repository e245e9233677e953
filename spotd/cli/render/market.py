"""The market as ``spotd prices`` prints it, and ``spotd check-cloud``'s verdicts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from spotd.cli.errors import error
from spotd.cli.render.console import out

if TYPE_CHECKING:
    from spotd.core.values import CloudCheck
    from spotd.daemon.views import MarketView


def print_market(view: MarketView, source: str) -> None:
    """The offerings as a table titled with their ``source``, then each provider's poll:
    how many offerings, how old, stale or failed."""
    table = Table(box=None, header_style="bold", title=f"market ({source})")
    columns = ("PROVIDER", "ZONE", "TYPE", "GPU", "FABRIC", "GBPS/GPU", "SPOT", "ON-DEMAND", "CAP")
    for column in columns:
        table.add_column(column, justify="right" if column in ("SPOT", "ON-DEMAND") else "left")
    for o in view.offerings:
        table.add_row(
            o.provider, o.zone, o.instance_type, f"{o.gpus_per_node}x {o.gpu}", o.fabric,
            f"{o.gbps_per_gpu:g}", _usd(o.spot_price), _usd(o.on_demand_price),
            "-" if o.capacity is None else f"{o.capacity:.1f}",
        )
    out.print(table)
    for p in view.providers:
        if p.error is not None and not p.offerings:
            error(f"{p.provider}: no offerings, its price poll failed ({p.failures}x): {p.error}")
            continue
        age = "never polled" if p.age_seconds is None else f"{p.age_seconds:.0f} s old"
        line = f"{p.provider}: {p.offerings} offerings, {age}"
        if p.stale:
            line += f" [yellow]STALE[/]: {p.failures} failed poll(s), last: {escape(p.error or '')}"
        out.print(line, highlight=False)


def _usd(price: float | None) -> str:
    return "-" if price is None else f"{price:,.2f}"


def check_json(check: CloudCheck) -> dict[str, object]:
    """One provider's checks as ``spotd check-cloud --json`` gives them."""
    return {
        "provider": check.provider,
        "ok": check.ok,
        "checks": [{"name": o.name, "ok": o.ok, "detail": o.detail} for o in check.outcomes],
        "would_create": list(check.would_create),
    }


def print_check(check: CloudCheck) -> None:
    """One provider's verdict, a line per check, and what a launch would create."""
    verdict = "[green]ready[/green]" if check.ok else "[red]not ready[/red]"
    out.print(f"[bold]{escape(check.provider)}[/bold]: {verdict}", highlight=False)
    for o in check.outcomes:
        mark = "[green]pass[/green]" if o.ok else "[red]FAIL[/red]"
        out.print(f"  {mark} {escape(o.name)}: {escape(o.detail)}", highlight=False,
                  soft_wrap=True)  # fmt: skip
    if check.would_create:
        out.print("  a launch would create (nothing was created):", highlight=False)
        for line in check.would_create:
            out.print(f"    {escape(line)}", highlight=False, soft_wrap=True)
