"""``planned``: per-pool market models learnt from the past alone, and deadline plans on them.

The market models are checked directly (the past only, cached per pool and
period, wide with few observations); the policy end to end on the trace
simulator (a past decision never depends on the future; no deadline missed).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotd.core.capacity import CapacitySeries
from spotd.core.values import Pool
from spotd.simulate.adapter import PolicyAdapter
from spotd.simulate.model import run_policy
from spotd.simulate.runner import run_job
from spotd.simulate.scenario import parse_scenario
from spotd.simulate.timeline import Timeline
from spotd.simulate.world import Prepared, prepare
from spotd_policies.planned import MarketModels, PlannedPolicy, pool_model

POOL = Pool("aws", "us-east-1", "us-east-1a", "p3.2xlarge")
START = datetime(2023, 1, 1, tzinfo=UTC)
TICK_HOURS = 0.25


def series(up: list[bool] | npt.NDArray[np.bool_], step: float = TICK_HOURS) -> CapacitySeries:
    return CapacitySeries(START, step, np.asarray(up, dtype=np.bool_))


def flicker(spells: int, up_steps: int, down_steps: int) -> list[bool]:
    return ([True] * up_steps + [False] * down_steps) * spells


# -- the model ------------------------------------------------------------------------


def test_few_spells_leave_the_mean_up_spell_uncertain_and_many_pin_it_down() -> None:
    few = pool_model(POOL, series(flicker(2, 8, 4))).up_interval()
    many = pool_model(POOL, series(flicker(300, 8, 4))).up_interval()
    true_mean = 8 * TICK_HOURS
    assert few[1] / few[0] > 3.0
    assert many[1] / many[0] < 1.5
    assert many[0] < true_mean < many[1]


def test_a_pool_without_history_is_the_prior_with_a_wide_interval() -> None:
    model = pool_model(POOL, None)
    low, high = model.up_interval()
    assert model.availability is None and model.seen_hours == 0
    assert low < model.mean_up_hours < high
    assert high / low > 5.0


def test_a_model_uses_history_only_up_to_its_period_and_is_shared_within_it() -> None:
    models = MarketModels(remodel_hours=1.0)
    up = np.array(flicker(20, 6, 2), dtype=np.bool_)
    # 160 samples of 0.25 h: the present is 39.75 h after START, in the period from 39 h.
    now = START + timedelta(hours=(len(up) - 1) * TICK_HOURS)
    changed = up.copy()
    changed[-3:] = ~changed[-3:]  # the samples after 39 h differ
    first = models.pool(POOL, series(up), now)
    again = models.pool(POOL, series(changed), now)
    assert again is first
    border = round(39 / TICK_HOURS) + 1
    assert first.seen_hours == border * TICK_HOURS
    assert models.cut(series(up), now).up.tolist() == up[:border].tolist()


def test_a_later_question_never_answers_an_earlier_one() -> None:
    """The market model cached for a period comes from the history before the period: a
    job asking late in it, with more samples, leaves an earlier job the same answer a
    fresh cache gives."""
    other = Pool("aws", "us-east-1", "us-east-1b", "p3.2xlarge")
    up = np.array(flicker(12, 5, 3), dtype=np.bool_)  # 96 samples, 24 h
    late = {POOL: series(up), other: series(~up)}
    early = {p: series(s.up[:-2]) for p, s in late.items()}
    late_now = START + timedelta(hours=(len(up) - 1) * TICK_HOURS)
    early_now = late_now - timedelta(hours=2 * TICK_HOURS)
    models = MarketModels(remodel_hours=1.0)
    models.market(late, late_now)
    asked = models.market(early, early_now)
    fresh = MarketModels(remodel_hours=1.0).market(early, early_now)
    assert asked.summary() == fresh.summary()
    assert asked.down.hours.tolist() == fresh.down.hours.tolist()
    assert asked.up.hours.tolist() == fresh.up.hours.tolist()


def test_the_window_keeps_only_recent_history() -> None:
    models = MarketModels(window_hours=10.0, remodel_hours=TICK_HOURS)
    rough = flicker(10, 1, 8)  # short spells, long outages
    calm = [True] * 80
    now = START + timedelta(hours=(len(rough) + len(calm) - 1) * TICK_HOURS)
    model = models.pool(POOL, series(rough + calm), now)
    assert model.availability == 1.0
    assert model.seen_hours == 10.0


# -- on the trace simulator -------------------------------------------------------------


def _prepared(values: npt.NDArray[np.int64], *, starts: int = 1,
              within: tuple[int, int] | None = None, name: str = "j") -> Prepared:
    data = {
        "name": "tiny",
        "cost_model": "reference",
        "offerings": [
            {"trace": f"z{i}.json", "provider": "aws", "region": "us-east-1",
             "zone": f"us-east-1{'abcd'[i]}", "instance_type": "p3.2xlarge"}
            for i in range(values.shape[0])
        ],
        "jobs": [{"name": name, "compute_hours": 4, "deadline_fraction": 0.5,
                  "changeover_hours": 0.25, "starts": starts, "seed": 3}],
    }
    scenario = parse_scenario(data, source="test")
    timeline = Timeline(values=values, tick_hours=TICK_HOURS, paths=())
    return prepare(scenario, timeline, scenario.jobs[0], "test", within=within)


def variants() -> list[PlannedPolicy]:
    """The default, and one planned on the ridden pool's own spells that goes greedy until
    it has seen a few (every path of the policy)."""
    return [PlannedPolicy(), PlannedPolicy(own_prior_spells=2, min_spells=3)]


HISTORY = 48
"""Ticks of history before the job starts."""
WINDOW = 32
"""The job's deadline window in ticks (8 h of 0.25 h)."""

