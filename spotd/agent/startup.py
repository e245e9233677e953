"""What the agent does between boot and the job's command: node, gang, then preflight.

0. Prepare the node (:mod:`spotd.agent.node`): the job's code, its secrets and
   its setup lines; a failure ends the node in phase ``setup``.
1. Join the gang and wait for its roster (:mod:`spotd.agent.gang`); a gang
   that does not assemble in time ends the node without running anything.
2. Run the preflight (:mod:`spotd.agent.preflight`) across every rank of the
   gang, with the job's own interpreter, environment and image
   (:mod:`spotd.agent.job_python`): a node check, torch and the GPUs as the job
   will see them, and an all-reduce benchmark. Every node reaches the same
   verdict; a failed one ends the node without running the job.
3. Hand the job its environment: the rendezvous variables, where the notice
   and progress files are, and everything the daemon already set.

With no daemon to talk to (``SPOTD_AGENT_DAEMON_URL`` unset), or a job the
daemon gave no rendezvous id (``SPOTD_RDZV_ID``), there is no gang and no
preflight: the job starts at once.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from spotd.agent.config import AgentConfig
from spotd.agent.files import NOTICE_FILE, PROGRESS_FILE
from spotd.agent.gang import (
    GangPlan,
    Join,
    free_port,
    roster_environment,
    route_address,
    wait_for_roster,
)
from spotd.agent.gpu import GpuSource
from spotd.agent.job_python import JobPython, JobRuntime, job_runtime
from spotd.agent.node import AskSecrets, NodeFailed, Write, prepare_node, to_own_stdout
from spotd.agent.preflight import PreflightPlan, run_preflight
from spotd.agent.preflight_worker import Backend
from spotd.agent.reporter import ReportFailed, ReportRejected
from spotd.core.agent_wire import (
    JOB_TMPDIR,
    PREFLIGHT_TORCH,
    AgentReport,
    ExitPhase,
    JoinReport,
    PreflightCheck,
    PreflightCheckName,
    PreflightFigures,
    PreflightReport,
    Roster,
)
from spotd.core.spec import PreflightSpec

log = logging.getLogger(__name__)

DEFAULT_PREFLIGHT_SECONDS = PreflightSpec().timeout.total_seconds()
"""For a job whose daemon did not say: the job spec's default."""

EXIT_NO_GANG = 75
"""The agent's exit when its gang did not assemble (EX_TEMPFAIL: try elsewhere)."""
EXIT_PREFLIGHT_FAILED = 76
"""The agent's exit when the gang's preflight failed; the job's command never ran."""


@dataclass(frozen=True, slots=True)
class Startup:
    """How the start went: the job's environment, or why the node ends without it."""

    env: dict[str, str] = field(default_factory=dict)
    phase: ExitPhase = "command"
    """``command``: start the job with ``env``; else the phase that failed."""
    exit_code: int = 0
    cwd: Path | None = None
    """Where the command starts: the unpacked code, or None for the agent's own folder."""
    detail: str = ""
    """What went wrong before the command, for the exit report."""
    peer_at_fault: bool = False
    """The gang's preflight failed on another node's own checks, which its verdict names:
    this node passed, and may stand by for a new node in that one's place."""

    @property
    def ready(self) -> bool:
        """The job's command may start."""
        return self.phase == "command"


