"""What runs on an in-process simulated node: spotd's agent and the job, as one workload.

A node of :class:`~spotd_sim.inprocess.InProcessSimProvider` starts no
process. Once it has booted it hands the moments of a test's clock to a
:class:`Workload`, which stands for the agent and the job together: it
reports as the agent does (heartbeats with the job's progress, the notice,
the exit; join and preflight for a gang) through a :class:`ReportSink`, and
writes checkpoints where the engine looks for them (:mod:`spotd.checkpoints`)
and the exit beside them (:mod:`spotd.exits`), so a resumed attempt starts
from the last complete one.

:class:`TrainingWorkload` is the default: a job of a fixed amount of work done
in steps, checkpointing every so many steps, at its end and at the first step
boundary after a preemption notice, as ``examples/train_tiny.py`` does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from spotd import checkpoints
from spotd.core.agent_wire import (
    ExitReport,
    HeartbeatReport,
    JoinReport,
    NoticeReport,
    PreflightCheck,
    PreflightFigures,
    PreflightReport,
)
from spotd.core.errors import CheckpointError
from spotd.exits import KeptExit, keep_exit

EXIT_STOPPED = 143
"""The job's exit when it stops on a signal (128 + SIGTERM), as a shell reports it."""

STATE_FILE = "state.json"
"""The one file of a :class:`TrainingWorkload` checkpoint, before its marker."""

_JOB_PORT = 29500
"""The ports a gang node says it has free (job, preflight): torch's default and the next."""

_STEP_FOLDER = re.compile(r"step-(\d+)/*$")


class ReportSink(Protocol):
    """Where a node's agent reports go, one method per report.

    :class:`spotd.engine.reports.StoreReports` has this shape: a test hands the
    provider one over its store, and the engine reads the reports as it reads
    those the daemon's agent routes keep.
    """

    def heartbeat(self, report: HeartbeatReport) -> None:
        """The agent is alive; the job's progress."""
        ...

    def join(self, report: JoinReport) -> object:
        """The node joins its gang (its answer, a roster or a wait, is not read)."""
        ...

    def preflight(self, report: PreflightReport) -> None:
        """The gang's preflight ended on this node."""
        ...

    def notice(self, report: NoticeReport) -> None:
        """The provider takes the node back."""
        ...

    def exited(self, report: ExitReport) -> None:
        """The job ended on this node."""
        ...


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a workload knows of its node."""

    instance_id: str
    provider: str
    address: str
    env: Mapping[str, str]
    """The launch request's environment, with ``SPOTD_NODE_RANK`` and ``SPOTD_INSTANCE_ID``."""
    reports: ReportSink | None = None
    """Where its reports go; None: nowhere, as on a node no daemon hears."""


@dataclass(frozen=True, slots=True)
class WorkloadExit:
    """How and when the job ended by itself."""

    code: int
    at: datetime


class Workload(Protocol):
    """The agent and the job of one node, moved on by its node only.

    The node calls :meth:`start` once, when it has booted, then :meth:`advance`
    with moments that never go back, :meth:`notice` at most once, and at most
    one of :meth:`stop` and :meth:`kill`; nothing after the workload ended.
    """

    def start(self, at: datetime) -> None:
        """The job's command starts at ``at``."""
        ...

    def advance(self, to: datetime) -> WorkloadExit | None:
        """Run up to ``to``; the exit when the job ended by then (at or before ``to``)."""
        ...

    def notice(self, at: datetime, deadline: datetime) -> None:
        """The provider takes the node back at ``deadline`` (what SIGTERM tells a job)."""
        ...

    def stop_with_gang(self, at: datetime) -> None:
        """Another node of its gang is going: the job stops at its next step, checkpointed,
        as every rank of ``spotd.train`` agrees to (its node had no notice itself)."""
        ...

    def stop(self, at: datetime) -> int:
        """The node is terminated at ``at``: the job's exit code as it stops."""
        ...

    def kill(self, at: datetime) -> None:
        """The node is powered off at ``at``: no word from its agent any more."""
        ...

    def output(self) -> str:
        """What the job printed so far."""
        ...


