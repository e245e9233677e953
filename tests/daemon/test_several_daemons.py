"""Three daemons on one PostgreSQL database and one simulated market; the leader is killed.

Each daemon has its own data_dir and owner; they share the database and the
simulated market's folder (``providers.sim.state_dir``), as three hosts share
a database and a cloud. Their clocks disagree by more than the lease (faked
with libfaketime: one on time, one ahead, one behind). Jobs are split by
leases on the database's clock; the leader (an advisory lock) writes the
price history and reaps every owner's orphans. SIGKILL of the leader: its
jobs' leases run out and the others take them over, another daemon leads
within two seconds, every job finishes once, no attempt is launched twice,
and every attempt is stamped and billed on the one shared clock.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from daemon_support import STEPS, TRAINER, Daemon, Setup, wait_for
from sqlalchemy import text

from spotd.core.states import JobStatus
from spotd.daemon.config import load_settings
from spotd.daemon.wiring import build_providers
from spotd.store import open_store
from spotd_sim import SimClock

pytestmark = pytest.mark.postgres

def _faketime() -> Path | None:
    """The preloadable library of the ``libfaketime`` wheel (found, not imported)."""
    spec = importlib.util.find_spec("libfaketime")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(next(iter(spec.submodule_search_locations)))
    found = package / "vendor/libfaketime/src/libfaketime.so.1"
    return found if found.is_file() else None


FAKETIME = _faketime()
SKEWS = (0, 5, -5)
"""Each daemon's clock offset in seconds: more than the 2 s lease apart, and at the
market's speed of 600 a five-second skew is fifty simulated minutes."""
SPEED = 600

CONFIG = """
data_dir = "{root}"
database_url = "{db}"

[daemon]
port = 0
tick_seconds = 0.1
owner = "{owner}"
lease_seconds = 2
reap_every_ticks = 3

[providers.sim]
state_dir = "{sim}"
seed = 5
speed = {speed}
mean_up_hours = 500
mean_down_hours = 1.0
boot_seconds = 30
epoch = 2026-02-02T00:00:00Z
"""

JOB = """
name = "tiny-{n}"
command = ["{python}", "{trainer}", "--steps", "{steps}", "--ckpt-every", "5",
           "--step-seconds", "0.1"]
[resources]
gpus = ["A100"]
gpus_per_node = 1
"""

LEADS = re.compile(r"^\S+ \S+ INFO .*this daemon now leads", re.MULTILINE)


def _setup(tmp_path: Path, pg_url: str, n: int) -> Setup:
    root = tmp_path / f"daemon-{n}"
    root.mkdir()
    config = root / "spotd.toml"
    config.write_text(CONFIG.format(root=root, db=pg_url, owner=f"host-{n}",
                                    sim=tmp_path / "market", speed=SPEED))  # fmt: skip
    return Setup(root, config, root / "job.toml")


