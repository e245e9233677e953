"""spotd.agent.startup: the preflight runs in the job's own interpreter and fails closed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from spotd.agent.config import AgentConfig
from spotd.agent.startup import EXIT_PREFLIGHT_FAILED, peer_at_fault, preflight_plan, prepare
from spotd.core.agent_wire import (
    AgentReport,
    JoinReport,
    PreflightCheckName,
    PreflightFailure,
    PreflightFigures,
    PreflightReport,
    Roster,
    Waiting,
)


def config_for(tmp_path: Path, command: tuple[str, ...], **env: str) -> AgentConfig:
    job_env = {"SPOTD_RDZV_ID": "j-1-a1", "SPOTD_NUM_NODES": "1", "SPOTD_PREFLIGHT": "1",
               "SPOTD_PREFLIGHT_TIMEOUT_SECONDS": "25", "PATH": "/usr/bin:/bin", **env}  # fmt: skip
    return AgentConfig(job_id="j-1", attempt=1, command=command, provider="aws",
                       daemon_url="http://127.0.0.1:9", address="127.0.0.1",
                       run_dir=str(tmp_path), job_env=job_env)  # fmt: skip


def no_join(_report: JoinReport) -> Roster | Waiting:
    return Waiting(joined=1, nodes=1)


def python_without_torch(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    python.chmod(0o755)
    return str(python)


def start(config: AgentConfig, run_dir: Path) -> tuple[bool, int, PreflightReport]:
    sent: list[AgentReport] = []
    run_dir.mkdir(parents=True, exist_ok=True)
    began = prepare(config, instance_id="i-0", run_dir=run_dir, join=no_join,
                    put=sent.append, gpus=None)  # fmt: skip
    (report,) = sent
    assert isinstance(report, PreflightReport)
    return began.ready, began.exit_code, report


@pytest.mark.timeout(60)
def test_a_job_that_trains_with_torch_its_python_lacks_never_starts(tmp_path: Path) -> None:
    python = python_without_torch(tmp_path / "venv" / "bin")
    config = config_for(tmp_path, (python, "train.py"), SPOTD_PREFLIGHT_TORCH="1")
    ready, code, report = start(config, tmp_path / "run")
    assert (ready, code) == (False, EXIT_PREFLIGHT_FAILED)
    figures = report.figures
    assert (figures.failed_rank, figures.failed_check, figures.failed_reason) == (
        0, PreflightCheckName.TORCH, PreflightFailure.TORCH_MISSING)  # fmt: skip


@pytest.mark.timeout(60)
def test_the_same_job_with_torch_in_its_python_starts(tmp_path: Path) -> None:
    config = config_for(tmp_path, (sys.executable, "train.py"), SPOTD_PREFLIGHT_TORCH="1")
    ready, _, report = start(config, tmp_path / "run")
    assert ready and report.figures.passed, report.figures.reason
    torch = next(c for c in report.figures.checks if c.name is PreflightCheckName.TORCH)
    assert torch.ok and not torch.skipped


@pytest.mark.parametrize(("value", "torch"), [("1", True), ("0", False), ("", None)])
def test_the_plan_takes_the_jobs_word_on_torch(value: str, torch: bool | None) -> None:
    roster = Roster(rank=0, nodes=1, addresses=("127.0.0.1",), master_addr="127.0.0.1",
                    master_port=29500, preflight_port=29501, rdzv_id="r")  # fmt: skip
    config = config_for(Path("/unused"), ("python",))
    env = {**config.job_env, "SPOTD_PREFLIGHT_TORCH": value}
    assert preflight_plan(config, env, roster, None).torch is torch


def test_a_node_stands_by_only_for_a_verdict_naming_another_node() -> None:
    def verdict(rank: int | None) -> PreflightFigures:
        return PreflightFigures(passed=False, world_size=2, failed_rank=rank)

    assert peer_at_fault(verdict(1), 0)
    assert not peer_at_fault(verdict(0), 0)  # this node failed its own checks
    assert not peer_at_fault(verdict(None), 0)  # the gang's: a timeout, the bandwidth
