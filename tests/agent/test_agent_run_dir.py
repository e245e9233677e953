"""The agent leaves nothing in the temporary directory, however it ends.

Without ``SPOTD_AGENT_RUN_DIR`` (a cloud node) the agent makes its run folder
in the temporary directory; it removes it when the job ended by itself, when
the node stopped it (SIGTERM, or SIGINT by hand) and after a preemption
notice. The agent runs as ``python -m spotd.agent``, a process of its own,
pointed at a temporary directory of the test's (``TMPDIR``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotd.core.values import InstanceState
from spotd_sim.records import VmStatus

# The job makes a temporary folder of its own (in the TMPDIR it was given, which the
# node's temporary directory was not), says where its run folder is (the parent of its
# progress file), then exits
# with its first argument, or waits for a signal when that is "wait" (143 on SIGTERM,
# after noting whether the agent had written the notice file by then).
JOB = """
import os, pathlib, signal, sys, tempfile, time
tempfile.mkdtemp(prefix="torchelastic_")  # what a launcher such as torchrun leaves
seen = pathlib.Path(sys.argv[1])
progress = pathlib.Path(os.environ["SPOTD_PROGRESS_FILE"])
progress.write_text('{"step": 1, "total_steps": 2}')
def stop(signum, frame):
    notice = pathlib.Path(os.environ["SPOTD_NOTICE_FILE"]).exists()
    (seen.parent / "stopped").write_text(f"{signum} notice={notice}")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
seen.write_text(str(progress.parent))
if sys.argv[2] != "wait":
    sys.exit(int(sys.argv[2]))
end = time.monotonic() + 30
while time.monotonic() < end:
    time.sleep(0.02)
sys.exit(9)
"""


def start_agent(tmp_path: Path, end: str, **settings: str) -> subprocess.Popen[bytes]:
    """The agent around JOB, with ``TMPDIR`` a folder of its own under ``tmp_path``."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTD_")}
    env.update(TMPDIR=str(tmp_path / "tmp"), SPOTD_AGENT_JOB_ID="j-1", SPOTD_AGENT_ATTEMPT="1",
               SPOTD_AGENT_INSTANCE_ID="i-1", SPOTD_AGENT_HEARTBEAT_SECONDS="0.05")  # fmt: skip
    env.update(settings)
    argv = [sys.executable, "-m", "spotd.agent", "--",
            sys.executable, "-c", JOB, str(tmp_path / "seen"), end]  # fmt: skip
    return subprocess.Popen(argv, env=env)


def run_folder(tmp_path: Path, timeout: float = 20.0) -> Path:
    """The run folder the job saw, once it has said where it is."""
    seen = tmp_path / "seen"
    limit = time.monotonic() + timeout
    while not seen.exists() or not seen.read_text():
        assert time.monotonic() < limit, "the job never started"
        time.sleep(0.02)
    return Path(seen.read_text())


def assert_nothing_left(tmp_path: Path, folder: Path) -> None:
    assert folder.parent == tmp_path / "tmp"  # it was made in the temporary directory
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("code", [0, 3])
def test_a_job_that_ends_by_itself(tmp_path: Path, code: int) -> None:
    agent = start_agent(tmp_path, str(code))
    assert agent.wait(timeout=30) == code
    assert_nothing_left(tmp_path, run_folder(tmp_path))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_node_stopped_by_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    agent = start_agent(tmp_path, "wait")
    folder = run_folder(tmp_path)
    assert folder.is_dir()
    agent.send_signal(sig)
    assert agent.wait(timeout=30) == 143  # the job's code: it stopped on the forwarded signal
    assert (tmp_path / "stopped").read_text().startswith(str(int(sig)))
    assert_nothing_left(tmp_path, folder)


def test_a_preemption_notice(tmp_path: Path) -> None:
    """The watch thread writes the notice file into the run folder, then the job goes."""
    state = tmp_path / "i-1.state.json"
    watch = {"SPOTD_AGENT_PROVIDER": "sim", "SPOTD_AGENT_SIM_STATE": str(state),
             "SPOTD_AGENT_POLL_SECONDS": "0.05"}  # fmt: skip
    agent = start_agent(tmp_path, "wait", **watch)
    folder = run_folder(tmp_path)
    now = datetime.now(UTC)
    notice = VmStatus(InstanceState.NOTICE, None, now, notice_at=now,
                      kill_at=now + timedelta(seconds=30))  # fmt: skip
    state.write_text(json.dumps(notice.to_json()))
    assert agent.wait(timeout=30) == 143
    assert (tmp_path / "stopped").read_text() == f"{int(signal.SIGTERM)} notice=True"
    assert_nothing_left(tmp_path, folder)


def test_a_temporary_folder_the_job_was_given_is_its_own(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    agent = start_agent(tmp_path, "0", TMPDIR=str(scratch), SPOTD_JOB_TMPDIR="1")
    assert agent.wait(timeout=30) == 0
    assert [p.name.split("_")[0] for p in scratch.iterdir()] == ["torchelastic"]


def test_a_configured_run_folder_is_left_to_whoever_configured_it(tmp_path: Path) -> None:
    mine = tmp_path / "run"
    agent = start_agent(tmp_path, "0", SPOTD_AGENT_RUN_DIR=str(mine))
    assert agent.wait(timeout=30) == 0
    assert run_folder(tmp_path) == mine
    assert (mine / "progress.json").exists()
    assert list((tmp_path / "tmp").iterdir()) == []
