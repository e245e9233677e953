"""Fault injection: SIGKILL the daemon again and again while jobs run, then check nothing was lost.

Run: .venv/bin/python benchmarks/fault_run.py [--jobs 12] [--gangs 2] [--minutes 8]
[--drain-minutes 2] [--max-kills 200] [--seed 7] [--up-hours 2.0] [--keep] [--json]

A real ``spotd daemon`` process (as ``tests/daemon_support.py`` starts one) runs
on the simulated market at speed 600 in a temporary data dir, API on
127.0.0.1 with port 0, a pass every 0.1 s, the market seeded with ``--seed``.
Its pools have capacity for ``--up-hours`` simulated hours on average (the
tests' 0.5, 3 real seconds, preempts a two-node job, which spends some 10 real
seconds in boot and preflight, before it ever trains; 2.0 still preempts
every job several times). The run submits ``--jobs`` single-node runs of
``spotd/examples/train_tiny.py`` (200 steps, a checkpoint every 5, 0.05 s a
step, a checkpoint folder per job) and ``--gangs`` two-node runs of the same
trainer (each node trains the same deterministic run into the job's shared
checkpoint folder; ``min_gbps_per_gpu = 10``, as ``spotd demo --example ddp``
sets it, since the default network rule rules out every one-GPU node of the
simulated market for two nodes). Then, until every job has ended or
``--minutes`` have passed, it keeps the daemon up for 2-8 s, SIGKILLs it, keeps it down for
1-20 s (long enough, at times, for a job to finish while no daemon listens:
an agent retries its exit report for 15 real seconds) and starts it again,
all times drawn from ``--seed``. Jobs still running then get up to
``--drain-minutes`` with the daemon left alone. The daemon is stopped with
SIGTERM and the run prints one line per figure, each check marked
``[FAIL]`` when it fails, and a verdict; it exits 1 when a check failed:

- jobs submitted, succeeded, and in any other status (all must succeed);
- daemon kills, attempts and preemptions, attempts by end reason, and the
  attempts whose node ended (by the market's meter) while no daemon ran;
- the daemon's exit code on SIGTERM at the end (must be 0);
- jobs whose final weights digest (the ``digest:`` line of the last
  attempt's node 0, from the provider's ``logs()``) differs from an
  uninterrupted run's of the same trainer;
- attempts launched twice: a client token more times in the simulated
  market's ``launches.log`` than the attempt has nodes;
- a job's end run twice: an attempt started after the job had an attempt end
  ``succeeded`` or after the job's first terminal event, a job with more than
  one terminal event, or with more than one attempt whose trainer finished
  (printed its digest);
- instances still running, and instances owned by no attempt;
- the ledger (``store.ledger()``, every job) against the simulated market's
  own meter (``usage()`` of every instance it launched, charged as
  ``spotd_sim.billing`` charges), to the cent, in total and per job. The
  market's meter bills instance time only: the ledger's egress lines (a
  checkpoint moved to another region or provider, priced from the catalog)
  are shown apart and left out of the comparison.

The temporary data dir (database, daemon log, the market's state, every
node's output) is removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path

from spotd.core.contracts import Metered, Provider
from spotd.core.values import AttemptEnd, AttemptRecord, JobRecord, JobStatus, NodeUsage
from spotd.daemon.config import load_settings
from spotd.daemon.wiring import build_providers
from spotd.store import SqlStore, open_store
from spotd_sim.billing import charge
from spotd_sim.clock import SimClock

TRAINER = Path(str(resources.files("spotd.examples") / "train_tiny.py"))
STEPS = 200
UP_SECONDS = (2.0, 8.0)
DOWN_SECONDS = (1.0, 20.0)
POLL_SECONDS = 0.25
SETTLE_SECONDS = 3.0
"""With every job ended, the daemon runs this long (some ten reaper passes) before it is
stopped: what it would still clean up is not counted against it."""
CENT = 0.005
GANG_NETWORK = "min_gbps_per_gpu = 10\n"
"""A gang's floor of scale-out bandwidth, as ``spotd demo --example ddp`` sets it: the
default rule rules out every one-GPU node of the simulated market for two nodes."""

CONFIG = """\
data_dir = "{root}"

