"""The simulator's discrete model on tiny hand-made traces: engine, baselines, exact DP."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from spotd.simulate.baselines import Greedy, OnDemandOnly, UniformProgress
from spotd.simulate.model import IDLE, RunState, World, run_policy
from spotd.simulate.omniscient import omniscient_costs


def tiny_world(
    rows: list[list[int]],
    *,
    need: int,
    window: int,
    changeover: int,
    spot: tuple[float, ...] | None = None,
    od: tuple[float, ...] | None = None,
    rate: tuple[int, ...] | None = None,
    provider: tuple[int, ...] | None = None,
    egress: tuple[float, ...] = (0.0,),
    ckpt_every: int | None = None,
    notice_saves: tuple[bool, ...] | None = None,
) -> World:
    """A world whose offering z has spot in tick i where rows[z][i] is 1."""
    avail = np.array(rows, dtype=bool)
    n = len(rows)
    return World(
        avail=avail,
        labels=tuple(f"z{i}" for i in range(n)),
        tick_hours=1.0,
        spot_cost=spot or (1.0,) * n,
        od_cost=od or (3.0,) * n,
        rate=rate or (1,) * n,
        provider=provider or (0,) * n,
        egress=egress,
        need=need,
        window=window,
        changeover=changeover,
        ckpt_every=ckpt_every,
        notice_saves=notice_saves or (False,) * n,
        home=0,
        eligible=tuple(range(n)),
        compute_hours=float(need),
        rows=avail.T.tolist(),
    )


class Script:
    """Plays a fixed list of modes, one per tick."""

    name = "script"

    def __init__(self, actions: tuple[int, ...]) -> None:
        self.actions = actions

    def reset(self, world: World, start: int) -> None:
        pass

    def act(self, state: RunState) -> int:
        return self.actions[state.t]


def brute_force(world: World) -> float:
    """The cheapest on-time finish over every sequence of modes (inf if none)."""
    modes = [IDLE, *range(2 * world.n)]
    best = float("inf")
    for actions in itertools.product(modes, repeat=world.window):
        out = run_policy(Script(actions), world, 0)
        if not out.missed:
            best = min(best, out.cost)
    return best


# --- the engine and the baselines, against costs worked out by hand --------------------


def test_on_demand_only_pays_changeover_and_compute() -> None:
    w = tiny_world([[0] * 6], need=3, window=6, changeover=1)
    out = run_policy(OnDemandOnly(), w, 0)
    assert (out.cost, out.missed, out.finish_tick, out.launches) == (12.0, False, 4, 1)
    assert out.goodput == pytest.approx(3 / 4)


def test_greedy_rides_spot_from_the_start() -> None:
    w = tiny_world([[1] * 6], need=3, window=6, changeover=1)
    out = run_policy(Greedy(any_zone=False), w, 0)
    assert (out.cost, out.spot_ticks, out.od_ticks) == (4.0, 4, 0)


def test_greedy_waits_for_spot_while_slack_allows() -> None:
    w = tiny_world([[0, 0, 1, 1, 1, 1, 1, 1]], need=3, window=8, changeover=1)
    out = run_policy(Greedy(any_zone=False), w, 0, record=True)
    assert out.modes == (IDLE, IDLE, 0, 0, 0, 0)
    assert out.cost == 4.0


def test_greedy_safety_net_switches_to_on_demand_in_time() -> None:
    # slack 7 - t - 3 drops under 2d = 2 at t = 3: on-demand from there, done at the deadline.
    w = tiny_world([[0] * 7], need=3, window=7, changeover=1)
    out = run_policy(Greedy(any_zone=False), w, 0, record=True)
    assert out.modes == (IDLE, IDLE, IDLE, 1, 1, 1, 1)
    assert (out.cost, out.missed, out.finish_tick) == (12.0, False, 7)


def test_greedy_after_a_preemption_loses_only_the_changeover() -> None:
    w = tiny_world([[1, 1, 1, 0, 1, 1, 1, 1, 1, 1]], need=4, window=10, changeover=1)
    out = run_policy(Greedy(any_zone=False), w, 0, record=True)
    # co, +1, +1 | preempted | co, +1, +1 -> done at tick 7
    assert out.modes == (0, 0, 0, IDLE, 0, 0, 0)
    assert (out.cost, out.preemptions, out.launches) == (6.0, 1, 2)


def test_uniform_progress_catches_up_on_demand_and_keeps_hysteresis() -> None:
    # ep(t) = t/2. t=1: behind -> on-demand; rule 3 keeps it until cp >= ep(t+2),
    # which never happens before the job is done, even though spot comes at t=2.
    w = tiny_world([[0, 0, 1, 1, 1, 1, 1, 1]], need=4, window=8, changeover=1)
    out = run_policy(UniformProgress(any_zone=False), w, 0, record=True)
    assert out.modes == (IDLE, 1, 1, 1, 1, 1)
    assert out.cost == 15.0
    greedy = run_policy(Greedy(any_zone=False), w, 0)
    assert greedy.cost == 5.0  # waits until t=2 (slack 2 = 2d), then spot to the end


def test_uniform_progress_leaves_on_demand_once_ahead() -> None:
    w = tiny_world([[0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]], need=4, window=12, changeover=1)
    out = run_policy(UniformProgress(any_zone=False), w, 0, record=True)
    # ep(t) = t/3: behind at t=1 -> OD (co at 1, +1 at 2, 3); at t=4 cp=2 >= ep(6)=2: leave.
    # Idle while cp >= ep(t) (t <= 6); spot at t=6 (co), +1 at 7 and 8 -> done at 9.
    assert out.modes == (IDLE, 1, 1, 1, IDLE, IDLE, 0, 0, 0)
    assert out.cost == 3 * 3.0 + 3 * 1.0


def test_any_zone_moves_to_another_zone_on_preemption() -> None:
    rows = [[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]]
    w = tiny_world(rows, need=3, window=8, changeover=1)
    one = run_policy(Greedy(any_zone=False), w, 0, record=True)
    anyz = run_policy(Greedy(any_zone=True), w, 0, record=True)
    assert anyz.modes == (0, 0, 1, 1, 1)
    assert anyz.cost == 5.0
    assert one.cost > anyz.cost


def test_spot_launch_without_capacity_is_an_idle_tick() -> None:
    w = tiny_world([[0, 1, 1, 1]], need=2, window=4, changeover=1)
    out = run_policy(Script((0, 0, 0, 0)), w, 0, record=True)
    assert out.modes == (IDLE, 0, 0, 0)
    assert (out.cost, out.launches) == (3.0, 1)


def test_checkpoint_loss_in_the_full_model() -> None:
    # Checkpoint every 2 productive ticks; preempted after 3 of them: 1 is lost.
    w = tiny_world([[1, 1, 1, 1, 0, 1, 1, 1, 1]], need=4, window=9, changeover=1, ckpt_every=2)
    out = run_policy(Script((0,) * 9), w, 0, record=True)
    assert out.progress[:5] == (0, 1, 2, 3, 2)
    assert out.finish_tick == 8
    # paid: 4 ticks, then 3 after the idle one; productive 5, of which 1 was lost
    assert out.goodput == pytest.approx((5 - 1) / 7)


def test_a_checkpoint_on_the_notice_loses_nothing() -> None:
    """The same preemption as above where the offering's notice holds the job's checkpoint:
    no progress is lost, only the restart's changeover."""
    w = tiny_world([[1, 1, 1, 1, 0, 1, 1, 1, 1]], need=4, window=9, changeover=1, ckpt_every=2,
                   notice_saves=(True,))
    out = run_policy(Script((0,) * 9), w, 0, record=True)
    assert out.progress[:5] == (0, 1, 2, 3, 3)
    assert out.finish_tick == 7
    assert (out.preemptions, out.goodput) == (1, pytest.approx(4 / 6))


