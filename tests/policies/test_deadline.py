"""Deadline control: the planner (spotd_policies.deadline), its market (capacity_model)."""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotd.core.capacity import CapacitySeries
from spotd.core.network import Fabric, Interconnect
from spotd.core.spec import BudgetSpec, JobSpec
from spotd.core.values import Market, Offering, PlacementContext, Pool
from spotd_policies import capacity_model as availability
from spotd_policies import deadline
from spotd_policies.balanced import BalancedPolicy

IDLE, OD, SPOT = deadline.Action.IDLE, deadline.Action.ON_DEMAND, deadline.Action.SPOT
START = datetime(2026, 1, 5, tzinfo=UTC)


def test_plan_waits_with_slack_and_pays_when_late() -> None:
    model = deadline.memoryless(1.0, 3.33, up_hours=5.0, down_hours=3.3)
    plan = deadline.plan(model, work_hours=10, time_hours=30, changeover_hours=0.3)
    assert plan.action(0, 0, IDLE, spot_up=True) is SPOT
    assert plan.action(0, 0, IDLE, spot_up=False) is IDLE
    assert plan.action(25, 2, IDLE, spot_up=False) is OD
    assert plan.action(29.9, 1, IDLE, spot_up=True) is OD


def test_kaplan_meier_hazards_by_hand() -> None:
    """Spells of 1, 1, 2 and 3 steps (the 3 still going): hazards 2/4, 1/2, 0/1 with no prior."""
    law = deadline.SpellLaw(
        prior_hours=1.0,
        prior_weight=0.0,
        hours=np.array([0.1, 0.1, 0.2, 0.3]),
        ended=np.array([True, True, True, False]),
    )
    h = law.hazards(step_hours=0.1, ages=4)
    assert h[:3] == pytest.approx([0.5, 0.5, 1e-4], abs=1e-9)
    assert law.mean_hours == pytest.approx(0.7 / 3)


def _first_on_demand(plan: deadline.Plan, age_hours: float) -> int:
    """Steps of lag (time without progress) at which the plan gives up waiting."""
    return next(
        lag for lag in range(200)
        if plan.action(1.0 + lag * plan.step_hours, 1.0, IDLE, False, age_hours=age_hours) is OD
    )


def test_a_long_down_spell_sends_the_job_to_on_demand_sooner() -> None:
    """Outages that are mostly short blips but sometimes last a day: early in an
    outage it pays to wait; once it has lasted, it is likely a long one."""
    rng = np.random.default_rng(0)
    hours = np.concatenate([rng.exponential(0.2, 180), rng.exponential(20.0, 20)])
    down = deadline.SpellLaw(2.0, hours=hours, ended=np.ones(200, dtype=bool))
    model = deadline.SpotModel(1.0, 3.33, down, deadline.SpellLaw(5.0))
    plan = deadline.plan(model, work_hours=10, time_hours=14, changeover_hours=0.3)
    assert _first_on_demand(plan, age_hours=1.5) < _first_on_demand(plan, age_hours=0.1) - 5
    flat = deadline.memoryless(1.0, 3.33, up_hours=5.0, down_hours=down.mean_hours)
    flat_plan = deadline.plan(flat, work_hours=10, time_hours=14, changeover_hours=0.3)
    assert _first_on_demand(flat_plan, 1.5) == _first_on_demand(flat_plan, 0.1), (
        "a memoryless plan cannot tell a young outage from an old one"
    )


def test_a_preemption_loses_its_expected_steps_not_a_rounded_up_step() -> None:
    """A loss of 2.25 steps on average is 2 steps three times in four and 3 once: the
    table after a preemption mixes the two, so a loss of a few seconds (the reference
    model's checkpoints) is not charged as a whole step of slack each time."""
    value = np.arange(24, dtype=np.float32).reshape(2, 6, 2)
    mixed = deadline._setback(value, 2.25)
    two, three = deadline._shift(value, 2), deadline._shift(value, 3)
    assert mixed[:, :3] == pytest.approx(0.75 * two[:, :3] + 0.25 * three[:, :3])
    assert (mixed[:, 4:] >= deadline._LOST / 2).all(), "past the slack stays lost"
    assert deadline._setback(value, 0.0) is value
    tiny = deadline._setback(value, 1e-3)
    assert tiny[:, :5] == pytest.approx(value[:, :5], abs=0.01)


