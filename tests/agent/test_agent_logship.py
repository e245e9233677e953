"""The agent ships the node's output: by offset, in bounded chunks, each byte kept once.

One part drives :class:`LogShipper` round by round on a manual clock against an
in-memory daemon that keeps bytes as the store does; the other runs the real route
(``create_agent_router`` over :class:`JobLogRows` on a real store) on a loopback
uvicorn server, with real agents. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from engine_support import spec
from fakes.metadata_fake import MetadataFake
from fastapi import FastAPI, HTTPException
from loopback_support import serve
from pydantic import SecretStr

from spotd.agent import AgentConfig, run_agent
from spotd.agent.logship import MIN_CHUNK, LogShipper, ShipRound
from spotd.agent.output import AgentLines, NodeOutput
from spotd.agent.reporter import ChunkTooLarge, DaemonReporter, ReportFailed, ReportRejected
from spotd.core.agent_wire import (
    MAX_LOG_CHUNK,
    AgentReport,
    ExitReport,
    JoinReport,
    LogChunk,
    LogGap,
    NoticeReport,
    PreflightReport,
    Roster,
    Secrets,
    SecretsAsk,
    Waiting,
    agent_token,
)
from spotd.core.clock import ManualClock
from spotd.daemon.agent_routes import create_agent_router
from spotd.store import SqlStore
from spotd.store.joblogs import JobLogRows

T0 = datetime(2026, 3, 2, tzinfo=UTC)
DAEMON_TOKEN = "daemon-token-for-logs"
CLIENT_TOKEN = "client-token-logs-1"
SPEAKER: dict[str, object] = {"job_id": "j-1", "attempt": 1, "instance_id": "i-1",
                              "provider": "aws", "at": T0}  # fmt: skip


def speaker() -> dict[str, object]:
    return dict(SPEAKER)


# -- round by round, on a manual clock ------------------------------------------------


class Keeper:
    """A daemon in memory that keeps a node's bytes by offset, as the store does; each
    exception in ``failures`` is raised by one send, in turn, before anything is kept
    (``after``: after the bytes are kept, as an answer lost on the way back)."""

    def __init__(self) -> None:
        self.held = bytearray()
        self.sent: list[tuple[int, int]] = []
        self.failures: list[BaseException] = []
        self.after: list[BaseException] = []

    def ship(self, chunk: LogChunk) -> int:
        self.sent.append((chunk.offset, len(chunk.data)))
        if self.failures:
            raise self.failures.pop(0)
        if chunk.offset > len(self.held):
            raise LogGap("gap", expected=len(self.held))
        self.held += chunk.data[len(self.held) - chunk.offset :]
        if self.after:
            raise self.after.pop(0)
        return len(self.held)


@pytest.fixture
def output(tmp_path: Path) -> Iterator[NodeOutput]:
    out = NodeOutput(tmp_path / "output.log", echo=None)
    yield out
    out.close()


def shipper_of(output: NodeOutput, keeper: Keeper, clock: ManualClock, **kw: int) -> LogShipper:
    return LogShipper(output, keeper.ship, speaker, clock=clock, initial_backoff=0.5,
                      max_backoff=2.0, **kw)  # fmt: skip


def test_output_goes_in_bounded_chunks_each_with_its_offset(output: NodeOutput) -> None:
    keeper, clock = Keeper(), ManualClock(T0)
    shipper = shipper_of(output, keeper, clock)
    body = os.urandom(2 * MAX_LOG_CHUNK + 1000)
    output.write(body)
    assert shipper.pump() is ShipRound.CAUGHT_UP
    assert keeper.sent == [(0, MAX_LOG_CHUNK), (MAX_LOG_CHUNK, MAX_LOG_CHUNK),
                           (2 * MAX_LOG_CHUNK, 1000)]  # fmt: skip
    assert bytes(keeper.held) == body and shipper.shipped == len(body)
    assert shipper.pump() is ShipRound.CAUGHT_UP and len(keeper.sent) == 3, "nothing new, no send"


def test_a_failed_send_waits_its_backoff_on_the_clock_then_goes_on(output: NodeOutput) -> None:
    keeper, clock = Keeper(), ManualClock(T0)
    shipper = shipper_of(output, keeper, clock)
    output.write(b"first line\n")
    keeper.failures = [ReportFailed("down"), ReportFailed("still down")]
    assert shipper.pump() is ShipRound.BEHIND
    output.write(b"second line\n")
    assert shipper.pump() is ShipRound.BEHIND and len(keeper.sent) == 1, "the backoff runs"
    clock.advance(0.5)
    assert shipper.pump() is ShipRound.BEHIND and len(keeper.sent) == 2
    clock.advance(0.5)
    assert shipper.pump() is ShipRound.BEHIND and len(keeper.sent) == 2, "it doubled to 1 s"
    clock.advance(0.5)
    assert shipper.pump() is ShipRound.CAUGHT_UP
    assert bytes(keeper.held) == b"first line\nsecond line\n"
    assert [offset for offset, _ in keeper.sent] == [0, 0, 0]


def test_a_chunk_whose_answer_was_lost_is_sent_again_and_kept_once(output: NodeOutput) -> None:
    keeper, clock = Keeper(), ManualClock(T0)
    shipper = shipper_of(output, keeper, clock)
    output.write(b"abc\n")
    keeper.after = [ReportFailed("the answer never came")]
    assert shipper.pump() is ShipRound.BEHIND
    output.write(b"def\n")
    clock.advance(0.5)
    assert shipper.pump() is ShipRound.CAUGHT_UP
    assert keeper.sent == [(0, 4), (0, 8)]
    assert bytes(keeper.held) == b"abc\ndef\n", "nothing twice, nothing lost"


def test_a_daemon_that_holds_less_says_from_where_and_gets_it(output: NodeOutput) -> None:
    keeper, clock = Keeper(), ManualClock(T0)
    shipper = shipper_of(output, keeper, clock)
    output.write(b"0123456789")
    assert shipper.pump() is ShipRound.CAUGHT_UP
    del keeper.held[4:]  # a daemon whose store went back (restored from a backup)
    output.write(b"abc")
    assert shipper.pump() is ShipRound.CAUGHT_UP
    assert keeper.sent[-2:] == [(10, 3), (4, 9)]
    assert bytes(keeper.held) == b"0123456789abc"


def test_a_chunk_over_the_daemons_body_limit_is_halved(output: NodeOutput) -> None:
    keeper, clock = Keeper(), ManualClock(T0)
    shipper = shipper_of(output, keeper, clock)
    output.write(b"x" * MAX_LOG_CHUNK)
    keeper.failures = [ChunkTooLarge("413"), ChunkTooLarge("413")]
    assert shipper.pump() is ShipRound.CAUGHT_UP
    quarter = MAX_LOG_CHUNK // 4
    assert [size for _, size in keeper.sent] == [MAX_LOG_CHUNK, 2 * quarter] + [quarter] * 4
    assert bytes(keeper.held) == b"x" * MAX_LOG_CHUNK
    tiny = LogShipper(output, keeper.ship, speaker, clock=clock, chunk_bytes=1)
    keeper.failures = [ChunkTooLarge("413")]
    output.write(b"y")
    assert tiny.pump() is ShipRound.STOPPED, f"no chunk under {MIN_CHUNK} bytes is tried"


def test_a_refusal_stops_the_shipping_but_not_the_echo(tmp_path: Path) -> None:
    echoed: list[bytes] = []
    output = NodeOutput(tmp_path / "output.log", echo=echoed.append)
    keeper, clock = Keeper(), ManualClock(T0)
    shipper = shipper_of(output, keeper, clock)
    keeper.failures = [ReportRejected("401: unknown attempt")]
    output.write(b"one\n")
    assert shipper.pump() is ShipRound.STOPPED
    output.write(b"two\n")
    clock.advance(60)
    assert shipper.pump() is ShipRound.STOPPED and len(keeper.sent) == 1
    assert b"".join(echoed) == b"one\ntwo\n", "the node's own log still gets it all, once"
    output.close()


def test_flush_waits_out_the_backoffs_and_gives_up_at_its_deadline(output: NodeOutput) -> None:
    keeper, clock = Keeper(), ManualClock(T0)
    shipper = shipper_of(output, keeper, clock)
    output.write(b"last words\n")
    keeper.failures = [ReportFailed("down")] * 3
    assert shipper.flush(30, threading.Event(), clock.advance)
    assert bytes(keeper.held) == b"last words\n"
    assert clock.monotonic() == pytest.approx(0.5 + 1.0 + 2.0)
    output.write(b"never\n")
    keeper.failures = [ReportFailed("down")] * 100
    start = clock.monotonic()
    assert not shipper.flush(10, threading.Event(), clock.advance)
    assert clock.monotonic() - start == pytest.approx(10)
    stop = threading.Event()
    stop.set()
    assert not shipper.flush(10, stop, clock.advance), "a signal ends the wait at once"


def test_the_nodes_writers_append_and_the_agents_lines_follow_its_output(
    tmp_path: Path,
) -> None:
    echoed: list[bytes] = []
    output = NodeOutput(tmp_path / "output.log", echo=echoed.append)
    output.write(b"setup: staging\n")
    subprocess.run([sys.executable, "-c", "import sys; print('job out'); "
                    "print('job err', file=sys.stderr)"],
                   stdout=output.fileno(), stderr=subprocess.STDOUT, check=True)  # fmt: skip
    stream = io.StringIO()
    lines = AgentLines(stream)
    lines.setFormatter(logging.Formatter("agent: %(message)s"))
    record = logging.LogRecord("spotd.agent.runner", logging.INFO, "", 0, "job exited with %d",
                               (0,), None)  # fmt: skip
    lines.attach(output)
    lines.emit(record)
    lines.attach(None)
    lines.emit(record)
    written = b"setup: staging\njob out\njob err\nagent: job exited with 0\n"
    assert output.read(0, 1000) == written and output.size() == len(written)
    output.echo_new()
    output.echo_new()
    assert b"".join(echoed) == written
    assert stream.getvalue() == "agent: job exited with 0\n", "detached: back to stderr"
    output.close()
    output.write(b"after the end")
    assert output.size() == len(written)


# -- the real route, on a loopback server ------------------------------------------------


class Reports:
    """The agents' other reports, in memory; ``logs`` wraps the real rows to note when
    each chunk and the exit came, and to answer 503 while ``down``."""

    def __init__(self, rows: JobLogRows) -> None:
        self.rows = rows
        self.lock = threading.Lock()
        self.order: list[str] = []
        self.exits: list[ExitReport] = []
        self.down = False

    def append(self, chunk: LogChunk) -> int:
        if self.down:
            raise HTTPException(status_code=503, detail="restarting")
        end = self.rows.append(chunk)
        with self.lock:
            self.order.append(f"log {end}")
        return end

    def heartbeat(self, report: AgentReport) -> None:
        pass

    def notice(self, report: NoticeReport) -> None:
        pass

    def exited(self, report: ExitReport) -> None:
        with self.lock:
            self.order.append("exit")
            self.exits.append(report)

    def join(self, report: JoinReport) -> Roster | Waiting:
        return Waiting(joined=0, nodes=1)

    def preflight(self, report: PreflightReport) -> None:
        pass

    def secrets(self, ask: SecretsAsk) -> Secrets:
        return Secrets(values={})


@pytest.fixture
def daemon(store: SqlStore) -> Iterator[tuple[str, Reports, str]]:
    """The agent routes on a real store: their URL, the reports, and the job's id."""
    job = store.create_job(spec(), now=T0)
    reports = Reports(JobLogRows(store.engine))
    app = FastAPI()
    tokens = {(job.id, 1): CLIENT_TOKEN}
    app.include_router(create_agent_router(DAEMON_TOKEN, reports,
                                           lambda j, a: tokens.get((j, a)), reports))  # fmt: skip
    with serve(app) as url:
        yield url, reports, job.id


