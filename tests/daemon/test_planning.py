"""The plan view: what its expected figures cover, and its verdict on the deadline.

The verdict comes from the policy's own figures for its choice (the candidate's
breakdown) against the time to ``finish_by`` on the context's clock.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from spotd.core.network import Fabric, Interconnect
from spotd.core.outlook import CostBasis, DeadlineVerdict
from spotd.core.spec import JobSpec
from spotd.core.values import Offering, PlacementContext, Pool
from spotd.daemon.planning import PlanView, plan_view
from spotd_policies.balanced import BalancedPolicy
from spotd_policies.cheapest import CheapestPolicy

NOW = datetime(2026, 6, 1, tzinfo=UTC)
CHANGEOVER = 0.25
H100 = Offering(
    pool=Pool("sim-aws", "us-east-1", "us-east-1a", "p5.48xlarge"),
    gpu="H100", gpus_per_node=8, gpu_memory_gb=80,
    interconnect=Interconnect(Fabric.EFA, 400), spot_price=40.0, on_demand_price=98.0,
    capacity=1.0,
)  # fmt: skip


def spec(deadline: dict[str, object], *, nodes: int = 1) -> JobSpec:
    body: dict[str, object] = {
        "name": "j", "command": ["true"],
        "resources": {"gpus": ["H100", "A100"], "gpus_per_node": 8, "nodes": nodes},
    }  # fmt: skip
    if deadline:
        body["deadline"] = deadline
    return JobSpec.model_validate(body)


def ctx(job: JobSpec, *, done_hours: float = 0.0) -> PlacementContext:
    return PlacementContext(job_id="j-test", spec=job, now=NOW, done_hours=done_hours,
                            changeover_hours=CHANGEOVER)  # fmt: skip


def view(
    hours_left: float | None,
    *,
    pending: bool = False,
    compute_hours: float | None = 10.0,
    offering: Offering = H100,
    done_hours: float = 0.0,
) -> PlanView:
    """The balanced plan of a one-node spot job due ``hours_left`` from now."""
    deadline: dict[str, object] = {}
    if compute_hours is not None:
        deadline["compute_hours"] = compute_hours
    if hours_left is not None:
        deadline["finish_by"] = NOW + timedelta(hours=hours_left)
    c = ctx(spec(deadline), done_hours=done_hours)
    return plan_view("balanced", c, BalancedPolicy().place(c, [offering]), pending=pending)


def figures() -> tuple[float, float, float]:
    """(expected, fastest, margin) hours the policy gives its choice on H100."""
    choice = view(1000.0).choice
    assert choice is not None
    b = choice.breakdown
    fastest = b["work_hours"] + b["changeover_hours"] + b["migration_hours"]
    return b["expected_hours"], fastest, CHANGEOVER + b["checkpoint_interval_hours"]


def test_the_expected_cost_covers_the_compute_hours_left() -> None:
    covers = view(None, done_hours=4.0).covers
    assert covers is not None
    assert (covers.basis, covers.compute_hours) == (CostBasis.WORK_LEFT, 6.0)
    assert (covers.reference_gpu, covers.nodes, covers.gpus_per_node) == ("H100", 1, 8)
    assert covers.reference_fabric is None, "one node: the fabric does not count"
    gang = ctx(spec({"compute_hours": 10.0}, nodes=2))
    many = plan_view("balanced", gang, BalancedPolicy().place(gang, [H100])).covers
    assert many is not None and many.reference_fabric == "infiniband"


def test_without_compute_hours_the_figures_are_for_one_hour_and_there_is_no_verdict() -> None:
    plan = view(100.0, compute_hours=None)
    assert plan.covers is not None
    assert (plan.covers.basis, plan.covers.compute_hours) == (CostBasis.ONE_HOUR, 1.0)
    assert plan.deadline is not None and plan.deadline.verdict is None
    assert plan.deadline.hours_left == pytest.approx(100.0)
    assert view(None, compute_hours=None).deadline is None, "no finish_by, no deadline"


def test_a_plan_with_slack_to_spare_meets_the_deadline() -> None:
    expected, _, margin = figures()
    d = view(100.0).deadline
    assert d is not None and d.verdict is DeadlineVerdict.MEETS
    assert d.slack_hours == pytest.approx(100.0 - expected, abs=1e-3)
    assert d.expected_hours == pytest.approx(expected, abs=1e-3)
    assert d.margin_hours == pytest.approx(margin, abs=1e-3)
    assert not d.fails_at_once


def test_a_plan_with_less_slack_than_the_margin_is_at_risk() -> None:
    expected, _, margin = figures()
    d = view(expected + margin / 2).deadline
    assert d is not None and d.verdict is DeadlineVerdict.AT_RISK
    assert d.slack_hours == pytest.approx(margin / 2, abs=1e-3)


def test_a_plan_that_cannot_finish_even_without_preemptions_cannot_meet_it() -> None:
    _, fastest, _ = figures()
    # More time than the work at reference speed (so no rule of the engine fails it),
    # less than the changeover and the work on the choice.
    d = view(fastest - CHANGEOVER / 2, pending=True).deadline
    assert d is not None and d.verdict is DeadlineVerdict.CANNOT_MEET
    assert not d.fails_at_once
    assert d.slack_hours is not None and d.slack_hours < 0


def test_a_new_job_whose_compute_hours_do_not_fit_is_failed_at_once() -> None:
    # On A100 listed second a faster GPU would not help: the engine judges a new job
    # by its compute hours (spotd.engine.judge.deadline_impossible).
    d = view(9.0, pending=True).deadline
    assert d is not None and d.verdict is DeadlineVerdict.CANNOT_MEET and d.fails_at_once
    assert d.hours_left == pytest.approx(9.0)
    # A job that has started is not judged so: the policy's figures decide.
    running = view(9.0, pending=False, done_hours=5.0).deadline
    assert running is not None and not running.fails_at_once
    assert running.verdict is DeadlineVerdict.MEETS


def test_a_passed_deadline_cannot_be_met() -> None:
    d = view(-3.0).deadline
    assert d is not None and d.verdict is DeadlineVerdict.CANNOT_MEET
    assert d.hours_left == pytest.approx(-3.0)


def test_with_no_choice_now_the_deadline_is_at_risk() -> None:
    plan = view(500.0, offering=replace(H100, capacity=0.0))
    assert plan.choice is None
    assert plan.deadline is not None and plan.deadline.verdict is DeadlineVerdict.AT_RISK
    assert plan.deadline.expected_hours == pytest.approx(10.0 + CHANGEOVER)


def test_a_policy_with_fewer_figures_is_read_as_far_as_it_goes() -> None:
    c = ctx(spec({"compute_hours": 10.0, "finish_by": NOW + timedelta(hours=10.5)}))
    d = plan_view("cheapest", c, CheapestPolicy().place(c, [H100])).deadline
    assert d is not None and d.expected_hours == pytest.approx(10.0)
    assert d.verdict is DeadlineVerdict.MEETS  # 0.5 h of slack over its 0.25 h margin


def test_the_json_carries_the_verdict_the_slack_and_what_the_cost_covers() -> None:
    dumped = view(100.0).model_dump(mode="json")
    assert dumped["deadline"]["verdict"] == "meets"
    assert dumped["deadline"]["slack_hours"] > 0
    assert dumped["covers"]["basis"] == "work-left" and dumped["covers"]["compute_hours"] == 10
    again = PlanView.model_validate(dumped)
    assert again.deadline is not None and again.deadline.verdict is DeadlineVerdict.MEETS
    # A reply of a daemon that predates them still reads.
    del dumped["deadline"], dumped["covers"]
    older = PlanView.model_validate(dumped)
    assert older.deadline is None and older.covers is None