def test_egress_is_paid_when_the_checkpoint_changes_provider() -> None:
    w = tiny_world([[1, 0, 0], [1, 1, 1]], need=2, window=3, changeover=0,
                   provider=(0, 1), egress=(5.0, 7.0))
    out = run_policy(Script((0, 1, 1)), w, 0)
    assert (out.cost, out.finish_tick) == (2.0 + 5.0, 2)


# --- the omniscient DP ------------------------------------------------------------------


CASES = [
    dict(rows=[[1, 0, 1, 1, 0, 1]], need=3, window=6, changeover=1),
    dict(rows=[[0, 1, 1, 0, 1, 1, 1]], need=3, window=7, changeover=2),
    dict(rows=[[1, 0, 1, 0, 1, 1], [0, 1, 1, 1, 0, 0]], need=3, window=6, changeover=1),
    dict(rows=[[1, 1, 0, 1, 1, 0], [0, 1, 1, 1, 1, 1]], need=2, window=6, changeover=0),
    dict(rows=[[1, 0, 1, 1, 1, 0], [0, 1, 1, 0, 1, 1]], need=4, window=6, changeover=1,
         rate=(2, 1), spot=(1.5, 1.0), od=(4.0, 3.0)),
    dict(rows=[[1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 1, 0]], need=3, window=6, changeover=1,
         provider=(0, 1), egress=(0.7, 2.5)),
]


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_dp_agrees_with_brute_force(case: dict[str, object]) -> None:
    w = tiny_world(**case)  # type: ignore[arg-type]
    assert omniscient_costs(w, [0])[0] == pytest.approx(brute_force(w))


def test_dp_is_a_lower_bound_when_checkpoints_lose_work() -> None:
    w = tiny_world([[1, 1, 1, 0, 1, 1, 1]], need=4, window=7, changeover=1, ckpt_every=2)
    assert omniscient_costs(w, [0])[0] <= brute_force(w) + 1e-9


def test_dp_solves_many_start_points_at_once() -> None:
    rng = np.random.default_rng(3)
    rows = rng.integers(0, 2, size=(2, 30)).tolist()
    w = tiny_world(rows, need=3, window=6, changeover=1)
    starts = list(range(0, 24, 3))
    together = omniscient_costs(w, starts)
    alone = [omniscient_costs(w, [s])[0] for s in starts]
    assert together.tolist() == pytest.approx(alone)


def test_dp_says_inf_when_nothing_finishes_in_time() -> None:
    w = tiny_world([[0, 0, 0]], need=3, window=3, changeover=1)
    assert omniscient_costs(w, [0])[0] == float("inf")


def test_safety_nets_never_miss_and_never_beat_the_dp() -> None:
    rand = random.Random(7)
    for _ in range(150):
        n = rand.choice((1, 2))
        need, d = rand.randint(2, 6), rand.randint(0, 2)
        window = need + d + rand.randint(0, 6)
        length = window + 5
        p = rand.random()
        rows = [[int(rand.random() < p) for _ in range(length)] for _ in range(n)]
        w = tiny_world(rows, need=need, window=window, changeover=d)
        starts = list(range(6))
        opt = omniscient_costs(w, starts)
        for policy in (OnDemandOnly(), Greedy(False), Greedy(True), UniformProgress(False),
                       UniformProgress(True)):
            for s, best in zip(starts, opt, strict=True):
                out = run_policy(policy, w, s)
                assert not out.missed, (policy.name, rows, need, d, window, s)
                assert out.cost >= best - 1e-9, (policy.name, rows, s)
