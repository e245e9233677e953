"""spotd.agent.ranks: the ranks' files in the run folder, what the agent sees of each
rank's process, and the heartbeat that carries both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from spotd.agent.config import AgentConfig
from spotd.agent.ranks import job_ranks, process_state, read_ranks
from spotd.agent.runner import run_agent
from spotd.core.agent_wire import IMAGE, AgentReport, HeartbeatReport
from spotd.core.ranks import RankState, rank_file_name

linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def write_rank(run_dir: Path, rank: int, step: int, pid: int | None) -> None:
    body = {"rank": rank, "step": step, "pid": pid, "at": "2026-01-01T00:00:00+00:00"}
    (run_dir / rank_file_name(rank)).write_text(json.dumps(body))


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live child process, killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


@linux_only
def test_each_rank_with_the_state_of_its_process(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process any more
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        # Exited, not reaped: a zombie until the wait below.
        assert wait_for(lambda: process_state(zombie.pid) is RankState.DEAD)
        assert wait_for(lambda: process_state(stopped.pid) is RankState.STOPPED)
        for rank, proc in enumerate((sleeper, stopped, zombie, gone)):
            write_rank(tmp_path, rank, 10 + rank, proc.pid)
        write_rank(tmp_path, 11, 5, None)  # rank 11 sorts after rank 3, not between 1 and 2
        (tmp_path / rank_file_name(12)).write_text("{half a fi")
        (tmp_path / f".{rank_file_name(13)}.tmp-1234").write_text("{}")  # a write under way
        readings = read_ranks(tmp_path)
    finally:
        stopped.kill()
        stopped.wait()
        zombie.wait()
    assert [(r.rank, r.step, r.state) for r in readings] == [
        (0, 10, RankState.RUNNING), (1, 11, RankState.STOPPED), (2, 12, RankState.DEAD),
        (3, 13, RankState.DEAD), (11, 5, RankState.UNKNOWN),
    ]  # fmt: skip
    assert readings[0].pid == sleeper.pid


def test_a_job_in_an_image_has_pids_the_agent_cannot_see(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    write_rank(tmp_path, 0, 4, sleeper.pid)
    (reading,) = job_ranks(tmp_path, {IMAGE: "ghcr.io/acme/train:1"})
    assert (reading.step, reading.state) == (4, RankState.UNKNOWN)
    (seen,) = job_ranks(tmp_path, {})
    assert seen.state is RankState.RUNNING
    assert read_ranks(tmp_path / "nowhere") == ()


def test_without_proc_a_signal_zero_tells_live_from_dead(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert process_state(sleeper.pid, tmp_path / "no-proc") is RankState.RUNNING
    assert process_state(gone.pid, tmp_path / "no-proc") is RankState.DEAD
    assert process_state(0) is RankState.UNKNOWN


# A job that trains with spotd.train (no torch: one rank) to step 5 (its single progress
# file written at once, its rank file within a second), then waits for its
# release file; its own pid goes to a file for the test.
JOB = """
import os, pathlib, sys, time
from spotd.train import Run
release, pid_file = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with Run.from_env() as run:
    run.restore({})
    run.report(5, total_steps=10, force=True)
    pid_file.write_text(str(os.getpid()))
    end = time.monotonic() + 30
    while not release.exists() and time.monotonic() < end:
        time.sleep(0.02)
"""


def at_five(beat: HeartbeatReport) -> bool:
    return bool(beat.ranks) and beat.ranks[0].step == 5


def test_the_heartbeat_carries_each_rank_and_the_single_progress_file(tmp_path: Path) -> None:
    script, release, pid_file = tmp_path / "job.py", tmp_path / "release", tmp_path / "pid"
    script.write_text(JOB)
    beats: list[HeartbeatReport] = []
    lock = threading.Lock()

    def send(report: AgentReport) -> None:
        if isinstance(report, HeartbeatReport):
            with lock:
                beats.append(report)

    config = AgentConfig.model_validate({
        "provider": "none", "token": SecretStr("t"), "job_id": "j-1", "attempt": 1,
        "instance_id": "vm-1", "command": (sys.executable, str(script), str(release),
                                           str(pid_file)),
        "heartbeat_seconds": 0.05, "job_env": dict(os.environ), "run_dir": str(tmp_path / "run"),
    })  # fmt: skip
    agent = threading.Thread(target=run_agent, args=(config,), kwargs={"send": send},
                             daemon=True)  # fmt: skip
    agent.start()
    try:
        assert wait_for(pid_file.exists), "the job did not start"
        # The file says step 0 (the restore) first; step 5 follows within a second, while
        # the job does nothing more (spotd.train.ranks writes a step it held back).
        assert wait_for(lambda: any(at_five(b) for b in list(beats))), "no heartbeat of step 5"
    finally:
        release.write_text("go")
        agent.join(20)
    beat = next(b for b in list(beats) if at_five(b))
    (rank0,) = beat.ranks
    assert (rank0.rank, rank0.step, rank0.pid) == (0, 5, int(pid_file.read_text()))
    assert rank0.state in (RankState.RUNNING, RankState.UNKNOWN)
    if Path("/proc/self/stat").exists():
        assert rank0.state is RankState.RUNNING
    assert (beat.step, beat.total_steps) == (5, 10), "the single progress file as before"