def test_spot_cheaper_by_the_hour_but_dearer_by_the_work_is_not_ridden() -> None:
    """Spot at half the on-demand price per hour, but at 40 % of its speed (a slower
    fabric): 2.5 per hour of work against 2.0. At full speed the plan rides spot."""
    fast = deadline.memoryless(1.0, 2.0, up_hours=50.0, down_hours=1.0)
    slow = dataclasses.replace(fast, spot_speed=0.4)
    assert deadline.plan(fast, 10, 40, 0.3).action(0, 0, IDLE, spot_up=True) is SPOT
    assert deadline.plan(slow, 10, 40, 0.3).action(0, 0, IDLE, spot_up=True) is not SPOT
    assert slow.summary() != fast.summary(), "a new speed re-solves a cached plan"


def test_slower_spot_spends_slack_and_the_deadline_holds() -> None:
    """Reliable spot at 0.8 of on-demand's speed, 2 hours of slack on a 10-hour job: each
    hour on spot spends 0.2 h of slack, so the plan rides it for about 10 hours, then pays
    for on-demand and finishes in time. At full speed it rides spot to the end."""
    fast = deadline.memoryless(1.0, 3.0, up_hours=1e4, down_hours=1.0)
    slow = dataclasses.replace(fast, spot_speed=0.8)
    hours = {}
    for model in (fast, slow):
        plan = deadline.plan(model, work_hours=10, time_hours=12, changeover_hours=0.0)
        t = done = 0.0
        on = {SPOT: 0.0, OD: 0.0}
        while done < 10 - 1e-9:
            assert t < 12 - 1e-9, "missed the deadline"
            action = plan.action(t, done, SPOT if on[OD] == 0 else OD, spot_up=True)
            assert action is not IDLE
            on[action] += plan.step_hours
            done += plan.step_hours * (model.spot_speed if action is SPOT else 1.0)
            t += plan.step_hours
        hours[model.spot_speed] = on
    assert hours[1.0][OD] == 0
    assert 8.5 <= hours[0.8][SPOT] <= 10.0 and hours[0.8][OD] > 1.5


def test_the_plan_is_bounded_in_memory() -> None:
    model = deadline.memoryless(1.0, 3.0, 4.0, 2.0)
    plan = deadline.plan(model, work_hours=24 * 7, time_hours=24 * 21, changeover_hours=0.2)
    assert plan.actions.nbytes < 12e6
    assert plan.action(0, 0, IDLE, True) is SPOT


def test_an_impossible_deadline_says_on_demand() -> None:
    plan = deadline.plan(deadline.memoryless(1.0, 3.0, 4.0, 2.0), 10, 8, 0.3)
    assert plan.action(0, 0, IDLE, True) is OD


def _heavy_tailed_law(rng: random.Random, mean: float, n: int) -> deadline.SpellLaw:
    hours = np.array([rng.paretovariate(1.5) * mean / 3 for _ in range(n)])
    return deadline.SpellLaw(mean, hours=hours, ended=np.ones(n, dtype=bool))


@given(
    up_mean=st.floats(0.3, 8.0),
    down_mean=st.floats(0.2, 6.0),
    work=st.floats(1, 16),
    slack=st.floats(1.1, 2.5),
    heavy=st.booleans(),
    seed=st.integers(0, 2**31),
)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_plan_never_misses_a_feasible_deadline(
    up_mean: float, down_mean: float, work: float, slack: float, heavy: bool, seed: int
) -> None:
    """Follow the plan on a random market drawn from its own model: always done in time.

    A booting node is looked up as running, as the policy does; spells are
    exponential or heavy-tailed (Pareto), and the plan is told their ages.
    """
    rng = random.Random(seed)
    d = 0.3
    time_hours = work * slack + 2 * d
    if heavy:
        model = deadline.SpotModel(
            1.0, 3.33, _heavy_tailed_law(rng, down_mean, 60), _heavy_tailed_law(rng, up_mean, 60)
        )
    else:
        model = deadline.memoryless(1.0, 3.33, up_mean, down_mean)
    plan = deadline.plan(model, work, time_hours, d)
    step = plan.step_hours
    ages = plan.ages
    hazard = {
        False: model.down.hazards(step, ages),
        True: model.up.hazards(step, ages),
    }
    up, age, t, done, mode, booting = rng.random() < 0.5, 0, 0.0, 0.0, IDLE, 0.0
    while done < work - 1e-9:
        assert t < time_hours + 1e-9, f"missed: {done:.2f}/{work:.2f} h at {t:.2f}"
        want = plan.action(t, done, mode, up, age_hours=age * step)
        if want is not mode:
            mode, booting = want, (d if want is not IDLE else 0.0)
        if mode is not IDLE:
            if booting > 1e-9:
                booting = max(0.0, booting - step)
            else:
                done += step
        t += step
        if rng.random() < hazard[up][min(age, ages - 1)]:
            up, age = not up, 0
            if mode is SPOT:
                mode = IDLE
        else:
            age += 1


