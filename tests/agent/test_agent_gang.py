"""The agent's side of a gang: joining, waiting for the roster, the job's variables and files."""

from __future__ import annotations

import json
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotd.agent.config import AgentConfig
from spotd.agent.files import read_progress, write_notice
from spotd.agent.gang import (
    GangPlan,
    free_port,
    roster_environment,
    route_address,
    wait_for_roster,
)
from spotd.agent.reporter import ReportFailed, ReportRejected
from spotd.agent.startup import EXIT_NO_GANG, prepare
from spotd.core.agent_wire import (
    AgentReport,
    JoinReport,
    PreflightReport,
    ProviderNotice,
    Roster,
    Waiting,
)

ROSTER = Roster(rank=1, nodes=3, addresses=("10.0.0.1", "10.0.0.2", "10.0.0.3"),
                master_addr="10.0.0.1", master_port=29500, preflight_port=29501,
                rdzv_id="j-1-a2")  # fmt: skip


def join_report() -> JoinReport:
    return JoinReport(job_id="j-1", attempt=2, instance_id="i-1", provider="aws",
                      at=datetime.now(UTC), address="10.0.0.2", ports=(40000, 40001))  # fmt: skip


def test_waits_through_partial_gangs_and_transient_failures() -> None:
    answers: list[Roster | Waiting | Exception] = [
        Waiting(joined=1, nodes=3), ReportFailed("connection refused"),
        Waiting(joined=2, nodes=3), ROSTER,
    ]  # fmt: skip
    asked: list[JoinReport] = []

    def join(report: JoinReport) -> Roster | Waiting:
        asked.append(report)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert wait_for_roster(join, join_report(), timeout=10, poll_seconds=0.01) == ROSTER
    assert len(asked) == 4
    assert asked[0].at <= asked[-1].at  # every ask carries its own time


def test_gives_up_at_the_timeout() -> None:
    began = time.monotonic()
    roster = wait_for_roster(lambda _r: Waiting(joined=1, nodes=2), join_report(), timeout=0.3,
                             poll_seconds=0.05)  # fmt: skip
    assert roster is None
    assert 0.3 <= time.monotonic() - began < 2.0


def test_a_refused_join_ends_the_wait_at_once() -> None:
    def join(_report: JoinReport) -> Roster | Waiting:
        raise ReportRejected("HTTP 401")

    began = time.monotonic()
    assert wait_for_roster(join, join_report(), timeout=30, poll_seconds=0.05) is None
    assert time.monotonic() - began < 1.0


def test_roster_environment_and_hostfile(tmp_path: Path) -> None:
    plan = GangPlan(nodes=3, slots=8)
    env = roster_environment(ROSTER, plan, tmp_path)
    assert env["SPOTD_NODE_RANK"] == env["PET_NODE_RANK"] == "1"
    assert env["SPOTD_NUM_NODES"] == env["PET_NNODES"] == "3"
    assert env["SPOTD_MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "10.0.0.1"
    assert env["SPOTD_MASTER_PORT"] == env["PET_MASTER_PORT"] == "29500"
    assert env["SPOTD_NODE_IPS"] == "10.0.0.1,10.0.0.2,10.0.0.3"
    assert env["PET_RDZV_ID"] == env["SPOTD_RDZV_ID"] == "j-1-a2"
    hostfile = Path(env["SPOTD_HOSTFILE"]).read_text()
    assert hostfile == "10.0.0.1 slots=8\n10.0.0.2 slots=8\n10.0.0.3 slots=8\n"


def test_a_pinned_port_wins_over_the_masters_pick(tmp_path: Path) -> None:
    env = roster_environment(ROSTER, GangPlan(nodes=3, fixed_port=23456), tmp_path)
    assert env["SPOTD_MASTER_PORT"] == env["PET_MASTER_PORT"] == "23456"


def test_gang_plan_from_the_daemons_variables() -> None:
    plan = GangPlan.from_env({"SPOTD_NUM_NODES": "4", "SPOTD_GANG_TIMEOUT_SECONDS": "60",
                              "SPOTD_MASTER_PORT": "29400", "SPOTD_EXPECT_GPUS": "8"})  # fmt: skip
    assert plan == GangPlan(nodes=4, timeout_seconds=60.0, fixed_port=29400, slots=8)
    assert GangPlan.from_env({}) == GangPlan()


def test_addresses_and_ports_on_a_loopback_address_of_its_own() -> None:
    assert route_address("http://127.0.0.1:8470") == "127.0.0.1"
    port = free_port("127.100.7.9")
    with socket.socket() as s:
        s.bind(("127.100.7.9", port))  # it was free there


def test_notice_file_is_written_whole_and_progress_read_leniently(tmp_path: Path) -> None:
    deadline = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)
    write_notice(tmp_path, ProviderNotice("preemption", deadline, "spot reclaimed"))
    body = json.loads((tmp_path / "notice.json").read_text())
    assert body == {"kind": "preemption", "deadline": deadline.isoformat(),
                    "detail": "spot reclaimed"}  # fmt: skip
    assert list(tmp_path.iterdir()) == [tmp_path / "notice.json"]  # no temporary left
    assert read_progress(tmp_path).step is None
    (tmp_path / "progress.json").write_text('{"step": 12, "total_steps": 40, "checkpoint": "c"}')
    assert (read_progress(tmp_path).step, read_progress(tmp_path).checkpoint) == (12, "c")
    (tmp_path / "progress.json").write_text('{"step": true, "total_steps": "x"')
    assert read_progress(tmp_path).step is None