WorkloadFactory = Callable[[NodeInfo], Workload]
"""Makes the workload of a node at its launch; a ValueError refuses the launch."""


@dataclass(frozen=True, slots=True)
class TrainingPlan:
    """What a :class:`TrainingWorkload` does, in simulated seconds.

    A node's environment may say otherwise: ``SPOTD_SIM_WORK_HOURS``,
    ``SPOTD_SIM_STEP_SECONDS``, ``SPOTD_SIM_EXIT_CODE`` (a job's ``[env]``), and
    ``SPOTD_CHECKPOINT_INTERVAL_SECONDS`` (what the engine tells every node).
    """

    work_hours: float = 1.0
    """Compute time the whole job needs, over all its attempts."""
    step_seconds: float = 60.0
    heartbeat_seconds: float = 300.0
    checkpoint_seconds: float = 1800.0
    """Time between two checkpoints, when the node is told none."""
    exit_code: int = 0
    """The job's exit once its work is done."""

    def __post_init__(self) -> None:
        if min(self.work_hours, self.step_seconds, self.heartbeat_seconds,
               self.checkpoint_seconds) <= 0:  # fmt: skip
            raise ValueError(f"a training plan's times must be positive: {self}")

    def for_node(self, env: Mapping[str, str]) -> TrainingPlan:
        """This plan with what ``env`` says instead (ValueError for a value that is no number)."""

        def number(variable: str, default: float) -> float:
            value = env.get(variable, "").strip()
            return float(value) if value else default

        code = env.get("SPOTD_SIM_EXIT_CODE", "").strip()
        return replace(
            self,
            work_hours=number("SPOTD_SIM_WORK_HOURS", self.work_hours),
            step_seconds=number("SPOTD_SIM_STEP_SECONDS", self.step_seconds),
            checkpoint_seconds=number("SPOTD_CHECKPOINT_INTERVAL_SECONDS", self.checkpoint_seconds),
            exit_code=int(code) if code else self.exit_code,
        )

    @property
    def total_steps(self) -> int:
        """Steps the whole work takes."""
        return max(1, math.ceil(self.work_hours * 3600 / self.step_seconds))

    @property
    def checkpoint_every(self) -> int:
        """Steps between two checkpoints."""
        return max(1, round(self.checkpoint_seconds / self.step_seconds))