[daemon]
host = "127.0.0.1"
port = 0
tick_seconds = 0.1
owner = "fault-run"
reap_every_ticks = 3

[scheduling]
cooldown_hours = 1.0

[providers.sim]
seed = {seed}
speed = 600
mean_up_hours = {up}
mean_down_hours = 1.0
boot_seconds = 120
epoch = 2026-02-02T00:00:00Z
"""

JOB = """\
name = "{name}"
command = ["{python}", "{trainer}", "--steps", "{steps}", "--ckpt-every", "5",
           "--step-seconds", "0.05"]

[resources]
gpus = ["A100"]
gpus_per_node = 1
nodes = {nodes}
{network}
[checkpoint]
uri = "{ckpt}"
"""


@dataclass(frozen=True)
class Options:
    jobs: int
    gangs: int
    minutes: float
    drain_minutes: float
    max_kills: int
    seed: int
    up_hours: float
    keep: bool
    json: bool


@dataclass(frozen=True)
class Setup:
    """The data dir and the config file the daemon and the CLI read."""

    root: Path
    config: Path


@dataclass
class Figure:
    """One printed line: a name, a value for people, one for JSON, and its check if any."""

    name: str
    text: str
    value: object
    ok: bool | None = None


@dataclass
class Chaos:
    """What the kill loop did."""

    kills: int = 0
    chaos_seconds: float = 0.0
    drain_seconds: float = 0.0
    down_seconds: float = 0.0
    stop_code: int | None = None
    outages: list[tuple[datetime, datetime]] = field(default_factory=list)
    """Simulated times from each kill to the restarted daemon's readiness."""


@dataclass(frozen=True)
class JobView:
    """One job as the store holds it at the end, with what its nodes printed."""

    job: JobRecord
    attempts: list[AttemptRecord]
    terminal_events: list[datetime]
    digests: dict[int, str] = field(default_factory=dict)
    """Attempt seq -> the digest its node 0 printed, for attempts whose trainer finished."""


# -- the daemon ---------------------------------------------------------------


