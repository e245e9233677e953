"""spotd.agent.oom: the OOM killer's count in the agent's cgroup, and the agent's exit
report carrying the kills that came while its job ran."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from spotd.agent import AgentConfig, run_agent, runner
from spotd.agent.oom import kills_between, oom_kill_count
from spotd.exits import kept_exits


def tree(root: Path, proc: str, files: dict[str, str]) -> Path:
    """A fake ``/sys/fs/cgroup`` under ``root`` and a ``/proc/self/cgroup`` saying ``proc``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    cgroup = root / "proc-self-cgroup"
    cgroup.write_text(proc)
    return cgroup


def test_cgroup_v2_memory_events_give_the_count(tmp_path: Path) -> None:
    events = "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n"
    proc = tree(tmp_path, "0::/system.slice/spotd-agent.service\n",
                {"system.slice/spotd-agent.service/memory.events": events})  # fmt: skip
    assert oom_kill_count(tmp_path, proc) == 2


def test_cgroup_v1_oom_control_gives_the_count(tmp_path: Path) -> None:
    """A hybrid host: the v2 line names a folder without memory files, v1's has them."""
    control = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"
    proc = tree(tmp_path, "4:memory:/agent\n1:cpu:/\n0::/\n",
                {"memory/agent/memory.oom_control": control})  # fmt: skip
    assert oom_kill_count(tmp_path, proc) == 5


@pytest.mark.parametrize(
    ("proc", "files"),
    [
        ("0::/a\n", {}),  # no memory controller there
        ("0::/a\n", {"a/memory.events": "oom 1\n"}),  # an old kernel without the count
        ("0::/a\n", {"a/memory.events": "oom_kill many\n"}),
        ("1:cpu:/\n", {}),
    ],
)
def test_no_count_where_the_machine_does_not_say(
    tmp_path: Path, proc: str, files: dict[str, str]
) -> None:
    assert oom_kill_count(tmp_path, tree(tmp_path, proc, files)) is None
    assert oom_kill_count(tmp_path, tmp_path / "no-such-file") is None


def test_kills_between_two_counts() -> None:
    assert kills_between(2, 5) == 3
    assert kills_between(5, 5) == 0
    assert kills_between(None, 5) is None and kills_between(5, None) is None


def test_the_exit_report_carries_the_kills_that_came_while_the_job_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent reads the count before it starts the job and after the job ends; a job
    the OOM killer took (here: one that kills itself, the count rising meanwhile) exits
    137 with one kill in its report."""
    counts = iter([4, 5])
    monkeypatch.setattr(runner, "oom_kill_count", lambda: next(counts))
    ckpt = tmp_path / "ckpt"
    config = AgentConfig.model_validate({
        "job_id": "j-1", "attempt": 1, "instance_id": "i-1", "report_timeout_seconds": 0,
        "command": (sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"),
        "job_env": {**os.environ, "SPOTD_CHECKPOINT_URI": str(ckpt)},
        "run_dir": str(tmp_path / "run"),
    })  # fmt: skip
    assert run_agent(config) == 137
    kept = kept_exits(str(ckpt), "j-1", 1)["i-1"].exit
    assert (kept.exit_code, kept.oom_kills) == (137, 1)
