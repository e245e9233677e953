"""A gang node's agent stands by after its command and rejoins the job's next attempt."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from loopback_support import serve
from pydantic import SecretStr

from spotd.agent.config import AgentConfig
from spotd.agent.rejoin import clear_run_dir, rejoined, stand_by, stands_by
from spotd.agent.reporter import ReportFailed, ReportRejected
from spotd.agent.runner import run_agent
from spotd.core.agent_wire import (
    ExitReport,
    HeartbeatReport,
    JoinReport,
    NoticeReport,
    PreflightReport,
    Roster,
    Secrets,
    SecretsAsk,
    Waiting,
    agent_token,
)
from spotd.core.clock import ManualClock
from spotd.core.rejoin import RejoinAnswer, RejoinAsk, RejoinStep
from spotd.daemon.agent_routes import create_agent_router
from tests.engine_support import EPOCH

DAEMON_TOKEN = "daemon-secret"
TOKENS = {("j-1", 1): "j-1-a1", ("j-1", 2): "j-1-a2"}
GANG_ENV = {"SPOTD_NUM_NODES": "2", "SPOTD_ATTEMPT": "1", "SPOTD_JOB_ID": "j-1"}


def config(command: tuple[str, ...] = ("true",), **fields: Any) -> AgentConfig:
    base: dict[str, Any] = {
        "provider": "sim", "job_id": "j-1", "attempt": 1, "instance_id": "i-0",
        "command": command,
        "daemon_url": "http://127.0.0.1:9", "token": SecretStr(agent_token(DAEMON_TOKEN,
                                                                           "j-1-a1")),
        "job_env": {**os.environ, **GANG_ENV}, "join_poll_seconds": 0.01,
        "heartbeat_seconds": 0.2, "retry_initial_seconds": 0.05, "retry_max_seconds": 0.2,
        "report_timeout_seconds": 5,
    }  # fmt: skip
    base.update(fields)
    return AgentConfig.model_validate(base)


REJOIN = RejoinAnswer(step=RejoinStep.REJOIN, attempt=2, token="t-2",
                      env={"SPOTD_ATTEMPT": "2", "SPOTD_RDZV_ID": "j-1-a2"})  # fmt: skip


def test_who_stands_by() -> None:
    ok: dict[str, Any] = {"phase": "command", "noticed": False, "stopped": False}
    assert stands_by(config(), **ok)
    assert not stands_by(config(job_env={"SPOTD_NUM_NODES": "1"}), **ok)
    assert not stands_by(config(daemon_url=None), **ok)
    # Not on a provider that cannot add a node to a running gang (a cloud's, for now).
    assert not stands_by(config(provider="none"), **ok)
    assert not stands_by(config(rejoin_wait_seconds=0), **ok)
    # A failed preflight: only a node the verdict does not name (another node failed).
    assert not stands_by(config(), **{**ok, "phase": "preflight"})
    assert stands_by(config(), **{**ok, "phase": "preflight", "peer_at_fault": True})
    assert not stands_by(config(), **{**ok, "phase": "rendezvous", "peer_at_fault": True})
    assert not stands_by(config(), **{**ok, "noticed": True})  # its own node is going
    assert not stands_by(config(), **{**ok, "stopped": True})


def test_it_asks_until_the_daemon_says_and_rejoins_with_the_new_attempts_token() -> None:
    answers: list[RejoinAnswer | Exception] = [
        RejoinAnswer(step=RejoinStep.WAIT), ReportFailed("daemon restarting"), REJOIN,
    ]
    asked: list[RejoinAsk] = []

    def ask(what: RejoinAsk) -> RejoinAnswer:
        asked.append(what)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    following = stand_by(config(), ask, stop=threading.Event())
    assert following is not None and len(asked) == 3
    assert {(a.job_id, a.attempt, a.instance_id) for a in asked} == {("j-1", 1, "i-0")}
    assert following.attempt == 2 and following.token.get_secret_value() == "t-2"
    assert following.job_env["SPOTD_ATTEMPT"] == following.job_env["SPOTD_AGENT_ATTEMPT"] == "2"
    assert following.job_env["SPOTD_RDZV_ID"] == "j-1-a2"
    assert following.job_env["SPOTD_JOB_ID"] == "j-1"  # the rest of its environment stays


@pytest.mark.parametrize(
    "answer", [RejoinAnswer(step=RejoinStep.LEAVE), ReportRejected("HTTP 404: Not Found")]
)
def test_it_leaves_when_told_or_when_the_daemon_has_no_such_route(
    answer: RejoinAnswer | Exception,
) -> None:
    def ask(_: RejoinAsk) -> RejoinAnswer:
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert stand_by(config(), ask, stop=threading.Event()) is None


def test_it_leaves_when_its_wait_runs_out_or_the_node_is_going() -> None:
    clock = ManualClock(EPOCH)

    def ask(_: RejoinAsk) -> RejoinAnswer:
        clock.advance(100.0)
        return RejoinAnswer(step=RejoinStep.WAIT)

    assert stand_by(config(rejoin_wait_seconds=250), ask, stop=threading.Event(),
                    clock=clock) is None  # fmt: skip
    assert clock.monotonic() - ManualClock(EPOCH).monotonic() == 300.0  # three asks
    stop = threading.Event()
    stop.set()
    assert stand_by(config(), ask, stop=stop, clock=clock) is None


def test_the_next_run_starts_with_a_clear_run_folder(tmp_path: Path) -> None:
    for name in ("output.log", "progress.json", "notice.json", "hostfile", "keep.txt",
                 "progress-rank-3.json"):
        (tmp_path / name).write_text("x")
    clear_run_dir(config(run_dir=str(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
    assert rejoined(config(), REJOIN).attempt == 2


# -- the agent, a real loopback daemon, and two runs of the command ---------------------------


class Reports:
    """What the daemon's routes took, with the token each attempt spoke with."""

    def __init__(self) -> None:
        self.exits: list[ExitReport] = []
        self.answers = [RejoinStep.WAIT, RejoinStep.REJOIN, RejoinStep.LEAVE]
        self.asked: list[RejoinAsk] = []

    def heartbeat(self, report: HeartbeatReport) -> None: ...

    def notice(self, report: NoticeReport) -> None: ...

    def exited(self, report: ExitReport) -> None:
        self.exits.append(report)

    def join(self, report: JoinReport) -> Roster | Waiting:
        return Waiting(joined=0, nodes=2)

    def preflight(self, report: PreflightReport) -> None: ...

    def secrets(self, ask: SecretsAsk) -> Secrets:
        return Secrets()

    def next_step(self, ask: RejoinAsk) -> RejoinAnswer:
        self.asked.append(ask)
        step = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if step is RejoinStep.REJOIN:
            return RejoinAnswer(step=step, attempt=2, env={"SPOTD_ATTEMPT": "2"},
                                token=agent_token(DAEMON_TOKEN, TOKENS[("j-1", 2)]))  # fmt: skip
        return RejoinAnswer(step=step)


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def daemon(reports: Reports) -> Iterator[str]:
    app = FastAPI()
    app.include_router(create_agent_router(DAEMON_TOKEN, reports, lambda j, a: TOKENS.get((j, a)),
                                           rejoin=reports))  # fmt: skip
    with serve(app) as url:
        yield url


def test_a_node_that_rejoins_runs_the_command_again_as_the_next_attempt(
    tmp_path: Path, daemon: str, reports: Reports
) -> None:
    ran = tmp_path / "ran.txt"
    left = tmp_path / "left.txt"
    command = (sys.executable, "-c", "import os; open(os.environ['RAN'], 'a').write("
               "os.environ['SPOTD_ATTEMPT'] + '\\n'); raise SystemExit(143)")  # fmt: skip
    on_exit = (sys.executable, "-c", f"open({str(left)!r}, 'a').write('left\\n')")
    code = run_agent(config(command, daemon_url=daemon, on_exit=on_exit,
                            job_env={**os.environ, **GANG_ENV, "RAN": str(ran)}))  # fmt: skip
    assert code == 143
    assert ran.read_text() == "1\n2\n"
    # Each run's exit reached the daemon, the second with the second attempt's token.
    assert [(e.attempt, e.exit_code) for e in reports.exits] == [(1, 143), (2, 143)]
    assert [a.attempt for a in reports.asked] == [1, 1, 2]
    assert left.read_text() == "left\n"  # on_exit once, when the agent left
