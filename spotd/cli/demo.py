"""``spotd demo``: the example job on the simulated market, through preemptions, end to end.

It runs the real daemon in-process (API, scheduler, engine) on a temporary
SQLite database and the simulated providers, submits the example trainer
through the HTTP API as ``spotd submit`` would, waits for the end, and then
compares the run's final weights with those of the same training run without
any interruption.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from types import FrameType

from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from spotd.cli.client import Client, wait_ended
from spotd.cli.render.cells import FittedTable
from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.errors import SpotdError
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import Market
from spotd.daemon.config import (
    DaemonSettings,
    ProvidersSettings,
    SchedulingSettings,
    Settings,
)
from spotd.daemon.process import Daemon, quiet_scheduler_log
from spotd.daemon.views import EventView, JobView
from spotd.engine.context import placement_context
from spotd_policies.on_demand import OnDemandPolicy
from spotd_sim import SimProvider, SimSettings

TRAINER = Path(str(resources.files("spotd.examples") / "train_tiny.py"))
DIGEST = re.compile(r"^digest: ([0-9a-f]{64})$", re.MULTILINE)
# A fixed start of simulated time, so one seed gives one market history.
EPOCH = datetime(2026, 1, 5, tzinfo=UTC)


@dataclass(frozen=True)
class DemoOptions:
    """Knobs of the demo; the defaults finish in well under two minutes on 2 cores."""

    seed: int = 11
    steps: int = 300
    step_seconds: float = 0.1
    """Real seconds per training step: stands in for GPU time."""
    ckpt_every: int = 10
    speed: float = 600.0
    """Simulated seconds per real second: 0.1 s a step is 1 simulated minute."""
    mean_up_hours: float = 1.5
    mean_down_hours: float = 1.5
    timeout_seconds: float = 110.0
    keep: Path | None = None
    quiet: bool = False


class DemoAttempt(BaseModel):
    """One attempt of the demo job."""

    provider: str
    region: str
    zone: str
    instance_type: str
    market: str
    start: datetime
    end: datetime | None
    end_reason: str | None
    cost_usd: float


class DemoSummary(BaseModel):
    """What ``spotd demo --json`` prints."""

    job_id: str
    status: str
    attempts: list[DemoAttempt]
    preemptions: int
    providers: list[str]
    cost_usd: float
    on_demand_cost_usd: float
    savings_pct: float
    ledger_usd: float
    """The instances' cost in spotd's ledger, rounded to the cent per provider as bills are."""
    provider_bill_usd: float
    """What the simulated providers' own meters charge for the same instances."""
    egress_usd: float
    """The checkpoint's moves in the ledger, which no simulated meter bills."""
    digest: str | None
    uninterrupted_digest: str
    digest_matches: bool
    simulated_hours: float
    wall_seconds: float
    seed: int = DemoOptions.seed
    """The market's seed: the same one gives the same attempts and preemptions."""


def demo_settings(root: Path, options: DemoOptions) -> Settings:
    """A daemon on ``root``: SQLite, the simulated market, a fast clock, any free port."""
    return Settings(
        data_dir=root,
        database_url=f"sqlite:///{root / 'spotd.db'}",
        daemon=DaemonSettings(port=0, tick_seconds=0.2, reap_every_ticks=5, owner="demo"),
        scheduling=SchedulingSettings(policy="balanced", cooldown_hours=3.0),
        providers=ProvidersSettings(
            sim=SimSettings(
                seed=options.seed,
                speed=options.speed,
                mean_up_hours=options.mean_up_hours,
                mean_down_hours=options.mean_down_hours,
                # Lifetimes drawn per launch, not pools flipping at moments of simulated
                # time: one seed, one run (see SimSettings.lifetimes).
                lifetimes=True,
                boot_seconds=300,
                epoch=EPOCH,
            )
        ),
    )


def demo_spec(root: Path, options: DemoOptions) -> JobSpec:
    """The example trainer as a one-node, one-GPU spot job."""
    return JobSpec.model_validate(
        {
            "name": "train-tiny-demo",
            "command": [
                sys.executable, str(TRAINER),
                "--steps", str(options.steps),
                "--ckpt-every", str(options.ckpt_every),
                "--step-seconds", str(options.step_seconds),
            ],
            "workdir": str(root),
            "resources": {"gpus": ["A100"], "gpus_per_node": 1},
            # Data lives in the US: keep the job near it.
            "market": {"type": "spot", "regions": ["us-*", "eastus", "westus3"]},
            "checkpoint": {"uri": str(root / "checkpoints" / "train-tiny"), "size_gb": 0.001},
        }
    )