class Daemon:
    """A ``spotd daemon`` process on the setup's config, its output appended to daemon.log."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        address = setup.root / "daemon.json"
        address.unlink(missing_ok=True)
        with (setup.root / "daemon.log").open("a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spotd", "daemon", "--config", str(setup.config)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self._wait_ready(address)

    def _wait_ready(self, address: Path, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with suppress(OSError, ValueError, KeyError):
                if json.loads(address.read_text())["pid"] == self.proc.pid:
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.proc.returncode}: {self.tail()}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"the daemon did not start in {timeout:.0f} s: {self.tail()}")

    def tail(self, lines: int = 20) -> str:
        return "\n".join((self.setup.root / "daemon.log").read_text().splitlines()[-lines:])

    @property
    def up(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM and wait; -9 when it had to be killed after 90 s."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9


def cli(setup: Setup, *args: str) -> str:
    """Run ``spotd ARGS --config ...``; its stdout, or RuntimeError naming what it said."""
    result = subprocess.run(
        [sys.executable, "-m", "spotd", *args, "--config", str(setup.config)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"spotd {' '.join(args)}: {result.stdout}{result.stderr}")
    return result.stdout


# -- setting up ---------------------------------------------------------------


def make_setup(root: Path, seed: int, up: float) -> Setup:
    config = root / "spotd.toml"
    config.write_text(CONFIG.format(root=root, seed=seed, up=up))
    return Setup(root, config)


def write_job(setup: Setup, name: str, nodes: int) -> Path:
    """A job file inside the data dir (so no workdir is shipped), its checkpoints its own."""
    path = setup.root / f"{name}.toml"
    path.write_text(JOB.format(name=name, python=sys.executable, trainer=TRAINER, steps=STEPS,
                               nodes=nodes, ckpt=f"ckpt-{name}",
                               network=GANG_NETWORK if nodes > 1 else ""))  # fmt: skip
    return path


def submit_all(setup: Setup, opts: Options) -> list[str]:
    """Submit the single-node jobs, then the two-node ones; their ids."""
    specs = [(f"single-{i}", 1) for i in range(opts.jobs)]
    specs += [(f"gang-{i}", 2) for i in range(opts.gangs)]
    ids = []
    for name, nodes in specs:
        shown = json.loads(cli(setup, "submit", str(write_job(setup, name, nodes)), "--json"))
        ids.append(str(shown["id"]))
    return ids


def uninterrupted_digest() -> str:
    """The digest of the same training run without spotd and without interruption."""
    out = subprocess.run(
        [sys.executable, str(TRAINER), "--steps", str(STEPS)],
        capture_output=True, text=True, check=True, timeout=300,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    ).stdout  # fmt: skip
    return digest_in(out) or ""


def digest_in(output: str) -> str | None:
    for line in output.splitlines():
        if line.startswith("digest: "):
            return line.split()[1]
    return None


# -- the kill loop ------------------------------------------------------------


def all_ended(store: SqlStore, ids: Sequence[str]) -> bool:
    wanted = set(ids)
    return all(j.status.terminal for j in store.list_jobs() if j.id in wanted)


def wait_ended(store: SqlStore, ids: Sequence[str], seconds: float) -> bool:
    """Poll the store for up to ``seconds``; True as soon as every job has ended."""
    until = time.monotonic() + seconds
    while True:
        if all_ended(store, ids):
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(min(POLL_SECONDS, max(0.0, until - time.monotonic())))


@dataclass(frozen=True)
class Session:
    """What the kill loop works on: the setup, the store, the jobs, the options, and
    every daemon started (the last one is the current one)."""

    setup: Setup
    store: SqlStore
    ids: list[str]
    opts: Options
    daemons: list[Daemon]


def kill_loop(session: Session, chaos: Chaos) -> None:
    """Kill and restart the daemon until the jobs ended, time is up or kills run out;
    the last daemon is then up."""
    opts, store, ids = session.opts, session.store, session.ids
    rng = random.Random(opts.seed)  # noqa: S311 - a repeatable schedule, not a secret
    clock = SimClock.open(session.setup.root / "sim")
    start = time.monotonic()
    deadline = start + opts.minutes * 60
    while chaos.kills < opts.max_kills:
        left = deadline - time.monotonic()
        if left <= 0 or wait_ended(store, ids, min(rng.uniform(*UP_SECONDS), left)):
            break
        if time.monotonic() >= deadline:
            break
        killed_at = clock.now()
        session.daemons[-1].kill()
        chaos.kills += 1
        down = min(rng.uniform(*DOWN_SECONDS), max(0.0, deadline - time.monotonic()))
        time.sleep(down)
        chaos.down_seconds += down
        session.daemons.append(Daemon(session.setup))
        chaos.outages.append((killed_at, clock.now()))
    chaos.chaos_seconds = time.monotonic() - start


def drain(session: Session, chaos: Chaos) -> None:
    """Leave the daemon alone until every job ended or ``--drain-minutes`` passed."""
    start = time.monotonic()
    wait_ended(session.store, session.ids, session.opts.drain_minutes * 60)
    chaos.drain_seconds = time.monotonic() - start


# -- reading the outcome ------------------------------------------------------


def job_views(
    store: SqlStore, ids: Sequence[str], providers: Mapping[str, Provider]
) -> list[JobView]:
    views = []
    for job_id in ids:
        attempts = sorted(store.attempts(job_id), key=lambda a: a.seq)
        ends = [e.at for e in store.events(job_id) if e.to_status.terminal]
        digests = {}
        for a in attempts:
            if a.instance_ids:
                found = digest_in(providers[a.pool.provider].logs(a.instance_ids[0]))
                if found is not None:
                    digests[a.seq] = found
        views.append(JobView(store.get_job(job_id), attempts, ends, digests))
    return views


def launches(setup: Setup) -> Counter[str]:
    """How many instances the simulated market launched per client token."""
    try:
        lines = (setup.root / "sim" / "launches.log").read_text().splitlines()
    except FileNotFoundError:
        return Counter()
    return Counter(line.split()[0] for line in lines if line.strip())


def late_attempts(view: JobView) -> list[int]:
    """Seqs of attempts started once the job had ended (a success, or a terminal event)."""
    cutoffs = [a.ended_at for a in view.attempts
               if a.end_reason is AttemptEnd.SUCCEEDED and a.ended_at is not None]  # fmt: skip
    cutoffs += view.terminal_events[:1]
    if not cutoffs:
        return []
    cutoff = min(cutoffs)
    succeeded = {a.seq for a in view.attempts if a.end_reason is AttemptEnd.SUCCEEDED}
    return [a.seq for a in view.attempts if a.started_at >= cutoff and a.seq not in succeeded]


def ends_run_twice(views: Sequence[JobView]) -> list[str]:
    """One line per job whose end ran more than once, saying how."""
    found = []
    for v in views:
        why = []
        late = late_attempts(v)
        if late:
            why.append(f"attempts {late} started after its end")
        if sum(a.end_reason is AttemptEnd.SUCCEEDED for a in v.attempts) > 1:
            why.append("more than one attempt succeeded")
        if len(v.terminal_events) > 1:
            why.append(f"{len(v.terminal_events)} terminal events")
        if len(v.digests) > 1:
            why.append(f"the trainer finished in attempts {sorted(v.digests)}")
        if why:
            found.append(f"{v.job.id}: {'; '.join(why)}")
    return found


def digest_mismatches(views: Sequence[JobView], expected: str,
                      providers: Mapping[str, Provider]) -> list[str]:  # fmt: skip
    """Succeeded jobs whose last attempt's node 0 did not print the uninterrupted digest."""
    bad = []
    for v in views:
        if v.job.status is not JobStatus.SUCCEEDED or not v.attempts:
            continue
        last = v.attempts[-1]
        logs = providers[last.pool.provider].logs(last.instance_ids[0]) if last.instance_ids else ""
        got = digest_in(logs)
        if got != expected:
            bad.append(f"{v.job.id}: attempt {last.seq} printed {got or 'no digest'}")
    return bad