def _series(pattern: str, step_hours: float = 1.0, start: datetime = START) -> CapacitySeries:
    return CapacitySeries(start, step_hours, np.array([c == "1" for c in pattern]))


def test_model_from_two_pools_that_overlap() -> None:
    """Two pools never down together, each up 3 hours in 4, overlapping 2 of them."""
    a = _series("1110" * 30)
    b = _series("0111" * 30)
    model = availability.spot_model([a, b], spot_price=1.0, od_price=3.0)
    assert model.down.hours.size == 0
    assert model.up_after_loss > 0.95  # a goes while b is up: b stays
    assert model.age_after_loss_hours == pytest.approx(2.0)  # b came 2 hours before
    assert model.up_after_loss_alone > 0.95  # b goes alone just as a comes back
    assert model.up.mean_hours == pytest.approx(3.0, rel=0.1)
    assert model.others_rise_per_hour > 0.5 and model.others_fall_per_hour > 0.2
    assert model.pools == 2
    plan = deadline.plan(model, work_hours=10, time_hours=14, changeover_hours=0.3)
    assert plan.actions.shape[3] == 3 * plan.ages
    assert plan.action(0, 0, IDLE, True, age_hours=0.5, others_up=True) is SPOT


def test_model_without_history_is_the_prior() -> None:
    model = availability.spot_model([], spot_price=1.0, od_price=3.0)
    assert model.up.hours.size == 0 and model.diurnal is None
    assert model.run_preempt_rate == pytest.approx(0.2)


def test_model_finds_the_hour_of_day_pattern() -> None:
    """Capacity taken back every afternoon: up spells end at 15:00, never at night."""
    day = "1" * 15 + "0" * 2 + "1" * 7  # hours 0..23 of each day, 10-minute steps below
    pattern = "".join(c * 6 for c in day) * 14
    model = availability.spot_model(
        [_series(pattern, step_hours=1 / 6)], spot_price=1.0, od_price=3.0
    )
    assert model.diurnal is not None
    up_by_hour = model.diurnal[1]
    assert up_by_hour[15] > 2.0 > 0.5 > up_by_hour[3]


def test_residual_life_grows_with_age_in_a_heavy_tailed_pool() -> None:
    """Most spells are short, a few last long: one that has lasted is likely to go on."""
    rng = random.Random(1)
    pattern = ""
    for _ in range(80):
        pattern += "1" * (1 if rng.random() < 0.8 else 40) + "0" * 3
    young = _series(pattern + "1", step_hours=0.1)
    old = _series(pattern + "1" * 15, step_hours=0.1)
    assert availability.residual_up_hours(old) > 2 * availability.residual_up_hours(young)
    assert availability.residual_up_hours(_series(pattern + "0")) == 0.0


def test_down_age_counts_since_any_pool_was_up() -> None:
    a = _series("1100000", step_hours=0.5)
    b = _series("0111000", step_hours=0.5)
    assert availability.down_age_hours([a, b]) == pytest.approx(1.0)
    assert availability.down_age_hours([a, _series("0000001", step_hours=0.5)]) == 0.0
    shifted = CapacitySeries(START + timedelta(hours=1), 0.5, np.array([False] * 5))
    assert availability.down_age_hours([a, shifted]) == pytest.approx(2.0)


