"""``spotd plan`` as printed: units on every figure column, what the expected cost
covers, a warning where it is one hour's, and the deadline verdict with its slack."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from spotd.cli.render import plan as render
from spotd.core.network import Fabric, Interconnect
from spotd.core.spec import JobSpec
from spotd.core.values import Offering, PlacementContext, Pool
from spotd.daemon.planning import PlanView, plan_view
from spotd_policies.balanced import BalancedPolicy

NOW = datetime(2026, 6, 1, tzinfo=UTC)
H100 = Offering(
    pool=Pool("sim-aws", "us-east-1", "us-east-1a", "p5.48xlarge"),
    gpu="H100", gpus_per_node=8, gpu_memory_gb=80,
    interconnect=Interconnect(Fabric.EFA, 400), spot_price=40.0, on_demand_price=98.0,
    capacity=1.0,
)  # fmt: skip


def plan(deadline: dict[str, object], *, pending: bool = True) -> PlanView:
    spec = JobSpec.model_validate({
        "name": "j", "command": ["true"],
        "resources": {"gpus": ["H100"], "gpus_per_node": 8},
        **({"deadline": deadline} if deadline else {}),
    })  # fmt: skip
    ctx = PlacementContext(job_id="j-test", spec=spec, now=NOW, changeover_hours=0.25)
    return plan_view("balanced", ctx, BalancedPolicy().place(ctx, [H100]), pending=pending)


def printed(view: PlanView, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    shown = io.StringIO()
    monkeypatch.setattr(render, "out", Console(file=shown, width=160))
    render.print_plan(view, top=5, excluded=False)
    return shown.getvalue().splitlines()


def due(hours: float) -> dict[str, object]:
    return {"compute_hours": 10.0, "finish_by": NOW + timedelta(hours=hours)}


def test_every_figure_column_names_its_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = printed(plan(due(100)), monkeypatch)
    head = next(i for i, line in enumerate(lines) if line.startswith("OFFERING"))
    names, units = lines[head - 1].split(), lines[head].split()
    assert names == ["FABRIC", "PRICE", "SPEED", "LOSS", "EXPECTED"]
    assert units == ["OFFERING", "Gbps/GPU", "MARKET", "USD/h", "×", "h", "USD"]
    assert not {"EFF", "USD/H"} & set(names + units)
    assert lines[head + 1].startswith("sim-aws/us-east-1a/p5.48xlarge")


def test_the_move_column_names_its_unit_too() -> None:
    assert render.USABLE_COLUMNS["move"] == "MOVE\nUSD"
    assert all("\n" in header for header in render.USABLE_COLUMNS.values())


def test_the_expected_cost_says_what_it_covers(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = printed(plan(due(100)), monkeypatch)
    assert "EXPECTED: the cost to finish the 10 compute hours left (hours on 1 node of 8 H100)" in (
        lines
    )
    assert not any(line.startswith("warning:") for line in lines)


def test_without_compute_hours_it_warns_the_figures_are_one_hours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = printed(plan({}), monkeypatch)
    assert lines[0].endswith(" USD per compute hour")
    assert "EXPECTED: the cost of 1 compute hour of work (an hour on 1 node of 8 H100)" in lines
    (warning,) = [line for line in lines if line.startswith("warning:")]
    assert "no deadline.compute_hours" in warning and "not the whole job" in warning
    assert not any(line.startswith("deadline ") for line in lines), "no finish_by, no verdict"


def _verdict(lines: list[str]) -> str:
    (line,) = [x for x in lines if x.startswith("deadline 2026-")]
    return line


def test_a_plan_that_meets_its_deadline_says_so_with_its_slack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = plan(due(100))
    assert view.deadline is not None and view.deadline.slack_hours is not None
    line = _verdict(printed(view, monkeypatch))
    assert line.startswith("deadline 2026-06-05 04:00:00Z: meets it with ")
    assert f"{view.deadline.slack_hours:,.1f} h of slack (100.0 h left, " in line


def test_a_plan_at_risk_says_so_with_its_slack_and_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    d = plan(due(100)).deadline
    assert d is not None and d.expected_hours is not None and d.margin_hours is not None
    line = _verdict(printed(plan(due(d.expected_hours + d.margin_hours / 2)), monkeypatch))
    assert re.search(r": at risk, 0\.\d h of slack, under the \d\.\d\d h margin \(", line), line
    # Late in expectation, in time without a preemption: at risk, and how late.
    line = _verdict(printed(plan(due(d.expected_hours - 0.3)), monkeypatch))
    assert ": at risk, 0.3 h late in expectation: in time only with fewer preemptions" in line


def test_a_plan_that_cannot_meet_its_deadline_says_by_how_much(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    short = plan(due(10.05), pending=False)  # the work, but not the changeover too
    line = _verdict(printed(short, monkeypatch))
    assert re.search(r": cannot meet it, 0\.\d h short \(10\.1 h left, ", line), line
    # A new job whose compute hours do not fit: the engine fails it at once.
    line = _verdict(printed(plan(due(8.0)), monkeypatch))
    assert line.endswith(": cannot meet it: its 10 compute hours do not fit in the 8.0 h left, "
                         "and spotd fails such a new job at once")  # fmt: skip
    line = _verdict(printed(plan(due(-2.0)), monkeypatch))
    assert line.endswith(": cannot meet it: it passed 2.0 h ago")
