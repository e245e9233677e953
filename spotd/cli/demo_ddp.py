"""``spotd demo --example ddp``: a real 2-node x 2-process PyTorch job through preemptions.

The daemon runs in-process on a temporary SQLite database and the simulated
market, as in ``spotd demo``; the job is ``examples/train_ddp.py`` under
torchrun (gloo, CPU), two nodes of two processes each, every node on its own
loopback address. Each gang assembles through the daemon, passes preflight,
and trains through ``spotd.train`` with sharded DCP checkpoints.

Preemptions are the market's: when the job has made progress, the demo has
the simulated market reclaim one node of the running gang (as a cloud takes
back a single spot VM, with its provider's notice). Every rank agrees to
stop, the emergency checkpoint is written if it fits in the notice, and the
daemon resumes the job from the last complete checkpoint: with a new node
beside the kept one where the pool still sells it (:mod:`spotd.engine.repair`),
else on a new gang, in another provider when the policy's cooldowns say so. At the
end the final weights' digest is compared with an uninterrupted run of the same
world size.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from spotd.agent.gang import free_port
from spotd.cli.client import Client, wait_ended
from spotd.cli.demo import (
    DIGEST,
    EPOCH,
    clock_note,
    deferred_interrupts,
    demo_folder,
    event_line,
    stop_daemon,
)
from spotd.cli.render.cells import FittedTable
from spotd.core.agent_wire import PreflightFigures
from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.errors import SpotdError
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.daemon.config import (
    DaemonSettings,
    ProvidersSettings,
    SchedulingSettings,
    Settings,
)
from spotd.daemon.process import Daemon, quiet_scheduler_log
from spotd.daemon.views import AttemptView, JobView
from spotd_sim import SimProvider, SimSettings

CANCEL_WAIT_SECONDS = 30.0
"""How long a demo stopped early waits for its daemon to stop the job's nodes."""
TRAINER = Path(str(resources.files("spotd.examples") / "train_ddp.py"))
NODES, PROCS = 2, 2


@dataclass(frozen=True)
class DdpDemoOptions:
    """Knobs of the DDP demo; the defaults finish in about two minutes on 2 cores."""

    steps: int = 120
    ckpt_every: int = 10
    step_seconds: float = 0.05
    preemptions: int = 2
    progress_per_attempt: int = 25
    """Steps an attempt makes past where it resumed before the demo reclaims a node."""
    speed: float = 30.0
    """Simulated seconds per real second: the 30 s notice of GCP and Azure is 1 s."""
    timeout_seconds: float = 170.0
    keep: Path | None = None
    quiet: bool = False


class DdpAttempt(BaseModel):
    """One attempt of the DDP job."""

    provider: str
    zone: str
    instance_type: str
    nodes: int
    addresses: list[str]
    end_reason: str | None
    preflight: PreflightFigures | None
    step: int | None
    """The last step the job reported in this attempt."""
    resume_from: str | None
    """The complete checkpoint the attempt was told to resume from."""


class DdpSummary(BaseModel):
    """What ``spotd demo --example ddp --json`` prints."""

    job_id: str
    status: str
    preemptions: int
    providers_used: list[str]
    attempts: list[DdpAttempt]
    result_digest: str | None
    reference_digest: str
    digest_matches: bool
    wall_seconds: float


def ddp_settings(root: Path, options: DdpDemoOptions) -> Settings:
    """A daemon on ``root``: SQLite, the simulated market with no preemption of its own."""
    return Settings(
        data_dir=root,
        database_url=f"sqlite:///{root / 'spotd.db'}",
        daemon=DaemonSettings(port=0, tick_seconds=0.2, reap_every_ticks=5, owner="demo-ddp"),
        # Cooldowns outlast the run, so each reclaimed region is avoided: the job moves on.
        scheduling=SchedulingSettings(policy="balanced", cooldown_hours=24.0, replan_seconds=3600),
        providers=ProvidersSettings(
            sim=SimSettings(
                seed=5, speed=options.speed, mean_up_hours=10_000.0, mean_down_hours=0.1,
                boot_seconds=30, epoch=EPOCH,
            )
        ),
    )