def test_longest_outage_looks_at_the_recent_window_only() -> None:
    """Outages of every pool at once, in the last hours only, the present one included."""
    a = _series("1" * 4 + "0" * 10 + "1" * 4 + "0" * 2 + "1" * 4 + "000", step_hours=0.5)
    b = _series("0" * 14 + "1" * 5 + "0" * 5 + "0" * 3, step_hours=0.5)
    assert availability.longest_outage_hours([a], window_hours=6.5) == pytest.approx(1.5)
    # The window cuts the 5-hour outage: what it sees of it counts.
    assert availability.longest_outage_hours([a], window_hours=10) == pytest.approx(3.5)
    # b is up in half of a's short gap; both are down in the last 1.5 h.
    assert availability.longest_outage_hours([a, b], window_hours=6) == pytest.approx(1.5)
    assert availability.longest_outage_hours([a, b], window_hours=13.5) == pytest.approx(5.0)
    assert availability.longest_outage_hours([a], window_hours=20) is None  # too short a history
    assert availability.longest_outage_hours([_series("1" * 12)], window_hours=6) == 0.0


# -- the balanced policy's deadline control ------------------------------------------


class _History:
    """PoolStats over given capacity series (what the daemon's price history gives)."""

    def __init__(self, series: dict[Pool, CapacitySeries]) -> None:
        self._series = series

    def availability(self, pool: Pool) -> float | None:
        s = self._series.get(pool)
        return None if s is None else float(s.up.mean())

    def preemptions_per_hour(self, pool: Pool) -> float | None:
        return None

    def capacity_series(self, pool: Pool) -> CapacitySeries | None:
        return self._series.get(pool)


def _offering(zone: str, gpu: str, *, spot: float | None, od: float, up: bool = True) -> Offering:
    return Offering(
        pool=Pool("aws", "us-east-1", zone, f"{gpu.lower()}-8x"), gpu=gpu, gpus_per_node=8,
        gpu_memory_gb=80, interconnect=Interconnect(Fabric.EFA, 400), spot_price=spot,
        on_demand_price=od, capacity=1.0 if up else 0.0,
    )


def _deadline_job(gpus: list[str], compute: float, hours_left: float) -> JobSpec:
    return JobSpec.model_validate({
        "name": "d", "command": ["true"],
        "resources": {"gpus": gpus, "gpus_per_node": 8, "nodes": 1},
        "market": {"type": "auto"},
        "checkpoint": {"size_gb": 1},
        "deadline": {"compute_hours": compute, "finish_by": START + timedelta(hours=hours_left)},
    })


def test_on_demand_that_cannot_finish_in_time_is_passed_over() -> None:
    """The cheapest on-demand (A100, a third of the speed) cannot do 10 H100-hours in 12:
    the policy pays for the H100, although the best-first search only scored the A100."""
    spec = _deadline_job(["H100", "A100"], compute=10, hours_left=12)
    market = [_offering("a", "A100", spot=None, od=2.0), _offering("b", "H100", spot=None, od=8.0)]
    ranked = BalancedPolicy().place(PlacementContext("j1", spec, START), market)
    cost = {
        c.offering.gpu: c.expected_cost_usd
        for c in ranked.candidates
        if c.market is Market.ON_DEMAND and c.excluded is None
    }
    assert cost["A100"] < cost["H100"], "A100 on-demand is the cheaper estimate"
    far = _deadline_job(["H100", "A100"], compute=10, hours_left=60)
    assert BalancedPolicy().place(PlacementContext("j2", far, START), market).choice is not None
    choice = ranked.choice
    assert choice is not None and choice.offering.gpu == "H100"
    assert choice.market is Market.ON_DEMAND
    # The search for a fast enough one keeps the hard filters: the budget too.
    tight = spec.model_copy(update={"budget": BudgetSpec(max_usd=70.0)})
    within = BalancedPolicy().place(PlacementContext("j1b", tight, START), market).choice
    assert within is not None and within.offering.gpu == "A100"