def _skewed(seconds: int) -> dict[str, str]:
    """The environment of a process whose wall clock is ``seconds`` off.

    The monotonic clock stays real: timeouts and sleeps keep their length.
    """
    env = dict(os.environ)
    if seconds:
        env |= {"LD_PRELOAD": str(FAKETIME), "FAKETIME": f"{seconds:+d}",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1"}  # fmt: skip
    return env


def _leads(setup: Setup) -> bool:
    return bool(LEADS.search((setup.root / "daemon.log").read_text()))


@pytest.mark.skipif(
    FAKETIME is None, reason="the libfaketime wheel is not installed (pip install -e '.[test]')"
)
def test_the_leader_dies_and_the_others_finish_every_job_once(
    tmp_path: Path, pg_url: str
) -> None:
    setups = [_setup(tmp_path, pg_url, n) for n in range(3)]
    daemons = [Daemon(s, env=_skewed(skew)) for s, skew in zip(setups, SKEWS, strict=True)]
    reference = SimClock.open(tmp_path / "market")  # this process's clock is not skewed
    began = reference.now()
    store = open_store(pg_url)
    try:
        ids = []
        for n in range(6):
            # In the submitting daemon's data_dir: a job file elsewhere would have its
            # folder shipped (no workdir), another daemon's database with it.
            job = setups[n % 3].root / f"job-{n}.toml"
            job.write_text(JOB.format(n=n, python=sys.executable, trainer=TRAINER, steps=STEPS))
            ids.append(json.loads(setups[n % 3].cli("submit", str(job), "--json").stdout)["id"])
        limit = time.monotonic() + 30
        while sum(map(_leads, setups)) != 1:
            assert time.monotonic() < limit, "no single leader"
            time.sleep(0.1)
        leader = next(i for i, s in enumerate(setups) if _leads(s))
        # The leader dies while one of its jobs runs.
        limit = time.monotonic() + 120
        while not any(j.owner == f"host-{leader}" and j.status is JobStatus.RUNNING
                      for j in map(store.get_job, ids)):  # fmt: skip
            assert time.monotonic() < limit, "the leader never ran a job"
            time.sleep(0.1)
        daemons[leader].kill()
        killed = time.monotonic()
        # Read after the kill: the dead daemon changes nothing more.
        orphaned = [i for i in ids if (j := store.get_job(i)).owner == f"host-{leader}"
                    and not j.status.terminal]  # fmt: skip
        others = [s for i, s in enumerate(setups) if i != leader]
        while not any(map(_leads, others)):
            assert time.monotonic() - killed < 10, "nobody took over the leadership"
            time.sleep(0.05)
        took_over = time.monotonic() - killed
        for job_id in ids:
            wait_for(store, job_id, lambda j, _: j.status.terminal, timeout=180)
        # A job's ledger is written just after its terminal move, in the same pass.
        billed_by = time.monotonic() + 10
        while not all(store.ledger_for(ids).values()) and time.monotonic() < billed_by:
            time.sleep(0.1)
        owners = {store.get_job(i).owner for i in orphaned}
        jobs = [store.get_job(i) for i in ids]
        attempts = {i: store.attempts(i) for i in ids}
        events = {i: store.events(i) for i in ids}
        ledger = store.ledger_for(ids)
        finished = reference.now()
        with store.engine.connect() as conn:
            rows = conn.execute(text("SELECT provider, count FROM published_offerings"))
            published = {row.provider: row.count for row in rows}
    finally:
        for i, daemon in enumerate(daemons):
            if daemon.proc.poll() is None:
                assert daemon.stop() == 0, (setups[i].root / "daemon.log").read_text()[-3000:]
        store.close()
    assert took_over < 2.0, f"the leadership passed on in {took_over:.2f} s"
    assert all(j.status is JobStatus.SUCCEEDED for j in jobs), [j.status for j in jobs]
    for job_id in ids:
        ended = [e for e in events[job_id] if e.to_status is JobStatus.SUCCEEDED]
        assert len(ended) == 1, f"{job_id} finished {len(ended)} times"
    assert orphaned and f"host-{leader}" not in owners, "the dead daemon's jobs were taken over"
    # No attempt launched twice: one simulated VM per attempt, however many daemons.
    settings = load_settings(setups[(leader + 1) % 3].config)
    _, providers = build_providers(settings)
    vms = Counter(
        (vm.tags["spotd-job"], vm.tags["spotd-attempt"])
        for provider in providers.values() for vm in provider.list_instances({})
        if vm.tags.get("spotd-job") in ids
    )  # fmt: skip
    assert vms and set(vms.values()) == {1}
    # The leader polls each provider's market for everyone and publishes it.
    assert set(published) == set(providers) and all(published.values()), published
    assert sum(len(a) for a in attempts.values()) == len(vms)
    # One clock: every attempt and every billed line lies within the test's span
    # on the unskewed reference; a daemon on its own clock would stamp them fifty
    # simulated minutes off, and bill an attempt begun by one and ended by another
    # across the two.
    slack = timedelta(seconds=SPEED * 0.5)  # half a real second
    for job_id in ids:
        for a in attempts[job_id]:
            assert a.ended_at is not None
            assert began - slack <= a.started_at <= a.ended_at <= finished + slack, a
            if a.running_at is not None:
                assert a.started_at <= a.running_at <= a.ended_at, a
        assert ledger[job_id], f"{job_id} was never billed"
        for line in ledger[job_id]:
            assert began - slack <= line.start <= line.end <= finished + slack, line