def all_instances(providers: Mapping[str, Provider]) -> list[tuple[str, str, bool]]:
    """(provider, instance id, ended) of every instance each provider knows."""
    return [(name, i.id, i.ended) for name, p in providers.items() for i in p.list_instances({})]


def meter_usd(providers: Mapping[str, Provider], by_provider: Mapping[str, Sequence[str]],
              now: datetime) -> float:  # fmt: skip
    """What the simulated market's own meter charges for these instances, unrounded."""
    usd = 0.0
    for name, ids in by_provider.items():
        provider = providers.get(name)
        if isinstance(provider, Metered) and ids:
            usd += sum(charge(name, u, now) for u in provider.usage(ids).values())
    return usd


# -- the figures --------------------------------------------------------------


def job_figures(views: Sequence[JobView], opts: Options) -> list[Figure]:
    statuses = Counter(v.job.status.value for v in views)
    succeeded = statuses.pop(JobStatus.SUCCEEDED.value, 0)
    others = {s: n for s, n in sorted(statuses.items())}
    other_text = ", ".join(f"{n} {s}" for s, n in others.items()) or "none"
    return [
        Figure("jobs submitted", f"{len(views)} ({opts.jobs} single-node, {opts.gangs} two-node)",
               len(views)),
        Figure("jobs succeeded", str(succeeded), succeeded, succeeded == len(views)),
        Figure("jobs in other statuses", other_text, others, not others),
    ]  # fmt: skip


def run_figures(views: Sequence[JobView], chaos: Chaos,
                providers: Mapping[str, Provider]) -> list[Figure]:  # fmt: skip
    attempts = [a for v in views for a in v.attempts]
    down = ended_while_down(views, providers, chaos.outages)
    reasons = Counter(a.end_reason.value if a.end_reason else "open" for a in attempts)
    preempted = reasons.get(AttemptEnd.PREEMPTED.value, 0)
    by_reason = ", ".join(f"{n} {r}" for r, n in reasons.most_common())
    return [
        Figure("daemon kills", f"{chaos.kills} (down {chaos.down_seconds:.0f} s in all; "
               f"{chaos.chaos_seconds:.0f} s of kills, then {chaos.drain_seconds:.0f} s left "
               "alone)", chaos.kills),
        Figure("attempts", str(len(attempts)), len(attempts)),
        Figure("preemptions", str(preempted), preempted),
        Figure("attempts by end reason", by_reason or "none", dict(reasons)),
        Figure("attempts whose node ended while the daemon was down",
               f"{down.total()} ({', '.join(f'{n} {r}' for r, n in down.most_common())})"
               if down else "0", dict(down)),
        Figure("daemon stopped cleanly", f"exit code {chaos.stop_code}", chaos.stop_code,
               chaos.stop_code == 0),
    ]  # fmt: skip