def ddp_spec(root: Path, options: DdpDemoOptions) -> JobSpec:
    """The example as a 2-node spot job, one region per provider."""
    return JobSpec.model_validate(
        {
            "name": "train-ddp-demo",
            "command": [
                sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(PROCS),
                str(TRAINER), "--steps", str(options.steps),
                "--ckpt-every", str(options.ckpt_every),
                "--step-seconds", str(options.step_seconds),
            ],
            "workdir": str(root),
            "env": {"OMP_NUM_THREADS": "1"},
            # A small model: the 12.5 Gbps per GPU of GCP's A2 will do (the rule for a
            # 2-node job of unknown size asks 200, which only Azure's ND has here).
            "resources": {
                "gpus": ["A100"], "gpus_per_node": 8, "nodes": NODES, "min_gbps_per_gpu": 10,
            },
            "market": {"type": "spot", "regions": ["us-east-1", "us-central1", "eastus"]},
            "checkpoint": {"uri": str(root / "checkpoints"), "size_gb": 0.001},
            "gang": {"timeout": "2m"},
            "preflight": {"timeout": "1m"},
        }
    )


def reference_run(root: Path, options: DdpDemoOptions) -> str:
    """The same training, same world size, on one node with no interruption."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
        "--nproc-per-node", str(NODES * PROCS), "--master-addr", "127.0.0.1",
        "--master-port", str(free_port("127.0.0.1")), str(TRAINER), "--steps", str(options.steps),
    ]  # fmt: skip
    # torchrun's own files (torchelastic_*) go in the demo's folder, and with it.
    tmp = root / "reference-tmp"
    tmp.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    # A session of its own: on Ctrl-C or a timeout torchrun and its ranks go as one
    # group, none left running after the demo.
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env, cwd=root, start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = run.communicate(timeout=300)
    except BaseException as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise SpotdError("the uninterrupted reference run took over 300 s") from None
        raise
    digests = DIGEST.findall(stdout)
    if run.returncode != 0 or not digests:
        raise SpotdError(f"the uninterrupted reference run failed:\n{stdout}{stderr}")
    return str(digests[-1])


def run_ddp_demo(options: DdpDemoOptions, console: Console, clock: Clock = WALL) -> DdpSummary:
    """Run the demo and summarise it, timed by ``clock``; raises SpotdError when it
    cannot run."""
    try:
        import torch  # noqa: F401 - only to say what is missing, clearly
    except ImportError as exc:
        raise SpotdError(
            "the ddp example needs PyTorch: pip install 'spotd[train]' "
            "(with torch==2.13.0 for a CPU build)"
        ) from exc
    quiet_scheduler_log()
    # The folder goes however the demo ends, Ctrl-C as its daemon starts included.
    with demo_folder(options.keep, "spotd-demo-ddp-") as root:
        return _run_in(root, options, console, clock)


def _run_in(root: Path, options: DdpDemoOptions, console: Console, clock: Clock) -> DdpSummary:
    started = clock.monotonic()
    settings = ddp_settings(root, options)
    daemon = Daemon(settings)
    job_id: str | None = None
    try:
        daemon.start()
        client = Client(f"http://127.0.0.1:{daemon.port}", settings.token_file.read_text())
        try:
            job_id = client.submit(ddp_spec(root, options)).id
            _say(options, console, f"[bold]demo ddp[/bold]: submitted {job_id}; files in "
                 f"{escape(str(root))}")  # fmt: skip
            _say(options, console, clock_note(options.speed))
            job = _follow(client, daemon, job_id, options, console, clock=clock)
            logs = client.logs(job.id).logs
        except BaseException:
            # Ctrl-C or a failure: the daemon, still running, stops the job's nodes.
            if job_id is not None:
                with deferred_interrupts():
                    _cancel_quietly(client, job_id)
            raise
    finally:
        stop_daemon(daemon)  # and any node the cancel did not get to
    _say(options, console, "reference: the same run with no interruption ...")
    reference = reference_run(root, options)
    return _summary(job, logs, reference, clock.monotonic() - started)


def _follow(
    client: Client,
    daemon: Daemon,
    job_id: str,
    options: DdpDemoOptions,
    console: Console,
    *,
    clock: Clock,
) -> JobView:
    """Print transitions; reclaim a node of each gang once it has made progress."""
    deadline = clock.monotonic() + options.timeout_seconds
    shown, reclaimed = 0, 0
    resumed_at = 0
    reclaimed_seqs: set[int] = set()
    while True:
        events = client.events(job_id)
        for e in events[shown:]:
            _say(options, console, event_line(e))
        shown = len(events)
        job = client.job(job_id)
        if JobStatus(job.status).terminal:
            return job
        current = job.attempts[-1] if job.attempts else None
        if (
            current is not None and reclaimed < options.preemptions
            and current.seq not in reclaimed_seqs and _progressed(current, resumed_at, options)
        ):  # fmt: skip
            assert current.gang is not None and current.gang.step is not None
            resumed_at = current.gang.step
            _reclaim(daemon, current, options, console)
            reclaimed_seqs.add(current.seq)
            reclaimed += 1
        if clock.monotonic() > deadline:
            raise SpotdError(f"demo job {job_id} did not finish in {options.timeout_seconds:g} s")
        time.sleep(0.25)


def _cancel_quietly(client: Client, job_id: str) -> None:
    """Ask for the job to be cancelled and wait (briefly) while the daemon, still running,
    stops its nodes."""
    try:
        client.cancel(job_id)
        wait_ended(client, job_id, timeout_seconds=CANCEL_WAIT_SECONDS)
    except SpotdError as exc:
        logging.getLogger(__name__).warning("could not cancel %s: %s", job_id, exc)


def _progressed(attempt: AttemptView, resumed_at: int, options: DdpDemoOptions) -> bool:
    gang = attempt.gang
    if attempt.ended_at is not None or gang is None or gang.step is None:
        return False
    return gang.step >= resumed_at + options.progress_per_attempt


def _reclaim(daemon: Daemon, attempt: AttemptView, options: DdpDemoOptions, c: Console) -> None:
    """The market takes back the last node of the gang, with the provider's notice."""
    provider = daemon.engine.providers[attempt.provider]
    if not isinstance(provider, SimProvider):
        raise SpotdError(f"{attempt.provider} is not a simulated provider")
    node = attempt.instance_ids[-1]
    step = attempt.gang.step if attempt.gang else None
    rank = len(attempt.instance_ids) - 1
    _say(options, c, f"  [yellow]market reclaims {node}[/yellow] (rank {rank} of attempt "
         f"{attempt.seq}, at step {step})")  # fmt: skip
    provider.reclaim(node)


