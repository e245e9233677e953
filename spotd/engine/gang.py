"""A multi-node attempt as a gang: who joined, the roster, and what preflight said.

Every node's agent joins its gang when it boots (``POST /v1/agent/join`` with
its address and two free ports). The daemon hands out the roster only once
every node of the attempt has joined and the launch's instance ids are
recorded, so no job ever starts on a partial gang. Ranks follow the order of
the attempt's instance ids, which the launch fixed: they are stable for the
whole attempt, whichever node asks first or asks again.

Pure functions over the store's records; the engine and the agent routes
both use them, so they judge a gang alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from spotd.core.agent_wire import (
    PREFLIGHT_PYTHON,
    PREFLIGHT_TORCH,
    ExitPhase,
    PreflightCheckName,
    PreflightFailure,
    PreflightFigures,
    Roster,
    Waiting,
)
from spotd.core.fabric_env import default_min_busbw_gbps
from spotd.core.spec import JobSpec
from spotd.core.values import AttemptRecord, InstanceReport, Offering, attempt_reports


def roster_for(
    attempt: AttemptRecord, reports: Mapping[str, InstanceReport], instance_id: str
) -> Roster | Waiting:
    """The roster as ``instance_id`` gets it, or how many have joined so far.

    ``reports`` are the attempt's own (:func:`attempt_reports`). An instance
    that is not one of the attempt's recorded ids waits: its launch has not
    been recorded yet, or it is not part of this gang.
    """
    joined = [i for i in attempt.instance_ids if reports.get(i, _NONE).address]
    if instance_id not in attempt.instance_ids or len(joined) < attempt.nodes:
        return Waiting(joined=len(joined), nodes=attempt.nodes)
    addresses = tuple(str(reports[i].address) for i in attempt.instance_ids)
    master = reports[attempt.instance_ids[0]]
    job_port, preflight_port = _ports(master.ports)
    return Roster(
        rank=attempt.instance_ids.index(instance_id),
        nodes=attempt.nodes,
        addresses=addresses,
        master_addr=addresses[0],
        master_port=job_port,
        preflight_port=preflight_port,
        rdzv_id=attempt.client_token,
    )


JOB_CHECKS = frozenset({PreflightCheckName.CHECKPOINT})
"""Preflight checks whose failure is the job's, not the pool's: another pool would
fail them alike (the nodes cannot write where the job checkpoints)."""
JOB_FAILURES = frozenset({
    PreflightFailure.CHECKPOINT_UNWRITABLE,
    PreflightFailure.PYTHON_MISSING,
    PreflightFailure.TORCH_MISSING,
})  # fmt: skip
"""Why a check fails when the job, not the pool, is at fault: its checkpoint location,
an interpreter its spec names or its environment lacks, torch not installed in it.
Those come with the job (its image, its setup); a torch that is installed but does not
import, or does not see the GPUs, may be the node's driver, and tries another pool."""


@dataclass(frozen=True, slots=True)
class GangState:
    """What the agents of one attempt have said so far."""

    joined: int
    started: int
    """Nodes whose agent passed preflight and went on to start the job's command."""
    preflight: PreflightFigures | None
    """The gang's preflight verdict: a failed one if any node reported failure,
    else a passed one once any node reported; None before any did."""
    gave_up: ExitPhase | None = None
    """An agent ended before the command (a failed setup, no gang, or a failed
    preflight whose figures may not have reached the daemon); None when none did."""
    setup_failure: InstanceReport | None = None
    """The report of a node whose setup failed (its exit code and output tail)."""

    def assembled(self, nodes: int) -> bool:
        """Every node joined and passed preflight."""
        return self.joined >= nodes and self.started >= nodes

    @property
    def preflight_failed(self) -> bool:
        """The gang's preflight failed, as reported or as an agent's exit said."""
        failed = self.preflight is not None and not self.preflight.passed
        return failed or self.gave_up == "preflight"

    @property
    def job_at_fault(self) -> bool:
        """The failed preflight failed a check that any pool would fail alike."""
        figures = self.preflight
        if figures is None or figures.passed:
            return False
        # The verdict's check may be another node's (shared through the gang), so it
        # counts beside this node's own.
        if figures.failed_check is not None and job_failure(
            figures.failed_check, figures.failed_reason
        ):
            return True
        return any(not c.ok and job_failure(c.name, c.reason) for c in figures.checks)


def job_failure(check: str | None, reason: PreflightFailure | None) -> bool:
    """Whether a failed ``check`` (failed for ``reason``) is the job's, not the pool's.
    By the reason; by the check's name for figures an older agent sent without one."""
    return reason in JOB_FAILURES if reason is not None else check in JOB_CHECKS