def test_chunks_reach_a_loopback_daemon_once_whatever_is_sent_again(
    tmp_path: Path, daemon: tuple[str, Reports, str]
) -> None:
    url, reports, job_id = daemon
    reporter = DaemonReporter(url, agent_token(DAEMON_TOKEN, CLIENT_TOKEN))
    output = NodeOutput(tmp_path / "output.log", echo=None)
    ids = {**SPEAKER, "job_id": job_id}
    clock = ManualClock(T0)
    shipper = LogShipper(output, reporter.ship, lambda: dict(ids), clock=clock)
    try:
        body = random.Random(7).randbytes(3 * MAX_LOG_CHUNK // 2)  # not UTF-8, and some
        output.write(body)
        assert shipper.pump() is ShipRound.CAUGHT_UP
        again = LogChunk(offset=0, data=body[:100], **ids)
        assert reporter.ship(again) == len(body), "a repeat is taken, and kept once"
        with pytest.raises(LogGap) as gap:
            reporter.ship(LogChunk(offset=len(body) + 1, data=b"?", **ids))
        assert gap.value.expected == len(body)
        reports.down = True
        output.write(b"while the daemon restarts\n")
        assert shipper.pump() is ShipRound.BEHIND
        reports.down = False
        clock.advance(0.5)  # the first backoff
        assert shipper.pump() is ShipRound.CAUGHT_UP
        (kept,) = reports.rows.kept(job_id)
        assert kept.data == body + b"while the daemon restarts\n" and kept.start == 0
        stranger = DaemonReporter(url, "not-the-token")
        with pytest.raises(ReportRejected, match="401"):
            stranger.ship(again)
    finally:
        output.close()
        reporter.close()


def test_a_gap_is_a_409_problem_that_names_the_offset_expected(
    daemon: tuple[str, Reports, str],
) -> None:
    url, _, job_id = daemon
    body = LogChunk(offset=7, data=b"late", **{**SPEAKER, "job_id": job_id})
    token = agent_token(DAEMON_TOKEN, CLIENT_TOKEN)
    answer = httpx.post(f"{url}/v1/agent/log", content=body.model_dump_json(),
                        headers={"Authorization": f"Bearer {token}",
                                 "Content-Type": "application/json"})  # fmt: skip
    assert answer.status_code == 409
    assert answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert (problem["code"], problem["expected"], problem["job_id"]) == ("log-gap", 0, job_id)


SETUP_AND_JOB = """
import sys
print("hello from the job", flush=True)
print("and its stderr", file=sys.stderr, flush=True)
sys.stdout.write("no newline at the end")
"""


@pytest.mark.parametrize("provider", ["aws", "azure"])
def test_an_agent_ships_the_setups_and_the_jobs_output_before_it_reports_the_exit(
    provider: str, tmp_path: Path, daemon: tuple[str, Reports, str]
) -> None:
    url, reports, job_id = daemon
    lines = AgentLines()
    lines.setFormatter(logging.Formatter("spotd-agent %(levelname)s: %(message)s"))
    agent_log = logging.getLogger("spotd.agent")
    agent_log.addHandler(lines)
    level = agent_log.level
    agent_log.setLevel(logging.INFO)
    with MetadataFake() as metadata:
        config = AgentConfig.model_validate({
            "provider": provider, "metadata_url": metadata.url, "daemon_url": url,
            "token": SecretStr(agent_token(DAEMON_TOKEN, CLIENT_TOKEN)), "job_id": job_id,
            "attempt": 1, "instance_id": "i-node-0", "poll_seconds": 0.1,
            "command": (sys.executable, "-c", SETUP_AND_JOB), "heartbeat_seconds": 0.2,
            "log_seconds": 0.05, "report_timeout_seconds": 20,
            "job_env": {**os.environ, "SPOTD_SETUP": json.dumps(["echo staging the data"])},
        })  # fmt: skip
        try:
            assert run_agent(config, lines=lines) == 0
        finally:
            agent_log.removeHandler(lines)
            agent_log.setLevel(level)
    (kept,) = reports.rows.kept(job_id)
    text = kept.data.decode()
    assert "staging the data\n" in text
    assert "hello from the job\nand its stderr\nno newline at the end" in text
    assert "spotd-agent INFO: job exited with 0" in text, "the agent's own lines too"
    assert text.index("staging the data") < text.index("hello from the job")
    # Every byte went before the exit: a daemon that sees the end has all of it.
    assert reports.order[-1] == "exit"
    assert reports.order[-2] == f"log {kept.end}"
    assert kept.start == 0 and kept.end == len(kept.data)