def _summary(job: JobView, logs: dict[str, str], reference: str, wall: float) -> DdpSummary:
    digests = [m for text in logs.values() for m in DIGEST.findall(text)]
    result = digests[-1] if digests else None
    return DdpSummary(
        job_id=job.id,
        status=job.status,
        preemptions=job.preemptions,
        providers_used=job.providers,
        attempts=[
            DdpAttempt(
                provider=a.provider, zone=a.zone, instance_type=a.instance_type, nodes=a.nodes,
                addresses=a.gang.addresses if a.gang else [], end_reason=a.end_reason,
                preflight=a.gang.preflight if a.gang else None,
                step=a.gang.step if a.gang else None, resume_from=a.resume_from,
            )
            for a in job.attempts
        ],
        result_digest=result,
        reference_digest=reference,
        digest_matches=result == reference,
        wall_seconds=round(wall, 1),
    )


def print_ddp_summary(s: DdpSummary, console: Console) -> None:
    """The human-readable summary."""
    table = FittedTable(title=f"job {s.job_id}: {s.status}", box=None, header_style="bold")
    for column in ("#", "PROVIDER", "ZONE", "NODES", "PREFLIGHT", "STEP", "END"):
        # Whole words where the width allows (FittedTable), else folded: never cut.
        table.add_column(column, overflow="fold")
    for i, a in enumerate(s.attempts, 1):
        pf = a.preflight
        figure = "-"
        if pf is not None:
            bw = f"{pf.busbw_gbps:.2f} GB/s" if pf.busbw_gbps is not None else "no bw"
            figure = f"{'ok' if pf.passed else 'FAILED'} {bw}"
        table.add_row(
            str(i), a.provider, a.zone, f"{a.nodes} ({', '.join(a.addresses)})", figure,
            str(a.step if a.step is not None else "-"), a.end_reason or "-",
        )  # fmt: skip
    console.print(table)
    ok = "[green]matches[/green]" if s.digest_matches else "[red]DIFFERS[/red]"
    console.print(
        f"preemptions: {s.preemptions}   providers: {', '.join(s.providers_used)}\n"
        f"digest:        {s.result_digest}\n"
        f"uninterrupted: {s.reference_digest} ({ok})\n"
        f"{s.wall_seconds:.1f} s",
        highlight=False,
        soft_wrap=True,
    )


def _say(options: DdpDemoOptions, console: Console, text: str) -> None:
    # soft_wrap: a line stays whole when piped (rich folds at 80 columns there).
    if not options.quiet:
        console.print(text, highlight=False, soft_wrap=True)