availability = st.lists(st.booleans(), min_size=HISTORY + WINDOW, max_size=HISTORY + WINDOW)


def _modes(policy: PlannedPolicy, values: npt.NDArray[np.int64], name: str) -> tuple[int, ...]:
    prepared = _prepared(values, within=(HISTORY, HISTORY + WINDOW), name=name)
    return run_policy(PolicyAdapter(policy, prepared), prepared.world, HISTORY, record=True).modes


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=availability, b=availability, future=availability, split=st.integers(0, WINDOW - 1))
def test_no_decision_depends_on_what_comes_after_it(
    a: list[bool], b: list[bool], future: list[bool], split: int
) -> None:
    """Two markets alike up to a decision give the same decisions up to it; and a policy
    whose caches were filled by a job on the other market decides every tick of this
    one's as a fresh policy does (the models cached per pool leak no future)."""
    past = np.array([a, b], dtype=np.int64)
    other = past.copy()
    cut = HISTORY + split + 1  # ticks up to the decision at ``split`` are shared
    other[0, cut:] = np.array(future[cut:], dtype=np.int64)
    other[1, cut:] = 1 - past[1, cut:]
    for which in range(len(variants())):
        fresh = _modes(variants()[which], past, "j")
        shared = variants()[which]
        changed = _modes(shared, other, "k")
        assert fresh[: split + 1] == changed[: split + 1]
        assert _modes(shared, past, "j") == fresh


def test_no_deadline_is_missed_on_a_few_small_markets() -> None:
    rng = np.random.default_rng(7)
    for up_share in (0.2, 0.6, 0.95):
        values = (rng.random((2, 400)) < up_share).astype(np.int64)
        # Runs of a few ticks, as real markets have, not coin flips per tick.
        values = np.repeat(values[:, :100], 4, axis=1)
        prepared = _prepared(values, starts=6)
        policies = variants()
        policies[1].name = "planned-own"
        report = run_job(prepared, policies)
        for name in ("policy:planned", "policy:planned-own"):
            run = next(r for r in report.runs if r.name == name)
            assert run.outcomes is not None
            assert not any(o.missed for o in run.outcomes), (name, up_share)
            assert all(o.finish_tick is not None for o in run.outcomes)
