"""Node repair against restarting the whole gang, on tiny hand-made traces worked out by hand.

Ticks are one hour, so tick counts and hours read the same. A gang of 4; the
trace value is how many of its nodes the market lets run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotd.simulate.gang_repair import (
    GangChangeover,
    GangRepairJob,
    GangReplay,
    RepairRule,
    cost_against,
    draw_starts,
    replay,
    staggered_market,
    summarize_replay,
)

RESTART, WAIT, REPLACE = RepairRule.RESTART, RepairRule.WAIT, RepairRule.REPLACE


def job(compute: float, ckpt: float, boot: float, *, replace_boot: float | None = None,
        horizon: float = 20, nodes: int = 4) -> GangRepairJob:
    """A job whose changeover is all boot (no rendezvous, no restore)."""
    return GangRepairJob(nodes, compute, ckpt, horizon, GangChangeover(boot, 0, 0, replace_boot))


def one(values: list[int], j: GangRepairJob, rule: RepairRule) -> GangReplay:
    return replay(np.array(values, dtype=np.int64), np.array([0]), j, rule, 1.0)


def figures(run: GangReplay) -> tuple[int, int, int, int, list[int]]:
    """finish, node-ticks, losses, nodes lost, resume ticks of a one-start run."""
    return (int(run.finish[0]), int(run.node_ticks[0]), int(run.losses[0]),
            int(run.nodes_lost[0]), run.resume.tolist())


# One node gone for 3 ticks (5, 6, 7), back at 8. Launch at 0, boot 0-1, train 2-4
# (checkpoint after tick 3), so the loss at 5 costs tick 4's work and resumes from 2 units.
ONE_NODE_OUT = [4, 4, 4, 4, 4, 3, 3, 3] + [4] * 12


def test_restart_releases_the_survivors_after_the_loss_tick() -> None:
    # Billed: 4 x 5 ticks, the 3 survivors in the loss tick, none in 6-7, 4 x 6 ticks
    # from the launch at 8 (boot 8-9, train 10-13). Down from 5 to 10: 5 ticks.
    assert figures(one(ONE_NODE_OUT, job(6, 2, 2), RESTART)) == (14, 20 + 3 + 24, 1, 1, [5])


def test_waiting_keeps_and_bills_the_survivors_and_resumes_as_fast_by_default() -> None:
    # Same times; the 3 survivors are billed in ticks 6 and 7 too: 6 node-ticks more.
    assert figures(one(ONE_NODE_OUT, job(6, 2, 2), WAIT)) == (14, 53, 1, 1, [5])


def test_a_faster_replacement_resumes_sooner() -> None:
    # The replacement boots in 1 tick (8), training from 9: resume 4, finish 13;
    # billed 20 + 3 x 3 + 4 x 5.
    run = one(ONE_NODE_OUT, job(6, 2, 2, replace_boot=1), WAIT)
    assert figures(run) == (13, 49, 1, 1, [4])
    # Restart does not use the replacement's figure.
    assert figures(one(ONE_NODE_OUT, job(6, 2, 2, replace_boot=1), RESTART)) == (
        14, 47, 1, 1, [5])


def test_replace_restarts_when_the_node_is_not_back_the_next_tick() -> None:
    j = job(6, 2, 2, replace_boot=1)
    assert figures(one(ONE_NODE_OUT, j, REPLACE)) == figures(one(ONE_NODE_OUT, j, RESTART))


def test_replace_keeps_the_survivors_when_the_node_is_back_the_next_tick() -> None:
    # Train from 2 (checkpoint every tick); the loss at 3 loses nothing. Back at 4:
    # restart boots a whole gang 4-5, trains 6-7: resume 3, finish 8, 12 + 3 + 16.
    # replace and wait keep the 3 survivors; the replacement is ready at once (no
    # boot): trains 4-5, resume 1, finish 6, 12 + 3 + 8.
    values = [4, 4, 4, 3] + [4] * 16
    j = job(3, 1, 2, replace_boot=0)
    assert figures(one(values, j, RESTART)) == (8, 31, 1, 1, [3])
    assert figures(one(values, j, REPLACE)) == (6, 23, 1, 1, [1])
    assert figures(one(values, j, WAIT)) == (6, 23, 1, 1, [1])


def test_survivors_taken_while_they_wait() -> None:
    # Loss at 3 (1 node); at 4 the market holds 1: wait's survivors drop to 1 (2 more
    # nodes lost, no new loss of the gang), restart's were released. Back at 6: boot 6,
    # train 7. wait: 12 + 3 + 1 + 1 + 8; restart: 12 + 3 + 8.
    values = [4, 4, 4, 3, 1, 2] + [4] * 14
    assert figures(one(values, job(3, 1, 1), WAIT)) == (8, 25, 1, 3, [4])
    assert figures(one(values, job(3, 1, 1), RESTART)) == (8, 23, 1, 1, [4])


def test_a_loss_during_the_boot_extends_the_same_outage() -> None:
    # Boot 0-1, train 2, loss at 3; launch at 4, boot 4-5, lost again at 5 (a second
    # loss, the same outage); launch at 6, boot 6-7, train 8-9: resume 8 - 3 = 5.
    values = [4, 4, 4, 3, 4, 3] + [4] * 14
    run = one(values, job(3, 1, 2), RESTART)
    assert figures(run) == (10, 12 + 3 + 4 + 3 + 16, 2, 2, [5])


def test_nothing_lost_without_a_loss_and_nothing_billed_while_the_market_is_short() -> None:
    # Waits 0-1 unbilled, boots 2-3, trains 4-9.
    run = one([2, 3] + [4] * 18, job(6, 1, 2), WAIT)
    assert figures(run) == (10, 32, 0, 0, [])


def test_lanes_step_together_as_one_start_each() -> None:
    values = np.array([4, 4, 3, 4, 4, 0, 4, 4, 4, 4, 4, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4],
                      dtype=np.int64)
    j = job(4, 2, 1, horizon=10)
    starts = np.array([0, 3, 5, 12], dtype=np.int64)
    for rule in RepairRule:
        together = replay(values, starts, j, rule, 1.0)
        alone = [replay(values, np.array([s]), j, rule, 1.0) for s in starts]
        assert together.finish.tolist() == [int(a.finish[0]) for a in alone]
        assert together.node_ticks.tolist() == [int(a.node_ticks[0]) for a in alone]
        assert sorted(together.resume.tolist()) == sorted(
            x for a in alone for x in a.resume.tolist())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=30, max_size=30), st.integers(0, 3))
def test_same_figures_make_the_rules_equal_in_time_and_waiting_never_cheaper(
    values: list[int], boot: int
) -> None:
    market = np.array(values, dtype=np.int64)
    starts = np.arange(0, 11, dtype=np.int64)
    j = job(4, 2, boot, horizon=20)
    runs = {rule: replay(market, starts, j, rule, 1.0) for rule in RepairRule}
    for rule in (WAIT, REPLACE):
        assert runs[rule].finish.tolist() == runs[RESTART].finish.tolist()
        assert sorted(runs[rule].resume.tolist()) == sorted(runs[RESTART].resume.tolist())
    assert (runs[WAIT].node_ticks >= runs[RESTART].node_ticks).all()
    assert runs[REPLACE].node_ticks.tolist() == runs[RESTART].node_ticks.tolist()


def test_unfinished_starts_are_left_out_of_the_per_job_figures() -> None:
    # Start 0: boot 0, train 1-3, done at 4, 16 node-ticks; start 10: the market never
    # holds the gang within the 10-tick horizon.
    values = np.array([4] * 10 + [0] * 10, dtype=np.int64)
    j = job(3, 1, 1, horizon=10)
    run = replay(values, np.array([0, 10]), j, RESTART, 1.0)
    s = summarize_replay(run, 2.0)
    assert (s.starts, s.finished) == (2, 1)
    assert (s.wall_hours, s.node_hours, s.cost, s.losses) == (4.0, 16.0, 32.0, 0.0)
    assert math.isnan(s.resume_mean_hours) and math.isnan(s.resume_p90_hours)


def test_summary_in_hours_and_dollars() -> None:
    s = summarize_replay(one(ONE_NODE_OUT, job(6, 2, 2), WAIT), 0.5)
    assert (s.starts, s.finished, s.losses, s.nodes_lost) == (1, 1, 1.0, 1.0)
    assert (s.wall_hours, s.node_hours, s.cost) == (14.0, 53.0, 26.5)
    assert (s.resume_mean_hours, s.resume_p50_hours, s.resume_p90_hours) == (5.0, 5.0, 5.0)
    # Half-hour ticks: the same trace is half as long in hours.
    half = summarize_replay(replay(np.array(ONE_NODE_OUT, dtype=np.int64), np.array([0]),
                                   job(3, 1, 1, horizon=10), WAIT, 0.5), 1.0)
    assert (half.wall_hours, half.node_hours, half.resume_mean_hours) == (7.0, 26.5, 2.5)


def test_cost_against_compares_the_starts_both_finished() -> None:
    base = GangReplay(RESTART, 1.0, np.array([5, -1, 7]), np.array([10, 99, 20]),
                      np.zeros(3, np.int64), np.zeros(3, np.int64), np.zeros(0, np.int64))
    run = GangReplay(WAIT, 1.0, np.array([5, 6, -1]), np.array([12, 30, 40]),
                     np.zeros(3, np.int64), np.zeros(3, np.int64), np.zeros(0, np.int64))
    assert cost_against(run, base) == pytest.approx(12 / 10 - 1)


def test_staggered_market_sums_groups_offset_along_the_trace() -> None:
    values = np.array([4, 3, 4, 4, 2, 4], dtype=np.int64)
    assert staggered_market(values, 2, 1).tolist() == [7, 7, 8, 6, 6]
    assert staggered_market(values, 3, 2).tolist() == [4 + 4 + 2, 3 + 4 + 4]
    assert staggered_market(values, 1, 5).tolist() == values.tolist()
    with pytest.raises(ValueError, match="no 4 groups"):
        staggered_market(values, 4, 2)


def test_starts_leave_the_whole_horizon_in_the_market() -> None:
    starts = draw_starts(100, 30, 500, seed=3)
    assert starts.min() >= 0 and starts.max() <= 70
    assert starts.tolist() == sorted(starts.tolist())
    assert draw_starts(100, 30, 500, seed=3).tolist() == starts.tolist()
    with pytest.raises(ValueError, match="shorter than the horizon"):
        draw_starts(10, 11, 1, seed=0)
    with pytest.raises(ValueError, match="less than the horizon"):
        replay(np.full(20, 4, dtype=np.int64), np.array([5]), job(3, 1, 1, horizon=16),
               RESTART, 1.0)