class TrainingWorkload:
    """A training job of :class:`TrainingPlan` under spotd's agent, on simulated time.

    It steps from the last complete checkpoint (``SPOTD_RESUME_FROM``, else the
    latest under ``SPOTD_CHECKPOINT_URI``); rank 0 writes a checkpoint every
    ``checkpoint_every`` steps, at the end, and at the first step boundary
    after a notice or when stopped, then exits 143 (0 with the last step done).
    A step the node is killed in is lost. Reports need ``SPOTD_JOB_ID`` and
    ``SPOTD_ATTEMPT``: without them it speaks to no one. A gang's node joins and
    passes a preflight that measures nothing as it starts, without waiting for
    the others: the nodes of one launch boot together.
    """

    def __init__(self, node: NodeInfo, plan: TrainingPlan) -> None:
        self._node = node
        self._plan = plan.for_node(node.env)
        self._speaker = _speaker(node)
        self._uri = node.env.get("SPOTD_CHECKPOINT_URI", "")
        self._rank0 = node.env.get("SPOTD_NODE_RANK", "0") == "0"
        self._step = 0
        self._saved = -1
        self._checkpoint: str | None = None
        self._step_end: datetime | None = None
        self._next_beat: datetime | None = None
        self._notice: NoticeReport | None = None
        self._noticed = False
        self._gang_stops = False
        self._exit: WorkloadExit | None = None
        self._lines: list[str] = []

    @classmethod
    def factory(cls, plan: TrainingPlan | None = None) -> WorkloadFactory:
        """Makes a TrainingWorkload of ``plan`` (the defaults if None) for each node."""
        chosen = plan or TrainingPlan()
        return lambda node: cls(node, chosen)

    @property
    def plan(self) -> TrainingPlan:
        """The plan this node follows (its environment applied)."""
        return self._plan

    # -- Workload ---------------------------------------------------------------

    def start(self, at: datetime) -> None:
        env = self._node.env
        self._say(at, f"job {env.get('SPOTD_JOB_ID', '?')} attempt {env.get('SPOTD_ATTEMPT', '?')} "
                      f"on {self._node.instance_id}: {self._plan.total_steps} steps")  # fmt: skip
        self._step = self._saved = self._resumed(at)
        self._join(at)
        self._step_end = at + timedelta(seconds=self._plan.step_seconds)
        self._next_beat = at + timedelta(seconds=self._plan.heartbeat_seconds)
        self._beat(at)
        if self._step >= self._plan.total_steps:
            self._say(at, "nothing left to do")
            self._end(self._plan.exit_code, at)

    def advance(self, to: datetime) -> WorkloadExit | None:
        while self._exit is None:
            assert self._step_end is not None and self._next_beat is not None, "not started"
            if min(self._step_end, self._next_beat) > to:
                break
            if self._step_end <= self._next_beat:
                self._step_done(self._step_end)
            else:
                self._beat(self._next_beat)
                self._next_beat += timedelta(seconds=self._plan.heartbeat_seconds)
        return self._exit

    def notice(self, at: datetime, deadline: datetime) -> None:
        self._noticed = True
        self._say(at, f"preemption notice: the node goes at {deadline:%H:%M:%S}")
        if self._speaker is not None:
            report = NoticeReport(kind="preemption", deadline=deadline, at=at,
                                  detail="simulated market reclaims the node",
                                  **self._speaker)  # fmt: skip
            self._notice = report
            self._send(lambda sink: sink.notice(report))

    def stop_with_gang(self, at: datetime) -> None:
        if not self._gang_stops and self._exit is None:
            self._gang_stops = True
            self._say(at, "another node of the gang is going: stopping with it")

    def stop(self, at: datetime) -> int:
        if self._exit is not None:
            return self._exit.code
        self._save(at)
        self._say(at, f"stopped at step {self._step}")
        self._end(EXIT_STOPPED, at, stopped=True)
        return EXIT_STOPPED

    def kill(self, at: datetime) -> None:
        self._say(at, f"killed at step {self._step}")
        self._exit = WorkloadExit(-9, at)

    def output(self) -> str:
        return "".join(f"{line}\n" for line in self._lines)

    # -- the job ----------------------------------------------------------------

    def _step_done(self, at: datetime) -> None:
        self._step += 1
        self._step_end = at + timedelta(seconds=self._plan.step_seconds)
        done = self._step >= self._plan.total_steps
        stopping = self._noticed or self._gang_stops
        if done or stopping or self._step % self._plan.checkpoint_every == 0:
            self._save(at)
        if done:
            self._say(at, f"done: {self._step} steps")
            self._end(self._plan.exit_code, at, stopped=self._noticed)
        elif stopping:
            self._say(at, f"interrupted at step {self._step}")
            self._end(EXIT_STOPPED, at, stopped=True)

    def _resumed(self, at: datetime) -> int:
        """The step of the checkpoint the job resumes from; 0 for a fresh start."""
        source = self._node.env.get("SPOTD_RESUME_FROM", "")
        if not source and self._uri:
            try:
                latest = checkpoints.latest_complete(self._uri)
            except CheckpointError as exc:
                self._say(at, f"cannot list checkpoints: {exc}")
                latest = None
            source = latest.uri if latest is not None else ""
        found = _STEP_FOLDER.search(source)
        if found is None:
            self._say(at, "fresh start" if not source else f"not a checkpoint: {source}")
            return 0
        self._checkpoint = source
        self._say(at, f"resumed from step {int(found.group(1))}")
        return int(found.group(1))

    def _save(self, at: datetime) -> None:
        """Rank 0 writes the step reached as a complete checkpoint (once per step)."""
        if not self._rank0 or not self._uri or self._step <= self._saved:
            return
        folder = checkpoints.join(self._uri, checkpoints.checkpoint_name(self._step))
        body = f'{{"step": {self._step}, "total_steps": {self._plan.total_steps}}}'
        try:
            checkpoints.write_bytes(checkpoints.join(folder, STATE_FILE), body.encode())
            checkpoints.mark_complete(folder)
        except CheckpointError as exc:
            self._say(at, f"checkpoint of step {self._step} failed: {exc}")
            return
        self._saved, self._checkpoint = self._step, folder
        self._say(at, f"checkpoint: {folder}")

    def _end(self, code: int, at: datetime, *, stopped: bool = False) -> None:
        """The job ended: the agent keeps the exit beside the checkpoints, then reports it."""
        self._exit = WorkloadExit(code, at)
        if self._speaker is None:
            return
        report = ExitReport(exit_code=code, at=at, **self._speaker)
        if self._uri:
            try:
                keep_exit(self._uri, KeptExit(exit=report, notice=self._notice, stopped=stopped))
            except CheckpointError as exc:
                self._say(at, f"cannot keep the exit: {exc}")
        self._send(lambda sink: sink.exited(report))

    # -- the agent --------------------------------------------------------------

    def _beat(self, at: datetime) -> None:
        if self._speaker is None:
            return
        progress: dict[str, object] = {}
        if self._rank0:  # the job writes its progress from rank 0 only
            progress = {"step": self._step, "total_steps": self._plan.total_steps,
                        "checkpoint": self._checkpoint}  # fmt: skip
        report = HeartbeatReport(at=at, **progress, **self._speaker)
        self._send(lambda sink: sink.heartbeat(report))

    def _join(self, at: datetime) -> None:
        """Join the gang and pass preflight at once, as a daemon that asked for a gang
        (``SPOTD_RDZV_ID``) hears from every node before the job starts."""
        env = self._node.env
        if self._speaker is None or not env.get("SPOTD_RDZV_ID"):
            return
        port = int(env.get("SPOTD_MASTER_PORT") or _JOB_PORT)
        address = self._node.address or "127.0.0.1"
        join = JoinReport(address=address, ports=(port, port + 1), at=at, **self._speaker)
        self._send(lambda sink: sink.join(join))
        why = "an in-process simulated node has no fabric or GPU to measure"
        figures = PreflightFigures(
            passed=True, backend="in-process", world_size=int(env.get("SPOTD_NUM_NODES") or 1),
            checks=(PreflightCheck(name="preflight", ok=True, skipped=True, detail=why),),
        )  # fmt: skip
        report = PreflightReport(figures=figures, at=at, **self._speaker)
        self._send(lambda sink: sink.preflight(report))

    def _send(self, deliver: Callable[[ReportSink], object]) -> None:
        if self._node.reports is not None:
            deliver(self._node.reports)

    def _say(self, at: datetime, line: str) -> None:
        self._lines.append(f"{at:%Y-%m-%d %H:%M:%S} {line}")


def _speaker(node: NodeInfo) -> dict[str, object] | None:
    """Who the node's reports come from; None without a job id and attempt."""
    job_id, attempt = node.env.get("SPOTD_JOB_ID", ""), node.env.get("SPOTD_ATTEMPT", "")
    if not job_id or not attempt.isdigit():
        return None
    return {"job_id": job_id, "attempt": int(attempt), "instance_id": node.instance_id,
            "provider": node.provider}  # fmt: skip