def ended_while_down(views: Sequence[JobView], providers: Mapping[str, Provider],
                     outages: Sequence[tuple[datetime, datetime]]) -> Counter[str]:  # fmt: skip
    """End reasons of the attempts whose first node ended (by the market's meter) while no
    daemon ran: a preemption, a reclaim or an exit that a restarted daemon had to find."""
    found: Counter[str] = Counter()
    for a in (a for v in views for a in v.attempts if a.instance_ids):
        provider = providers.get(a.pool.provider)
        if not isinstance(provider, Metered):
            continue
        used = provider.usage(a.instance_ids[:1]).get(a.instance_ids[0])
        end = used.ended_at if used is not None else None
        if end is not None and any(k <= end < r for k, r in outages):
            found[a.end_reason.value if a.end_reason else "open"] += 1
    return found


def listed(items: Sequence[str]) -> str:
    return str(len(items)) + (f" ({'; '.join(items)})" if items else "")


def safety_figures(setup: Setup, views: Sequence[JobView], expected: str,
                   providers: Mapping[str, Provider]) -> list[Figure]:  # fmt: skip
    attempts = [a for v in views for a in v.attempts]
    tokens = launches(setup)
    twice = [f"{a.job_id} attempt {a.seq}: {tokens[a.client_token]} launches for {a.nodes} nodes"
             for a in attempts if tokens[a.client_token] > a.nodes]  # fmt: skip
    owned = {i for a in attempts for i in a.instance_ids}
    instances = all_instances(providers)
    running = [f"{p} {i}" for p, i, ended in instances if not ended]
    orphans = [f"{p} {i}" for p, i, _ in instances if i not in owned]
    mismatched = digest_mismatches(views, expected, providers)
    twice_ended = ends_run_twice(views)
    return [
        Figure("final weights differing from the uninterrupted run", listed(mismatched),
               mismatched, not mismatched),
        Figure("attempts launched twice", listed(twice), twice, not twice),
        Figure("jobs whose end ran twice", listed(twice_ended), twice_ended, not twice_ended),
        Figure("instances still running", listed(running), running, not running),
        Figure("instances owned by no attempt", listed(orphans), orphans, not orphans),
    ]  # fmt: skip


@dataclass(frozen=True)
class AttemptBill:
    """One attempt's instance time as the ledger bills it and as the market's meter does."""

    ledger: float | None
    """USD of its compute and changeover lines; None: it has no line."""
    meter: float
    nodes_ended: datetime | None
    """When its last node ended, by the meter; None while one runs (or none launched)."""

    @property
    def differs(self) -> bool:
        return abs((self.ledger or 0.0) - self.meter) >= CENT


def attempt_bills(store: SqlStore, views: Sequence[JobView], providers: Mapping[str, Provider],
                  now: datetime) -> dict[tuple[str, int], AttemptBill]:  # fmt: skip
    """Every attempt's bill by (job id, seq)."""
    billed: dict[tuple[str, int], float] = {}
    for e in store.ledger():
        if e.kind != "egress":
            billed[e.job_id, e.attempt] = billed.get((e.job_id, e.attempt), 0.0) + e.usd
    bills = {}
    for a in (a for v in views for a in v.attempts):
        provider = providers.get(a.pool.provider)
        used: Mapping[str, NodeUsage] = (
            provider.usage(a.instance_ids) if isinstance(provider, Metered) else {}
        )
        ends = [u.ended_at for u in used.values() if u.ended_at is not None]
        last = max(ends) if ends and len(ends) == len(used) else None
        metered = sum((charge(a.pool.provider, u, now) for u in used.values()), 0.0)
        bills[a.job_id, a.seq] = AttemptBill(billed.get((a.job_id, a.seq)), metered, last)
    return bills


Bills = Mapping[tuple[str, int], AttemptBill]