def test_a_slow_cheap_on_demand_is_weighed_by_the_work_it_does() -> None:
    """On-demand A100 costs 2.0 an hour, H100 spot 3.0, but the A100 needs three times the
    hours: 62 for the job against about 30. The plan counts work and prices in hours of
    the fastest on-demand, so it rides the H100 spot rather than paying the A100 by the hour."""
    market = [_offering("a", "A100", spot=None, od=2.0), _offering("b", "H100", spot=3.0, od=8.0)]
    for left in (33, 60):
        spec = _deadline_job(["H100", "A100"], compute=10, hours_left=left)
        ctx = PlacementContext(f"j-{left}", spec, START, changeover_hours=0.2)
        choice = BalancedPolicy().place(ctx, market).choice
        assert choice is not None and choice.market is Market.SPOT
        assert choice.offering.gpu == "H100"


def test_of_two_pools_up_the_one_likely_to_last_is_taken() -> None:
    """Same price, same fabric: one pool's spells are long, the other's flicker."""
    steady = "1" * 40 + "0" * 2
    flicker = "10"
    hist = {
        "steady": _series(steady * 12 + "1" * 5, step_hours=0.25),
        "flicker": _series(flicker * 252 + "1", step_hours=0.25),
    }
    market = [
        _offering("flicker", "H100", spot=3.0, od=9.0),
        _offering("steady", "H100", spot=3.0, od=9.0),
    ]
    stats = _History({o.pool: hist[o.pool.zone] for o in market})
    spec = _deadline_job(["H100"], compute=10, hours_left=30)
    ctx = PlacementContext("j3", spec, START, stats=stats)
    choice = BalancedPolicy().place(ctx, market).choice
    assert choice is not None and choice.market is Market.SPOT
    assert choice.offering.pool.zone == "steady"


def test_a_job_on_spot_leaves_before_a_preemption_could_cost_the_deadline() -> None:
    """Ten hours of work, 10.9 left, checkpoints every hour: one preemption could lose an
    hour, and on-demand would then be too late; so it goes to on-demand now."""
    spec = _deadline_job(["H100"], compute=10, hours_left=10.9).model_copy(deep=True)
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(
        update={"interval": timedelta(hours=1)})})
    market = [_offering("a", "H100", spot=3.0, od=9.0)]
    here = market[0].pool
    on_spot = PlacementContext("j4", spec, START, current=here, current_market=Market.SPOT,
                               changeover_hours=0.1)
    choice = BalancedPolicy().place(on_spot, market).choice
    assert choice is not None and choice.market is Market.ON_DEMAND
    roomy = spec.model_copy(update={"deadline": spec.deadline.model_copy(  # type: ignore[union-attr]
        update={"finish_by": START + timedelta(hours=14)})})
    keep = BalancedPolicy().place(
        PlacementContext("j5", roomy, START, current=here, current_market=Market.SPOT,
                         changeover_hours=0.1), market).choice
    assert keep is not None and keep.market is Market.SPOT


@pytest.mark.parametrize(("on_notice", "market"), [(True, Market.SPOT), (False, Market.ON_DEMAND)])
def test_spot_that_only_pays_when_the_notice_saves_the_work(
    on_notice: bool, market: Market
) -> None:
    """Spot at 8 against on-demand at 9, a pool preempted every hour or so, checkpoints 3 h
    apart: each preemption would throw away 1.5 h of work on average, unless the job
    checkpoints on the notice (1 GB fits in AWS's 120 s), when it costs only the restart."""
    spec = _deadline_job(["H100"], compute=10, hours_left=16)
    spec = spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(
        update={"interval": timedelta(hours=3), "on_notice": on_notice})})
    offers = [_offering("a", "H100", spot=8.0, od=9.0)]
    stats = _History({offers[0].pool: _series("11110" * 60 + "1", step_hours=0.25)})
    ctx = PlacementContext("j6", spec, START, stats=stats, changeover_hours=0.1)
    choice = BalancedPolicy().place(ctx, offers).choice
    assert choice is not None and choice.market is market