def run_dir_of(config: AgentConfig) -> Path:
    """The agent's folder for the hostfile and the notice and progress files: the
    configured one, or a new temporary one (the agent removes it when it ends)."""
    path = Path(config.run_dir) if config.run_dir else Path(tempfile.mkdtemp(prefix="spotd-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def job_tmpdir(env: Mapping[str, str], run_dir: Path) -> dict[str, str]:
    """``TMPDIR`` in the run folder, so the job's temporary files (torchrun's logs, say)
    go when the agent removes the folder at its end and nothing of the job stays in the
    node's temporary directory. A job whose ``[env]`` names its own ``TMPDIR`` (the
    daemon marks it) keeps that one."""
    if env.get(JOB_TMPDIR):
        return {}
    own = run_dir / "tmp"
    own.mkdir(exist_ok=True)
    return {"TMPDIR": str(own)}


def prepare(
    config: AgentConfig,
    *,
    instance_id: str,
    run_dir: Path,
    join: Join | None,
    put: Callable[[AgentReport], None],
    gpus: GpuSource | None,
    stop: threading.Event | None = None,
    ask_secrets: AskSecrets | None = None,
    write: Write = to_own_stdout,
) -> Startup:
    """Prepare the node, assemble the gang and pass preflight; the job's environment
    once all three hold.

    ``put`` queues a report for the daemon (the preflight's figures go that way);
    ``stop`` set (the node is going) ends the wait for the gang; ``ask_secrets``
    asks the daemon for the job's secrets; the setup lines' output goes to ``write``.
    """
    node = prepare_node(config.job_env, run_dir, ask_secrets, write)
    if isinstance(node, NodeFailed):
        log.error("the node could not be prepared: %s", node.detail)
        return Startup(dict(config.job_env), "setup", node.exit_code, detail=node.detail)
    started = _gang_and_preflight(config, node.env, instance_id=instance_id, run_dir=run_dir,
                                  cwd=node.cwd, join=join, put=put, gpus=gpus,
                                  stop=stop)  # fmt: skip
    return replace(started, cwd=node.cwd)


def _gang_and_preflight(
    config: AgentConfig,
    job_env: Mapping[str, str],
    *,
    instance_id: str,
    run_dir: Path,
    cwd: Path | None,
    join: Join | None,
    put: Callable[[AgentReport], None],
    gpus: GpuSource | None,
    stop: threading.Event | None,
) -> Startup:
    env = dict(job_env)
    env["SPOTD_NOTICE_FILE"] = str(run_dir / NOTICE_FILE)
    env["SPOTD_PROGRESS_FILE"] = str(run_dir / PROGRESS_FILE)
    env.update(job_tmpdir(env, run_dir))
    if join is None or not config.daemon_url or not env.get("SPOTD_RDZV_ID"):
        # No daemon to join, or one that did not ask for a gang (an older one).
        return Startup(env)
    plan = GangPlan.from_env(env)
    roster = _assemble(config, plan, instance_id, join, stop)
    if roster is None:
        return Startup(env, "rendezvous", EXIT_NO_GANG)
    env.update(roster_environment(roster, plan, run_dir))
    log.info("gang assembled: rank %d of %d, master %s:%s", roster.rank, roster.nodes,
             roster.master_addr, env["SPOTD_MASTER_PORT"])  # fmt: skip
    job = job_runtime(config.command, env, cwd=cwd, run_dir=run_dir)
    figures = _preflight(config, job, roster, gpus)
    put(PreflightReport(figures=figures, **config.speaker(instance_id)))
    if not figures.passed:
        log.error("preflight failed: %s", figures.reason)
        return Startup(env, "preflight", EXIT_PREFLIGHT_FAILED,
                       peer_at_fault=peer_at_fault(figures, roster.rank))  # fmt: skip
    return Startup(env)


def peer_at_fault(figures: PreflightFigures, rank: int) -> bool:
    """Whether the failed preflight ``figures`` name another node than ``rank`` (which then
    passed its own checks, and may stand by for that node's replacement)."""
    return figures.failed_rank is not None and figures.failed_rank != rank


def _assemble(
    config: AgentConfig, plan: GangPlan, instance_id: str, join: Join, stop: threading.Event | None
) -> Roster | None:
    address = config.address or route_address(str(config.daemon_url))
    # A pinned port serves the preflight too (it is done before the job starts):
    # a firewall that opens only that port must not fail every gang's preflight.
    if plan.fixed_port is not None:
        ports = (plan.fixed_port, plan.fixed_port)
    else:
        ports = (free_port(address), free_port(address))
    report = JoinReport(address=address, ports=ports, **config.speaker(instance_id))
    if plan.nodes == 1:
        # A gang of one is complete as it is: no need to wait on the daemon (which
        # may be restarting) before the job can start. It still hears of the join.
        _join_once(join, report)
        return Roster(rank=0, nodes=1, addresses=(address,), master_addr=address,
                      master_port=ports[0], preflight_port=ports[1],
                      rdzv_id=str(config.job_env.get("SPOTD_RDZV_ID", "")))  # fmt: skip
    log.info("joining the gang of %d node(s) as %s", plan.nodes, address)
    roster = wait_for_roster(
        join, report, timeout=plan.timeout_seconds, poll_seconds=config.join_poll_seconds,
        stop=stop,
    )
    if roster is None:
        log.error("the gang did not assemble within %g s", plan.timeout_seconds)
    return roster


def _join_once(join: Join, report: JoinReport) -> None:
    try:
        join(report)
    except (ReportFailed, ReportRejected) as exc:
        log.warning("could not tell the daemon this node joined: %s", exc)


def _preflight(
    config: AgentConfig, job: JobRuntime, roster: Roster, gpus: GpuSource | None
) -> PreflightFigures:
    if job.env.get("SPOTD_PREFLIGHT", "1") == "0":
        why = "disabled by the job ([preflight] enabled = false)"
        skipped = PreflightCheck(name=PreflightCheckName.PREFLIGHT, ok=True, skipped=True,
                                 detail=why)  # fmt: skip
        return PreflightFigures(passed=True, world_size=roster.nodes, checks=(skipped,))
    plan = preflight_plan(config, job.env, roster, gpus)
    python = job.python.argv if isinstance(job.python, JobPython) else job.python.detail
    log.info("preflight: %s across %d rank(s), the job's python: %s",
             plan.backend or "gloo or nccl", plan.world_size, python)  # fmt: skip
    return run_preflight(plan, gpus, job)


def preflight_plan(
    config: AgentConfig, env: Mapping[str, str], roster: Roster, gpus: GpuSource | None
) -> PreflightPlan:
    """The preflight this node runs, from the daemon's variables and what the node has."""
    kind = config.kind
    simulated = kind is not None and not kind.nodes_have_gpus
    # A simulated node's GPUs do not exist (a recorded NVML source stands in for
    # the utilisation watch): one process per node, and the preflight's default
    # backend, gloo there.
    visible = _gpu_count(gpus) if not simulated else 0
    backend: Backend = "nccl" if visible else "gloo"
    threshold_text = env.get("SPOTD_PREFLIGHT_MIN_BUSBW_GBPS", "")
    threshold = float(threshold_text) if threshold_text else None
    if backend == "gloo" and env.get("SPOTD_PREFLIGHT_THRESHOLD_SOURCE") == "fabric":
        # The fabric's figure is NCCL's on GPUs; sockets on CPUs are held to none.
        threshold = None
    return PreflightPlan(
        node_rank=roster.rank,
        nodes=roster.nodes,
        master_addr=roster.master_addr,
        port=roster.preflight_port,
        node_addr=roster.addresses[roster.rank],
        local_procs=max(1, visible),
        backend=backend,
        min_busbw_gbps=threshold,
        timeout_seconds=float(
            env.get("SPOTD_PREFLIGHT_TIMEOUT_SECONDS", "") or DEFAULT_PREFLIGHT_SECONDS
        ),
        expect_gpus=int(env.get("SPOTD_EXPECT_GPUS", "") or 0),
        expect_gpu_model=env.get("SPOTD_EXPECT_GPU_MODEL", ""),
        expect_gpu_memory_gb=float(env.get("SPOTD_EXPECT_GPU_MEMORY_GB", "") or 0),
        checkpoint_uri=env.get("SPOTD_CHECKPOINT_URI", ""),
        simulated=simulated,
        torch={"1": True, "0": False}.get(env.get(PREFLIGHT_TORCH, "")),
    )


def _gpu_count(gpus: GpuSource | None) -> int:
    if gpus is None:
        return 0
    try:
        return len(gpus.sample())
    except Exception:
        # The node checks will say what is wrong with the driver; plan for none.
        log.exception("GPU count unreadable")
        return 0