@pytest.mark.parametrize("bad", ['[1, 2]', '{"step": "12"}'])
def test_a_progress_file_of_another_shape_says_nothing(tmp_path: Path, bad: str) -> None:
    (tmp_path / "progress.json").write_text(bad)
    assert read_progress(tmp_path).step is None


# -- startup.prepare: gang, then preflight, then the job's environment ----------


def config_for(tmp_path: Path, **env: str) -> AgentConfig:
    job_env = {"SPOTD_RDZV_ID": "j-1-a2", "SPOTD_NUM_NODES": "3", "SPOTD_PREFLIGHT": "0",
               "SPOTD_GANG_TIMEOUT_SECONDS": "0.3", **env}  # fmt: skip
    return AgentConfig(job_id="j-1", attempt=2, command=("true",), provider="aws",
                       daemon_url="http://127.0.0.1:9", address="127.100.9.2",
                       join_poll_seconds=0.05, run_dir=str(tmp_path), job_env=job_env)  # fmt: skip


def test_prepare_hands_the_job_its_rank_and_files(tmp_path: Path) -> None:
    sent: list[AgentReport] = []
    start = prepare(config_for(tmp_path), instance_id="i-1", run_dir=tmp_path,
                    join=lambda _r: ROSTER, put=sent.append, gpus=None)  # fmt: skip
    assert start.ready and start.exit_code == 0
    assert start.env["SPOTD_NODE_RANK"] == "1" and start.env["PET_MASTER_ADDR"] == "10.0.0.1"
    assert start.env["SPOTD_NOTICE_FILE"] == str(tmp_path / "notice.json")
    assert start.env["SPOTD_PROGRESS_FILE"] == str(tmp_path / "progress.json")
    # Preflight off: still reported, as passed with the check skipped, so the daemon
    # knows the command started.
    (report,) = sent
    assert isinstance(report, PreflightReport) and report.figures.passed
    assert report.figures.checks[0].skipped


def test_prepare_gives_up_on_a_gang_that_never_assembles(tmp_path: Path) -> None:
    start = prepare(config_for(tmp_path), instance_id="i-1", run_dir=tmp_path,
                    join=lambda _r: Waiting(joined=2, nodes=3), put=lambda _r: None,
                    gpus=None)  # fmt: skip
    assert (start.ready, start.phase, start.exit_code) == (False, "rendezvous", EXIT_NO_GANG)


def test_a_gang_of_one_does_not_wait_for_the_daemon(tmp_path: Path) -> None:
    def down(_report: JoinReport) -> Roster | Waiting:
        raise ReportFailed("connection refused")

    config = config_for(tmp_path, SPOTD_NUM_NODES="1", SPOTD_GANG_TIMEOUT_SECONDS="60")
    began = time.monotonic()
    start = prepare(config, instance_id="i-1", run_dir=tmp_path, join=down,
                    put=lambda _r: None, gpus=None)  # fmt: skip
    assert start.ready and time.monotonic() - began < 5
    assert (start.env["SPOTD_NODE_RANK"], start.env["SPOTD_MASTER_ADDR"]) == ("0", "127.100.9.2")


def test_a_job_of_a_daemon_that_asked_no_gang_starts_at_once(tmp_path: Path) -> None:
    config = config_for(tmp_path).model_copy(update={"job_env": {"SPOTD_NUM_NODES": "2"}})
    start = prepare(config, instance_id="i-1", run_dir=tmp_path,
                    join=lambda _r: Waiting(joined=0, nodes=2), put=lambda _r: None,
                    gpus=None)  # fmt: skip
    assert start.ready and "SPOTD_MASTER_ADDR" not in start.env