def test_a_step_is_kept_in_hand_where_a_preemption_loses_no_work() -> None:
    """4 h of work in 5 h, changeovers of 0.3 h, spot that loses nothing to a preemption
    (the notice's checkpoint): with exactly a changeover of slack left a preemption would
    still leave time to restart, but only to the step, so the plan leaves spot there;
    with a step more it rides on."""
    model = deadline.memoryless(1.0, 3.0, up_hours=5.0, down_hours=1.0)
    plan = deadline.plan(model, 4.0, 5.0, 0.3, lost_hours=0.0)
    assert plan.step_hours == pytest.approx(0.1)
    # One hour in: lag 0.7 h leaves 0.3 h of slack, lag 0.6 h leaves 0.4 h.
    assert plan.action(1.0, 0.3, SPOT, True, age_hours=0.5) is OD
    assert plan.action(1.0, 0.4, SPOT, True, age_hours=0.5) is SPOT


@pytest.mark.parametrize(
    ("recent", "age_hours", "market"),
    [("short", 1.0, None), ("long", 1.0, Market.ON_DEMAND), ("short", 3.0, Market.ON_DEMAND)],
)
def test_a_waiting_job_hedges_on_demand_only_against_outages_seen_lately(
    recent: str, age_hours: float, market: Market | None
) -> None:
    """The same spells in another order: ten 10-hour outages and twenty of half an hour. With
    5 hours of slack and spot out for an hour the plan hedges on on-demand; where the last
    72 hours saw only the short outages it waits instead, as greedy would, unless the
    present outage has itself grown too long for the slack."""
    long_, short = "1" * 16 + "0" * 40, "1" * 16 + "0" * 2
    spells = long_ * 10 + short * 20 if recent == "short" else short * 20 + long_ * 10
    pattern = spells + "0" * round(age_hours / 0.25 - (2 if recent == "short" else 40))
    if recent == "long":
        pattern = spells[: -40] + "0" * round(age_hours / 0.25)
    offers = [_offering("a", "H100", spot=3.0, od=9.0, up=False)]
    begin = START - timedelta(hours=len(pattern) * 0.25)
    stats = _History({offers[0].pool: _series(pattern, step_hours=0.25, start=begin)})
    spec = _deadline_job(["H100"], compute=24, hours_left=29)
    ctx = PlacementContext("j7", spec, START, stats=stats, changeover_hours=0.3)
    choice = BalancedPolicy().place(ctx, offers).choice
    assert (choice and choice.market) is market


@pytest.mark.parametrize("hours_left", [30.0, 400.0, 9000.0])
def test_a_far_deadline_rides_spot_as_a_near_one_does(hours_left: float) -> None:
    """A deadline a year out binds nothing yet: the plan looks no further than a few
    times the work ahead, so its steps stay finer than a spot spell and it rides spot
    (a plan to the deadline itself took on-demand at about 1,000 h)."""
    steady = "1" * 40 + "0" * 2
    market = [_offering("steady", "H100", spot=3.0, od=9.0)]
    stats = _History({market[0].pool: _series(steady * 12 + "1" * 5, step_hours=0.25)})
    spec = _deadline_job(["H100"], compute=10, hours_left=hours_left)
    policy = BalancedPolicy()
    choice = policy.place(PlacementContext("far", spec, START, stats=stats), market).choice
    assert choice is not None and choice.market is Market.SPOT


def test_a_plan_cut_short_of_its_deadline_is_solved_again_halfway() -> None:
    """The nearer end a cut plan assumes never decides: half-way through its horizon
    the plan no longer covers the job, and the next pass solves a new one."""
    from spotd_policies import balanced

    steady = "1" * 40 + "0" * 2
    market = [_offering("steady", "H100", spot=3.0, od=9.0)]
    stats = _History({market[0].pool: _series(steady * 12 + "1" * 5, step_hours=0.25)})
    spec = _deadline_job(["H100"], compute=10, hours_left=9000)
    policy = BalancedPolicy()
    policy.place(PlacementContext("far", spec, START, stats=stats), market)
    solved = policy._plans["far"]
    horizon = balanced.HORIZON_WORKS * 10
    assert solved.plan.steps * solved.plan.step_hours == pytest.approx(horizon, rel=0.05)
    assert solved.holds_hours == pytest.approx(horizon / 2)
    inside = PlacementContext("far", spec, START + timedelta(hours=horizon / 2 - 1))
    past = PlacementContext("far", spec, START + timedelta(hours=horizon / 2 + 1))
    assert balanced._covers(solved, inside) and not balanced._covers(solved, past)