def ledger_figures(store: SqlStore, views: Sequence[JobView], providers: Mapping[str, Provider],
                   bills: Bills, now: datetime) -> list[Figure]:  # fmt: skip
    entries = store.ledger()
    total = sum(e.usd for e in entries)
    egress = sum(e.usd for e in entries if e.kind == "egress")
    nodes = total - egress
    every: dict[str, list[str]] = {}
    for name, iid, _ in all_instances(providers):
        every.setdefault(name, []).append(iid)
    meter = meter_usd(providers, every, now)
    closed = [a for v in views for a in v.attempts if not a.open and a.instance_ids]
    unbilled = [f"{a.job_id} attempt {a.seq} ({a.end_reason.value if a.end_reason else '?'})"
                for a in closed if bills[a.job_id, a.seq].ledger is None]  # fmt: skip
    differ = [f"{a.job_id} attempt {a.seq} ({a.end_reason.value if a.end_reason else '?'}): "
              f"ledger {bills[a.job_id, a.seq].ledger or 0.0:.4f}, "
              f"meter {bills[a.job_id, a.seq].meter:.4f}"
              for a in closed if bills[a.job_id, a.seq].differs]  # fmt: skip
    return [
        Figure("ledger total USD", f"{total:.2f} ({nodes:.2f} instance time, {egress:.2f} egress)",
               {"total": round(total, 4), "instance_time": round(nodes, 4),
                "egress": round(egress, 4)}),
        Figure("market meter USD (every instance it launched)", f"{meter:.2f}", round(meter, 4)),
        Figure("ledger instance time minus market meter USD", f"{nodes - meter:+.4f}",
               round(nodes - meter, 4), abs(nodes - meter) < CENT),
        Figure("ended attempts with nodes but no ledger line", listed(unbilled), unbilled,
               not unbilled),
        Figure("attempts whose ledger differs from the meter by a cent or more", listed(differ),
               differ, not differ),
    ]  # fmt: skip


def worth_a_look(v: JobView, bills: Bills) -> bool:
    """Whether a job did anything but succeed once with every attempt billed as metered."""
    billed_right = all(not bills[a.job_id, a.seq].differs for a in v.attempts)
    once = not late_attempts(v) and len(v.digests) <= 1
    return v.job.status is not JobStatus.SUCCEEDED or not once or not billed_right


def attempt_line(a: AttemptRecord, v: JobView, bill: AttemptBill) -> str:
    def at(moment: datetime | None) -> str:
        return f"{moment:%d %H:%M:%S}" if moment else "-"

    ledger = f"{bill.ledger:.4f}" if bill.ledger is not None else "no line"
    return (f"    attempt {a.seq} {a.pool.provider}/{a.pool.zone} started {at(a.started_at)}, "
            f"running {at(a.running_at)}, ended {at(a.ended_at)} "
            f"{a.end_reason.value if a.end_reason else 'open'}"
            f"{', trainer finished' if a.seq in v.digests else ''}; nodes ended "
            f"{at(bill.nodes_ended)}; ledger {ledger}, meter {bill.meter:.4f}")  # fmt: skip


def evidence(store: SqlStore, views: Sequence[JobView], bills: Bills,
             most: int = 12) -> list[str]:  # fmt: skip
    """For each job worth a look: its last attempts with their bills, and its last events
    (the repeated ``waiting`` events counted, not listed). Times are simulated."""
    lines = []
    for v in (v for v in views if worth_a_look(v, bills)):
        failure = v.job.failure.value if v.job.failure else "none"
        lines.append(f"  {v.job.id} ({v.job.name}): {v.job.status.value}, failure {failure}, "
                     f"{len(v.attempts)} attempts")  # fmt: skip
        lines += [attempt_line(a, v, bills[a.job_id, a.seq]) for a in v.attempts[-most:]]
        events = store.events(v.job.id)
        told = [e for e in events if e.cause != "waiting"]
        lines.append(f"    events: {len(events)}, {len(events) - len(told)} of them 'waiting'")
        lines += [f"    event {e.at:%d %H:%M:%S} {e.from_status} -> {e.to_status} {e.cause}: "
                  f"{e.detail[:160]}" for e in told[-most:]]  # fmt: skip
    return lines


# -- the run ------------------------------------------------------------------