def gang_state(attempt: AttemptRecord, reports: Sequence[InstanceReport]) -> GangState:
    """The gang of ``attempt`` as its agents' reports describe it."""
    own = attempt_reports(attempt, reports).values()
    figures = [f for f in (preflight_of(r) for r in own) if f is not None]
    # A verdict that names the failing node first: the nodes waiting for it can only say
    # that they timed out.
    failed = sorted((f for f in figures if not f.passed), key=lambda f: f.failed_rank is None)
    phases = {r.exit_phase for r in own}
    # A setup failure comes first: its node never joined, which is no verdict on the gang.
    gave_up = next((p for p in _GAVE_UP if p in phases), None)
    return GangState(
        joined=sum(1 for r in own if r.address),
        started=sum(1 for r in own if r.command_at is not None),
        preflight=failed[0] if failed else (figures[0] if figures else None),
        gave_up=gave_up,
        setup_failure=next((r for r in own if r.exit_phase == "setup"), None),
    )


_GAVE_UP: tuple[ExitPhase, ...] = ("setup", "preflight", "rendezvous")


def preflight_of(report: InstanceReport) -> PreflightFigures | None:
    """The preflight figures a node reported, None when it reported none (or garbage)."""
    if not report.preflight:
        return None
    try:
        return PreflightFigures.model_validate_json(report.preflight)
    except ValidationError:
        return None


def assembly_seconds(spec: JobSpec) -> float:
    """Real seconds from launch a gang may take to boot, join and pass preflight."""
    preflight = spec.preflight.timeout.total_seconds() if spec.preflight.enabled else 0.0
    return spec.gang.timeout.total_seconds() + preflight


def gang_environment(spec: JobSpec, attempt: AttemptRecord, offering: Offering) -> dict[str, str]:
    """What every node of the attempt is told before it boots.

    The rest (its rank, the master's address and port, every node's address)
    is known only once the gang has assembled; the agent adds it then. The
    torchrun variables (``PET_*``) let ``torchrun --nproc-per-node 8 train.py``
    run with no other flag.
    """
    env = {
        "SPOTD_RDZV_ID": attempt.client_token,
        "PET_RDZV_ID": attempt.client_token,
        "PET_NNODES": str(attempt.nodes),
        "SPOTD_GANG_TIMEOUT_SECONDS": f"{spec.gang.timeout.total_seconds():g}",
        "SPOTD_PREFLIGHT": "1" if spec.preflight.enabled else "0",
        "SPOTD_PREFLIGHT_TIMEOUT_SECONDS": f"{spec.preflight.timeout.total_seconds():g}",
        "SPOTD_EXPECT_GPUS": str(offering.gpus_per_node),
        "SPOTD_EXPECT_GPU_MODEL": offering.gpu,
        "SPOTD_EXPECT_GPU_MEMORY_GB": f"{offering.gpu_memory_gb:g}",
        **_preflight_python(spec),
        # torchrun SIGKILLs its workers 30 s after it forwarded SIGTERM, unless told
        # otherwise: give the checkpoint the provider's whole notice (AWS: 120 s).
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(max(30, round(offering.notice_seconds))),
    }
    if spec.gang.master_port is not None:
        env["SPOTD_MASTER_PORT"] = env["PET_MASTER_PORT"] = str(spec.gang.master_port)
    threshold, source = preflight_threshold(spec, offering)
    if threshold is not None:
        env["SPOTD_PREFLIGHT_MIN_BUSBW_GBPS"] = f"{threshold:g}"
        env["SPOTD_PREFLIGHT_THRESHOLD_SOURCE"] = source
    return env


def _preflight_python(spec: JobSpec) -> dict[str, str]:
    """The job's interpreter and its use of torch, where the spec says them."""
    env: dict[str, str] = {}
    if spec.preflight.python is not None:
        env[PREFLIGHT_PYTHON] = spec.preflight.python
    if spec.preflight.torch is not None:
        env[PREFLIGHT_TORCH] = "1" if spec.preflight.torch else "0"
    return env


def preflight_threshold(spec: JobSpec, offering: Offering) -> tuple[float | None, str]:
    """The bus bandwidth (GB/s) the gang's preflight must reach, and where it comes from.

    The job's own figure wins; else the fabric's (an NCCL figure for GPUs,
    which the agent does not hold a CPU gang to); one node has none: nothing
    crosses the fabric.
    """
    if spec.preflight.min_busbw_gbps is not None:
        return spec.preflight.min_busbw_gbps, "spec"
    if spec.resources.nodes <= 1:
        return None, ""
    return default_min_busbw_gbps(offering.interconnect), "fabric"


def preflight_summary(figures: PreflightFigures) -> str:
    """One line for events and status: the verdict, the bandwidth and its threshold."""
    verdict = "preflight passed" if figures.passed else "preflight failed"
    parts = [verdict]
    if figures.busbw_gbps is not None:
        bw = f"bus bandwidth {figures.busbw_gbps:.2f} GB/s"
        if figures.min_busbw_gbps is not None:
            bw += f" (min {figures.min_busbw_gbps:g})"
        parts.append(bw)
    parts.append(f"{figures.backend or '?'} x{figures.world_size}, {figures.seconds:.1f} s")
    line = ", ".join(parts)
    return f"{line}: {figures.reason}" if figures.reason else line


def _ports(text: str | None) -> tuple[int, int]:
    # Validated when the agent joined (JoinReport.ports); stored as "job,preflight".
    job, _, preflight = (text or "0,0").partition(",")
    return int(job), int(preflight or 0)


_NONE = InstanceReport(instance_id="", provider="", job_id="", attempt=0)
