"""Node repair against restarting the whole gang, replayed on gang availability traces.

What ``[gang] on_node_failure`` chooses between, measured on a market: when the
market takes one node of a running gang, keep the others and replace it, or
release them all and start the gang anew. ``benchmarks/gang_repair.py`` prints
the figures; ``docs/benchmarks.md`` (section "Node repair") has them and the
assumptions below.

The market. A gang of ``n`` nodes runs in one zone, in ticks of the trace.
The trace's value ``v[i]`` is how many of a group's nodes the market lets run
in tick ``i`` (the 4-node set counts the nodes of a 4-node group still running;
the group relaunched lost nodes, which is why the value comes back up). A
larger gang's market is built from such traces by :func:`staggered_market`.

The job. It needs ``compute_hours`` of training and trains a tick only with all
``n`` nodes up and its changeover done. It checkpoints every
``checkpoint_hours`` of training, for free and at once; a checkpoint written on
the preemption notice is not modelled (it would spare every rule the same
lost training).

Assumptions, the same for every rule:

- The gang holds ``h <= n`` nodes. In a tick where ``v < h`` the market takes
  ``h - v`` of them: a loss. A loss while the gang trains or boots breaks it:
  the training since the last checkpoint is lost, and the gang is down until
  it trains again (the time to resume: from the tick the loss shows in the
  trace to the first tick that trains).
- The nodes that are left (the survivors) ran until the loss showed, so they
  are billed for the loss tick whatever the rule.
- Nodes are launched only in a tick where the market holds all ``n``
  (``v >= n``), and such a launch succeeds: the market that let the group's
  nodes come back would let a new gang start too. This favours restart, which
  needs ``n`` new nodes where keeping the survivors needs only the lost ones.
- A launch pays a changeover without training: boot (launch, boot and setup of
  a new instance) + rendezvous (the gang assembling, with its preflight) +
  restore (every rank loads the last complete checkpoint, as spotd resumes).
- A tick is billed for the nodes the gang holds in it; waiting with none costs
  nothing. Nodes boot in parallel, so a whole gang boots as fast as one node
  (the slowest of many boots is not modelled: it favours restart too).

The rules:

- ``restart``: the survivors are released after the loss tick; when the
  market holds ``n``, ``n`` nodes are launched and pay the full changeover.
- ``wait``: the survivors are kept, and billed, while they wait for the
  market; when it holds ``n`` again only the lost nodes are launched, and the
  gang pays the replacement's changeover: the new nodes' boot
  (``replace_boot_hours``, by default a whole gang's: the new node's boot is
  on the critical path either way, and the survivors, ready, wait for it) +
  rendezvous + restore (every rank, survivors too, resumes from the
  checkpoint). Should the market take survivors while they wait, fewer are
  kept (none: the launch is a whole gang's). No ``on_node_failure`` waits: the
  rule shows what waiting would cost.
- ``replace`` (spotd's ``replace`` and ``auto``): keep the survivors where the
  market holds ``n`` again in the tick after the loss (the pool still sells
  the node, so a launch at once succeeds), else release them as restart does
  (spotd's launch of the new node fails, and the gang restarts).

With the default figures every rule resumes in the same tick after every loss
(all wait for the market to hold ``n``, and pay the same changeover); what
differs is who is billed while they wait.

Time is in integer ticks: compute and changeovers round up to whole ticks,
the checkpoint interval to the nearest (at least one), the horizon down.
Every start point is one lane of numpy arrays, all stepped together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

__all__ = [
    "GangChangeover",
    "GangRepairJob",
    "GangReplay",
    "RepairRule",
    "RepairSummary",
    "cost_against",
    "draw_starts",
    "replay",
    "staggered_market",
    "summarize_replay",
]

IntArray = npt.NDArray[np.int64]

_EPS = 1e-9
_WAIT, _CHANGE, _RUN, _DONE = 0, 1, 2, 3
"""Phases of a lane: waiting for the market, in a changeover, training, finished."""


class RepairRule(StrEnum):
    """What a gang does when the market takes some of its nodes (as ``on_node_failure``)."""

    RESTART = "restart"
    """Release the survivors; launch a whole new gang once the market holds it."""
    WAIT = "wait"
    """Keep the survivors, billed while they wait for the market; launch only the lost
    nodes (no ``on_node_failure`` does this: shown for what waiting would cost)."""
    REPLACE = "replace"
    """spotd's ``replace`` and ``auto``: replace where the market holds the lost nodes in
    the next tick (a launch at once succeeds), else restart."""


@dataclass(frozen=True, slots=True)
class GangChangeover:
    """Hours a launch spends before the gang trains (see the module's assumptions).

    The defaults add up to 0.3 h for a whole gang, the simulator's changeover
    (0.2-0.3 h for a new instance in the traces' paper, which also counts the
    lost training that this model counts on its own).
    """

    boot_hours: float = 0.2
    """Launch, boot and setup of a new instance."""
    rendezvous_hours: float = 0.05
    """The gang assembling (a new rendezvous) and its preflight."""
    restore_hours: float = 0.05
    """Every rank loading the last complete checkpoint."""
    replace_boot_hours: float | None = None
    """Boot of the replacement nodes; None: ``boot_hours``."""

    @property
    def full_hours(self) -> float:
        """A whole new gang's changeover."""
        return self.boot_hours + self.rendezvous_hours + self.restore_hours

    @property
    def replace_hours(self) -> float:
        """The changeover when survivors wait for replacement nodes."""
        boot = self.boot_hours if self.replace_boot_hours is None else self.replace_boot_hours
        return boot + self.rendezvous_hours + self.restore_hours


@dataclass(frozen=True, slots=True)
class GangRepairJob:
    """One gang job, replayed from many start points."""

    nodes: int
    compute_hours: float = 24.0
    checkpoint_hours: float = 1.0
    horizon_hours: float = 7 * 24.0
    """A start that has not finished this long after it counts as unfinished."""
    changeover: GangChangeover = field(default_factory=GangChangeover)


@dataclass(frozen=True, slots=True)
class _Ticks:
    need: int
    ckpt: int
    horizon: int
    full: int
    replace: int

    @classmethod
    def of(cls, job: GangRepairJob, tick_hours: float) -> _Ticks:
        def up(hours: float) -> int:
            return math.ceil(hours / tick_hours - _EPS)

        return cls(
            need=up(job.compute_hours),
            ckpt=max(1, round(job.checkpoint_hours / tick_hours)),
            horizon=math.floor(job.horizon_hours / tick_hours + _EPS),
            full=up(job.changeover.full_hours),
            replace=up(job.changeover.replace_hours),
        )


@dataclass(frozen=True, slots=True)
class GangReplay:
    """One rule on every start point of one market."""

    rule: RepairRule
    tick_hours: float
    finish: IntArray
    """Ticks from each start to the job's end; -1 where it did not end within the horizon."""
    node_ticks: IntArray
    """Node-ticks billed per start."""
    losses: IntArray
    """Losses per start: ticks in which the market took nodes of the training or booting gang."""
    nodes_lost: IntArray
    """Nodes the market took per start (survivors taken while they wait too)."""
    resume: IntArray
    """Ticks from each loss to the first tick that trained after it, over all starts (a
    loss still open at the horizon is left out)."""


@dataclass(slots=True)
class _Lanes:
    """The state of every start point, one array element each."""

    phase: IntArray
    held: IntArray
    left: IntArray
    progress: IntArray
    since: IntArray
    waited: IntArray
    opened: IntArray
    finish: IntArray
    node_ticks: IntArray
    losses: IntArray
    nodes_lost: IntArray
    resumed: list[IntArray] = field(default_factory=list)

    @classmethod
    def new(cls, count: int) -> _Lanes:
        def z() -> IntArray:
            return np.zeros(count, dtype=np.int64)

        return cls(phase=z() + _WAIT, held=z(), left=z(), progress=z(), since=z(), waited=z(),
                   opened=z() - 1, finish=z() - 1, node_ticks=z(), losses=z(), nodes_lost=z())

    def step(self, t: int, market: IntArray, n: int, k: _Ticks, rule: RepairRule) -> None:
        """Tick ``t`` of every lane, ``market`` the value each lane sees."""
        # The survivors of a loss go after the loss tick, unless they are kept: by wait for
        # as long as it takes, by replace where the market holds the lost nodes right away.
        after = (self.phase == _WAIT) & (self.waited >= 1)
        if rule is RepairRule.RESTART:
            self.held[after] = 0
        elif rule is RepairRule.REPLACE:
            self.held[after & (market < n)] = 0
        self._lose(t, market)
        self._launch(market, n, k)
        self.node_ticks += self.held
        self._work(t, k)
        self.waited[self.phase == _WAIT] += 1

    def _lose(self, t: int, market: IntArray) -> None:
        lost = (self.phase != _DONE) & (self.held > market)
        broke = lost & (self.phase != _WAIT)
        self.losses += broke
        self.nodes_lost += np.where(lost, self.held - market, 0)
        # The gang resumes from its last checkpoint (in a changeover `since` is already 0).
        self.progress -= np.where(broke, self.since, 0)
        self.since[broke] = 0
        self.opened[broke & (self.opened < 0)] = t
        self.held[lost] = market[lost]
        self.phase[lost] = _WAIT
        self.waited[lost] = 0

    def _launch(self, market: IntArray, n: int, k: _Ticks) -> None:
        go = (self.phase == _WAIT) & (market >= n)
        # Survivors still held wait for replacements; a gang of none launches whole.
        self.left[go] = np.where(self.held[go] > 0, k.replace, k.full)
        self.held[go] = n
        self.phase[go] = _CHANGE

    def _work(self, t: int, k: _Ticks) -> None:
        changing = self.phase == _CHANGE
        busy = changing & (self.left > 0)
        self.left[busy] -= 1
        self.phase[changing & ~busy] = _RUN
        run = self.phase == _RUN
        self.progress[run] += 1
        self.since[run] += 1
        self.since[self.since >= k.ckpt] = 0
        back = run & (self.opened >= 0)
        if back.any():
            self.resumed.append(t - self.opened[back])
            self.opened[back] = -1
        done = run & (self.progress >= k.need)
        self.finish[done] = t + 1
        self.phase[done] = _DONE
        self.held[done] = 0


def replay(values: IntArray, starts: IntArray, job: GangRepairJob, rule: RepairRule,
           tick_hours: float) -> GangReplay:
    """Replay ``job`` under ``rule`` from every start tick on one market's ``values``.

    Each start runs until its job ends or ``job.horizon_hours`` pass; every
    start must leave the whole horizon inside ``values`` (:func:`draw_starts`).
    """
    k = _Ticks.of(job, tick_hours)
    at = np.asarray(starts, dtype=np.int64)
    if at.size and (int(at.min()) < 0 or int(at.max()) + k.horizon > len(values)):
        raise ValueError(f"a start leaves less than the horizon ({k.horizon} ticks) "
                         f"in the {len(values)} ticks of the market")
    lanes = _Lanes.new(at.size)
    market = np.asarray(values, dtype=np.int64)
    for t in range(k.horizon):
        if not (lanes.phase != _DONE).any():
            break
        lanes.step(t, market[at + t], job.nodes, k, rule)
    resume = np.concatenate(lanes.resumed) if lanes.resumed else np.zeros(0, dtype=np.int64)
    return GangReplay(rule, tick_hours, lanes.finish, lanes.node_ticks, lanes.losses,
                      lanes.nodes_lost, resume.astype(np.int64))


def staggered_market(values: IntArray, groups: int, offset_ticks: int) -> IntArray:
    """A market of ``groups`` groups of one zone, group ``g`` living the trace ``g *
    offset_ticks`` later: ``out[i] = sum(values[i + g * offset_ticks])``.

    A synthetic stand-in for a larger gang's market where only small groups were
    measured: an offset longer than most short dips makes the groups' single-node
    losses fall at different times, and one far shorter than the zone's long
    outages keeps those shared. The result is ``(groups - 1) * offset_ticks``
    ticks shorter than ``values``.
    """
    if groups < 1 or offset_ticks < 0:
        raise ValueError("groups must be at least 1 and the offset not negative")
    length = len(values) - (groups - 1) * offset_ticks
    if length < 1:
        raise ValueError(f"{len(values)} ticks hold no {groups} groups {offset_ticks} apart")
    src = np.asarray(values, dtype=np.int64)
    out = np.zeros(length, dtype=np.int64)
    for g in range(groups):
        out += src[g * offset_ticks:g * offset_ticks + length]
    return out


def draw_starts(length: int, horizon_ticks: int, count: int, seed: int) -> IntArray:
    """``count`` start ticks drawn uniformly (seeded) where the horizon fits, sorted."""
    span = length - horizon_ticks + 1
    if span < 1:
        raise ValueError(f"the market ({length} ticks) is shorter than the horizon "
                         f"({horizon_ticks} ticks)")
    rng = np.random.default_rng(seed)
    return np.sort(rng.integers(0, span, size=count)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class RepairSummary:
    """What the benchmark's table shows for one rule on one market (NaN where nothing
    finished or nothing was lost)."""

    rule: RepairRule
    starts: int
    finished: int
    losses: float
    """Mean per finished start, as the figures below."""
    nodes_lost: float
    resume_mean_hours: float
    resume_p50_hours: float
    resume_p90_hours: float
    """Over every loss of every start."""
    wall_hours: float
    node_hours: float
    cost: float
    """``node_hours`` times the price per node-hour."""


def summarize_replay(run: GangReplay, price_per_node_hour: float) -> RepairSummary:
    """Per-job means over the starts that finished; time to resume over every loss."""
    g = run.tick_hours
    done = run.finish >= 0
    nan = float("nan")

    def mean(values: IntArray) -> float:
        return float(values[done].mean()) if done.any() else nan

    node_hours = mean(run.node_ticks) * g

    def resume(q: float | None) -> float:
        if not run.resume.size:
            return nan
        return float(run.resume.mean() if q is None else np.percentile(run.resume, q)) * g

    return RepairSummary(
        rule=run.rule,
        starts=int(run.finish.size),
        finished=int(done.sum()),
        losses=mean(run.losses),
        nodes_lost=mean(run.nodes_lost),
        resume_mean_hours=resume(None),
        resume_p50_hours=resume(50),
        resume_p90_hours=resume(90),
        wall_hours=mean(run.finish) * g,
        node_hours=node_hours,
        cost=node_hours * price_per_node_hour,
    )


def cost_against(run: GangReplay, base: GangReplay) -> float:
    """``run``'s billed node-hours over ``base``'s, minus 1, on the starts both finished
    (NaN if none): a rule that finishes more starts is not charged for the extra ones."""
    both = (run.finish >= 0) & (base.finish >= 0)
    paid = int(base.node_ticks[both].sum())
    return int(run.node_ticks[both].sum()) / paid - 1 if paid else float("nan")
