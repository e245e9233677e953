"""A team's higher-priority job takes a running job's place, for real: a daemon process,
agents on simulated nodes, the tiny trainer. The low job hears the daemon's stop as a
preemption notice, checkpoints and leaves, waits with the reason shown while the high
one runs, then resumes from its checkpoint and ends with the weights of a run never
stopped."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_support import STEPS, TRAINER, Daemon, Setup, make_setup, wait_for

from spotd import checkpoints
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd, EventCause
from spotd.store import SqlStore, open_store

pytestmark = pytest.mark.slow

TEAM = """
[teams.ml]
max_running_jobs = 1
"""

JOB = """
name = "{name}"
team = "ml"
priority = {priority}
command = ["{python}", "{trainer}", "--steps", "{steps}", "--ckpt-every", "5",
           "--step-seconds", "0.1"]
[resources]
gpus = ["A100"]
gpus_per_node = 1
[checkpoint]
uri = "{ckpt}"
"""


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    # Markets that do not preempt within the test: every stop is the daemon's own.
    made = make_setup(tmp_path, seed=5, up=5000.0)
    made.config.write_text(made.config.read_text() + TEAM)
    return made


@pytest.fixture
def store(setup: Setup) -> Iterator[SqlStore]:
    s = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    yield s
    s.close()


def submit(setup: Setup, name: str, priority: int, steps: int) -> str:
    job_file = setup.root / f"{name}.toml"
    job_file.write_text(JOB.format(name=name, priority=priority, python=sys.executable,
                                   trainer=TRAINER, steps=steps,
                                   ckpt=setup.root / f"ckpt-{name}"))  # fmt: skip
    job: dict[str, str] = json.loads(setup.cli("submit", str(job_file), "--json").stdout)
    return job["id"]


def test_a_higher_priority_job_takes_the_place_and_the_lower_one_resumes(
    setup: Setup, store: SqlStore
) -> None:
    daemon = Daemon(setup)
    try:
        low = submit(setup, "low", 0, STEPS)
        # Running, with a checkpoint behind it (every 5 steps of 0.1 s).
        wait_for(store, low, lambda j, _: j.status is JobStatus.RUNNING)
        saved = setup.root / "ckpt-low"
        wait_for(store, low, lambda j, _: checkpoints.latest_complete(str(saved)) is not None)
        high = submit(setup, "high", 10, STEPS // 4)
        wait_for(store, high, lambda j, _: j.status.terminal, timeout=120)
        wait_for(store, low, lambda j, _: j.status.terminal, timeout=120)
        shown = setup.cli("status", low).stdout
        logs = setup.cli("logs", low).stdout
    finally:
        assert daemon.stop() == 0
    assert store.get_job(high).status is JobStatus.SUCCEEDED
    assert store.get_job(low).status is JobStatus.SUCCEEDED, store.events(low)
    first, *rest = store.attempts(low)
    assert first.end_reason is AttemptEnd.YIELDED
    assert rest and rest[0].resume_from is not None  # from its checkpoint, not step 0
    # The high job ran while the low one waited, not beside it.
    (ran,) = store.attempts(high)
    assert ran.running_at is not None and first.ended_at is not None
    assert ran.running_at >= first.ended_at
    causes = [e.cause for e in store.events(low)]
    assert EventCause.YIELDING in causes and AttemptEnd.YIELDED in causes
    assert "yielded" in shown
    # The job heard a preemption notice: it checkpointed and left with 143, as on a
    # spot reclaim, and its last run printed the weights of an uninterrupted one.
    (said,) = [r for r in store.reports(low) if r.attempt == first.seq]
    assert said.notice_kind == "preemption" and said.exit_code == 143
    assert f"digest: {uninterrupted(STEPS)}" in logs


def uninterrupted(steps: int) -> str:
    out = subprocess.run([sys.executable, str(TRAINER), "--steps", str(steps)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return out.split("digest: ")[1].split()[0]