def measure(setup: Setup, store: SqlStore, ids: Sequence[str], chaos: Chaos,
            opts: Options) -> tuple[list[Figure], list[str]]:  # fmt: skip
    """Every figure, from the store, the market's files and its providers."""
    clock, providers = build_providers(load_settings(setup.config))
    now = clock.now()
    views = job_views(store, ids, providers)
    bills = attempt_bills(store, views, providers, now)
    expected = uninterrupted_digest()
    figures = [
        *job_figures(views, opts),
        *run_figures(views, chaos, providers),
        *safety_figures(setup, views, expected, providers),
        *ledger_figures(store, views, providers, bills, now),
    ]
    return figures, evidence(store, views, bills)


def stop_leftovers(setup: Setup) -> None:
    """Terminate any instance still running, so no node process outlives the run."""
    with suppress(Exception):
        _, providers = build_providers(load_settings(setup.config))
        for provider in providers.values():
            live = [i.id for i in provider.list_instances({}) if not i.ended]
            if live:
                provider.terminate(live)


def report(figures: Sequence[Figure], notes: Sequence[str], as_json: bool) -> bool:
    checks = [f for f in figures if f.ok is not None]
    failed = [f.name for f in checks if not f.ok]
    verdict = f"FAIL ({', '.join(failed)})" if failed else f"PASS (all {len(checks)} checks)"
    if as_json:
        print(json.dumps({"figures": {f.name: f.value for f in figures},
                          "checks": {f.name: f.ok for f in checks},
                          "verdict": "fail" if failed else "pass", "failed": failed,
                          "evidence": list(notes)}, indent=1))  # fmt: skip
        return not failed
    for f in figures:
        print(f"{f.name}: {f.text}{' [FAIL]' if f.ok is False else ''}")
    if notes:
        print("jobs to look at:")
        print("\n".join(notes))
    print(f"verdict: {verdict}")
    return not failed


@contextmanager
def daemon_guard(setup: Setup) -> Iterator[list[Daemon]]:
    """Holds every daemon started; on an error, kills those still up and the nodes left."""
    held: list[Daemon] = []
    try:
        yield held
    except BaseException:
        for d in held:
            if d.up:
                d.kill()
        stop_leftovers(setup)
        raise


def run(opts: Options, root: Path) -> bool:
    setup = make_setup(root, opts.seed, opts.up_hours)
    chaos = Chaos()
    with daemon_guard(setup) as held:
        held.append(Daemon(setup))
        store = open_store(f"sqlite:///{root / 'spotd.db'}")
        try:
            ids = submit_all(setup, opts)
            session = Session(setup, store, ids, opts, held)
            kill_loop(session, chaos)
            drain(session, chaos)
            if all_ended(store, ids):
                time.sleep(SETTLE_SECONDS)
            chaos.stop_code = held[-1].stop()
            figures, notes = measure(setup, store, ids, chaos, opts)
        finally:
            store.close()
    stop_leftovers(setup)
    return report(figures, notes, opts.json)


def parse(argv: Sequence[str] | None = None) -> Options:
    args = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    args.add_argument("--jobs", type=int, default=12, help="single-node jobs (12)")
    args.add_argument("--gangs", type=int, default=2, help="two-node jobs (2)")
    args.add_argument("--minutes", type=float, default=8.0, help="longest kill loop (8)")
    args.add_argument(
        "--drain-minutes",
        type=float,
        default=2.0,
        help="then, with no more kills, longest wait for the jobs left (2)",
    )
    args.add_argument("--max-kills", type=int, default=200, help="most kills (200)")
    args.add_argument("--seed", type=int, default=7, help="market and kill schedule (7)")
    args.add_argument(
        "--up-hours",
        type=float,
        default=2.0,
        help="the market's mean_up_hours, simulated (2.0: 12 real s)",
    )
    args.add_argument("--keep", action="store_true", help="keep the data dir")
    args.add_argument("--json", action="store_true", help="the figures as JSON")
    ns = args.parse_args(argv)
    return Options(ns.jobs, ns.gangs, ns.minutes, ns.drain_minutes, ns.max_kills, ns.seed,
                   ns.up_hours, ns.keep, ns.json)  # fmt: skip


def main() -> None:
    opts = parse()
    root = Path(tempfile.mkdtemp(prefix="spotd-fault-"))
    try:
        ok = run(opts, root)
    finally:
        if opts.keep:
            print(f"data dir kept: {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