def uninterrupted_digest(options: DemoOptions) -> subprocess.Popen[str]:
    """Start the same training run with no checkpoints and no interruption."""
    return subprocess.Popen(
        [sys.executable, str(TRAINER), "--steps", str(options.steps)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )


def run_demo(options: DemoOptions, console: Console, clock: Clock = WALL) -> DemoSummary:
    """Run the demo and summarise it, timed by ``clock``; raises SpotdError when it
    cannot run."""
    with demo_folder(options.keep, "spotd-demo-") as root:
        return _run_in(root, options, console, clock)


@contextmanager
def demo_folder(keep: Path | None, prefix: str) -> Iterator[Path]:
    """The demo's folder: ``keep``, or a new temporary one that goes when the block ends,
    however it ends (Ctrl-C too)."""
    root = keep or Path(tempfile.mkdtemp(prefix=prefix))
    try:
        root.mkdir(parents=True, exist_ok=True)
        yield root
    finally:
        if keep is None:
            with deferred_interrupts():
                shutil.rmtree(root, ignore_errors=True)


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Ctrl-C held back while the block cleans up, and raised when it is done.

    A second Ctrl-C, pressed while an interrupted demo stops its nodes or removes
    its folder, would otherwise cut that short and leave them behind.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return
    held: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        held.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held and callable(previous):
            previous(held[0], None)  # Python's own handler raises KeyboardInterrupt


def _run_in(root: Path, options: DemoOptions, console: Console, clock: Clock) -> DemoSummary:
    started = clock.monotonic()
    reference = uninterrupted_digest(options)
    try:
        quiet_scheduler_log()
        settings = demo_settings(root, options)
        daemon = Daemon(settings)
        try:
            daemon.start()
            client = Client(f"http://127.0.0.1:{daemon.port}", settings.token_file.read_text())
            job = client.submit(demo_spec(root, options))
            if not options.quiet:
                kept = "" if options.keep else " (removed at the end; --keep DIR keeps them)"
                console.print(
                    f"[bold]demo[/bold]: submitted {job.id}; files in {escape(str(root))}{kept}",
                    soft_wrap=True,
                )
                console.print(clock_note(options.speed), highlight=False, soft_wrap=True)
            job = _follow(client, job.id, options, console, clock=clock)
            logs = client.logs(job.id).logs
            on_demand = _on_demand_cost(daemon, job, options)
            _wait_billed(daemon, job.id, clock=clock)
            billed = _billing(daemon, job.id)
        finally:
            stop_daemon(daemon)
        ref_out, _ = reference.communicate(timeout=60)
    except BaseException:
        # Ctrl-C or a failure: the reference run is of no use any more.
        reference.kill()
        reference.wait()
        raise
    summary = _summary(job, logs, ref_out, on_demand, billed, clock.monotonic() - started)
    return summary.model_copy(update={"seed": options.seed})


def stop_daemon(daemon: Daemon) -> None:
    """Stop the demo's daemon and then its job's nodes, a second Ctrl-C held back
    until both are done."""
    with deferred_interrupts():
        try:
            daemon.stop()
        finally:
            stop_nodes(daemon)


def stop_nodes(daemon: Daemon) -> None:
    """Terminate the simulated nodes still running (an interrupted demo's job): they
    are processes of their own that outlive the daemon, as cloud VMs do, and would
    go on writing into the demo's folder."""
    for provider in daemon.engine.providers.values():
        if isinstance(provider, SimProvider):
            live = [i.id for i in provider.list_instances({}) if not i.ended]
            if live:
                provider.terminate(live)


def _follow(
    client: Client, job_id: str, options: DemoOptions, console: Console, *, clock: Clock
) -> JobView:
    """Wait for the job to end, printing its transitions as they happen."""
    deadline = clock.monotonic() + options.timeout_seconds
    shown = 0
    while True:
        events = client.events(job_id)
        for e in events[shown:]:
            if not options.quiet:
                print_event(console, e)
        shown = len(events)
        job = client.job(job_id)
        if JobStatus(job.status).terminal:
            return job
        if clock.monotonic() > deadline:
            client.cancel(job_id)
            wait_ended(client, job_id, timeout_seconds=30.0)  # its daemon stops the nodes
            raise SpotdError(f"demo job {job_id} did not finish in {options.timeout_seconds:g} s")
        time.sleep(0.25)


def clock_note(speed: float) -> str:
    """The line that says the times below are the simulated market's, not real ones."""
    return (f"  times are on the simulated market's clock, {speed:g} simulated seconds "
            "per real second")  # fmt: skip


def print_event(console: Console, e: EventView) -> None:
    """One transition on one line, never folded: piped to a file or a pager (which rich
    takes for 80 columns), a line stays whole; a terminal wraps it itself."""
    console.print(event_line(e), highlight=False, soft_wrap=True)


def event_line(e: EventView) -> str:
    """One transition as the demos print it (rich markup escaped)."""
    return (
        f"  {e.at:%H:%M:%S} {e.from_status or '':>13} -> {e.to_status:<13} "
        f"{escape(e.cause)}: {escape(e.detail)}"
    )


def _on_demand_cost(daemon: Daemon, job: JobView, options: DemoOptions) -> float:
    """The same work on the cheapest adequate on-demand offering, booted once."""
    engine = daemon.engine
    spec = engine.store.get_job(job.id).spec
    # As a new job: the comparison is a run booted once, on demand, from the start.
    offerings = engine.market.offerings()
    ctx = placement_context(
        job.id,
        spec,
        engine.clock.now(),
        pools=(o.pool for o in offerings),
        changeover_hours=engine.settings.changeover_hours,
    )
    decision = OnDemandPolicy().place(ctx, offerings)
    if decision.choice is None or decision.choice.market is not Market.ON_DEMAND:
        raise SpotdError("no on-demand offering to compare the demo with")
    boot: float = daemon.settings.providers.sim.boot_seconds
    work = options.steps * options.step_seconds * options.speed
    return decision.choice.price_per_hour * (boot + work) / 3600.0


@dataclass(frozen=True)
class _Billing:
    """The job's cost as the ledger has it, and as the providers bill it."""

    per_attempt: dict[int, float]
    ledger_usd: float
    """The instances' lines, rounded to the cent per provider as each provider's bill is."""
    bill_usd: float
    egress_usd: float


def _wait_billed(daemon: Daemon, job_id: str, *, clock: Clock, timeout: float = 30.0) -> None:
    """Wait until the ledger bills every attempt that had nodes.

    The engine bills a job just after the transition that ended it, in the same
    pass; the API may show the job ended in between, and a ledger read then
    would miss its last attempt.
    """
    store = daemon.engine.store
    limit = clock.monotonic() + timeout
    while clock.monotonic() < limit:
        launched = {a.seq for a in store.attempts(job_id) if a.instance_ids}
        if launched <= {e.attempt for e in store.ledger(job_id=job_id)}:
            return
        time.sleep(0.1)
    raise SpotdError(f"the ledger of demo job {job_id} did not bill every attempt in {timeout:g} s")


def _billing(daemon: Daemon, job_id: str) -> _Billing:
    """Read the job's ledger once and ask each simulated provider for its bill.

    A provider bills once for all of the job's instances with it, rounded to
    the cent; the ledger's instance lines are totalled the same way, per
    provider, rounded. Its egress lines (the checkpoint's moves) are kept
    apart: the simulated meters bill instances only, and a tenth of a cent of
    egress would tip the rounding of a total that otherwise matches.
    """
    engine = daemon.engine
    per_attempt: dict[int, float] = {}
    per_provider: dict[str, float] = {}
    egress = 0.0
    for entry in engine.store.ledger(job_id=job_id):
        per_attempt[entry.attempt] = per_attempt.get(entry.attempt, 0.0) + entry.usd
        if entry.kind == "egress":
            egress += entry.usd
        else:
            per_provider[entry.provider] = per_provider.get(entry.provider, 0.0) + entry.usd
    instances: dict[str, list[str]] = {}
    for attempt in engine.store.attempts(job_id):
        instances.setdefault(attempt.pool.provider, []).extend(attempt.instance_ids)
    bill = 0.0
    for name, ids in instances.items():
        provider = engine.providers[name]
        if isinstance(provider, SimProvider) and ids:
            bill += provider.bill(ids)
    ledger = sum(round(v, 2) for v in per_provider.values())
    return _Billing(per_attempt, round(ledger, 2), round(bill, 2), round(egress, 4))


def _summary(  # noqa: PLR0917 - one value per part of the summary
    job: JobView,
    logs: dict[str, str],
    reference: str,
    on_demand: float,
    billed: _Billing,
    wall: float,
) -> DemoSummary:
    digests = [m for text in logs.values() for m in DIGEST.findall(text)]
    expected = DIGEST.findall(reference)
    if not expected:
        raise SpotdError(f"the uninterrupted reference run printed no digest:\n{reference}")
    # The cost is the ledger's: what the job was billed, by each provider's rules.
    cost = sum(billed.per_attempt.values())
    first = job.attempts[0].started_at if job.attempts else job.submitted_at
    last = max((a.ended_at for a in job.attempts if a.ended_at), default=first)
    return DemoSummary(
        job_id=job.id,
        status=job.status,
        attempts=[
            DemoAttempt(
                provider=a.provider, region=a.region, zone=a.zone,
                instance_type=a.instance_type, market=a.market, start=a.started_at,
                end=a.ended_at, end_reason=a.end_reason,
                cost_usd=round(billed.per_attempt.get(a.seq, 0.0), 4),
            )
            for a in job.attempts
        ],
        preemptions=job.preemptions,
        providers=job.providers,
        cost_usd=round(cost, 4),
        on_demand_cost_usd=round(on_demand, 4),
        savings_pct=round(100.0 * (1 - cost / on_demand), 1) if on_demand else 0.0,
        ledger_usd=billed.ledger_usd,
        provider_bill_usd=billed.bill_usd,
        egress_usd=billed.egress_usd,
        digest=digests[-1] if digests else None,
        uninterrupted_digest=expected[-1],
        digest_matches=bool(digests) and digests[-1] == expected[-1],
        simulated_hours=round((last - first).total_seconds() / 3600.0, 3),
        wall_seconds=round(wall, 1),
    )


def print_summary(s: DemoSummary, console: Console) -> None:
    """The human-readable summary."""
    table = FittedTable(title=f"job {s.job_id}: {s.status}", box=None, header_style="bold")
    for column in ("#", "PROVIDER", "ZONE", "TYPE", "MARKET", "END", "COST USD"):
        # Whole words where the width allows (FittedTable), else folded: never cut.
        table.add_column(column, overflow="fold")
    for i, a in enumerate(s.attempts, 1):
        table.add_row(
            str(i), a.provider, a.zone, a.instance_type, a.market,
            a.end_reason or "-", f"{a.cost_usd:.2f}",
        )
    console.print(table)
    ok = "[green]matches[/green]" if s.digest_matches else "[red]DIFFERS[/red]"
    console.print(
        f"preemptions: {s.preemptions}   providers: {', '.join(s.providers)}\n"
        f"cost: {s.cost_usd:.2f} USD   on-demand: {s.on_demand_cost_usd:.2f} USD   "
        f"saved: {s.savings_pct:.1f} %\n"
        f"instances: {s.ledger_usd:.2f} USD in the ledger, "
        f"{s.provider_bill_usd:.2f} USD by the providers' own meters\n"
        f"checkpoint moves: {s.egress_usd:.4f} USD\n"
        f"digest: {s.digest}\n"
        f"uninterrupted: {s.uninterrupted_digest} ({ok})\n"
        f"{s.simulated_hours:.2f} simulated hours in {s.wall_seconds:.1f} s\n"
        f"seed {s.seed}: the market's preemptions follow from the seed alone, the "
        "training's pace does not: it runs in real time on a clock 600 times faster, so "
        "a node a tenth of a second slower has done a simulated minute less when its "
        "lifetime ends. Another run of this seed places the same attempts and counts the "
        "same preemptions on a machine as busy, with a cost some percent apart; on a "
        "busier one the job can fall behind and meet more preemptions.",
        highlight=False,
        soft_wrap=True,
    )
