"""The on-VM agent against a loopback metadata fake and a loopback daemon.

Jobs are real subprocesses; the daemon is a real uvicorn server running
``create_agent_router`` over an in-memory ``AgentReports``. Intervals are
shortened to tenths of a second. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes.metadata_fake import (
    AWS_INSTANCE_ID,
    AWS_PRIVATE_IP,
    AZURE_PRIVATE_IP,
    AZURE_VM_NAME,
    GCP_INSTANCE_NAME,
    GCP_PRIVATE_IP,
    MetadataFake,
)
from fastapi import FastAPI, HTTPException
from loopback_support import serve
from pydantic import SecretStr

from spotd import checkpoints as ck
from spotd.agent import AgentConfig, main, run_agent
from spotd.agent.reporter import DaemonReporter, ReportFailed, ReportQueue, ReportRejected
from spotd.agent.watchers import NullWatcher, make_watcher
from spotd.core.agent_wire import (
    AgentReport,
    ExitReport,
    NoticeReport,
    agent_token,
)
from spotd.core.errors import ConfigError
from spotd.daemon.agent_routes import create_agent_router
from spotd.exits import kept_exits
from spotd_aws.notice import AwsNoticeWatcher
from spotd_azure.notice import AzureNoticeWatcher
from spotd_gcp.notice import GcpNoticeWatcher

ROOT = Path(__file__).resolve().parents[2]
DAEMON_TOKEN = "daemon-secret-token"
CLIENT_TOKEN = "client-token-job-1-2"
JOB_ID, ATTEMPT = "job-1", 2
AGENT_TOKEN = agent_token(DAEMON_TOKEN, CLIENT_TOKEN)
INSTANCE_OF = {"aws": AWS_INSTANCE_ID, "gcp": GCP_INSTANCE_NAME, "azure": AZURE_VM_NAME}

# A job that writes its ready file, then runs for SECONDS and exits CODE, unless
# SIGTERM or SIGUSR1 arrives: then it writes the signal number to MARKER and exits 143.
JOB_SCRIPT = """
import pathlib, signal, sys, time
marker, ready = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
seconds, code = float(sys.argv[3]), int(sys.argv[4])
def on_signal(signum, frame):
    marker.write_text(str(signum))
    sys.exit(143)
signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGUSR1, on_signal)
ready.write_text("ready")
end = time.monotonic() + seconds
while time.monotonic() < end:
    time.sleep(0.01)
sys.exit(code)
"""


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# -- fake daemon -------------------------------------------------------------


class MemoryReports:
    """AgentReports in memory; ``down`` makes every call answer 503."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.heartbeats: list[AgentReport] = []
        self.notices: list[NoticeReport] = []
        self.exits: list[ExitReport] = []
        self.down = False

    def _up(self) -> None:
        if self.down:
            raise HTTPException(status_code=503, detail="daemon restarting")

    def heartbeat(self, report: AgentReport) -> None:
        self._up()
        with self.lock:
            self.heartbeats.append(report)

    def notice(self, report: NoticeReport) -> None:
        self._up()
        with self.lock:
            self.notices.append(report)

    def exited(self, report: ExitReport) -> None:
        self._up()
        with self.lock:
            self.exits.append(report)


def daemon_app(reports: MemoryReports) -> FastAPI:
    tokens = {(JOB_ID, ATTEMPT): CLIENT_TOKEN}
    app = FastAPI()
    app.include_router(
        create_agent_router(DAEMON_TOKEN, reports, lambda job, attempt: tokens.get((job, attempt)))
    )
    return app


@pytest.fixture
def reports() -> MemoryReports:
    return MemoryReports()


@pytest.fixture
def daemon(reports: MemoryReports) -> Iterator[str]:
    with serve(daemon_app(reports)) as url:
        yield url


@pytest.fixture
def metadata() -> Iterator[MetadataFake]:
    with MetadataFake() as fake:
        yield fake


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


# -- running the agent ---------------------------------------------------------


class Job:
    """Paths and argv of one JOB_SCRIPT run."""

    def __init__(self, tmp_path: Path, seconds: float = 20.0, code: int = 0) -> None:
        script = tmp_path / "job.py"
        script.write_text(JOB_SCRIPT)
        self.marker = tmp_path / "signalled"
        self.ready = tmp_path / "ready"
        self.argv = (sys.executable, str(script), str(self.marker), str(self.ready),
                     str(seconds), str(code))


def make_config(provider: str, command: tuple[str, ...], *, metadata_url: str | None = None,
                daemon_url: str | None = None, **overrides: Any) -> AgentConfig:
    fields: dict[str, Any] = {
        "provider": provider,
        "metadata_url": metadata_url,
        "daemon_url": daemon_url,
        "token": SecretStr(AGENT_TOKEN),
        "job_id": JOB_ID,
        "attempt": ATTEMPT,
        "command": command,
        "poll_seconds": 0.1,
        "long_poll_seconds": 1,
        "heartbeat_seconds": 0.2,
        "report_timeout_seconds": 5,
        "retry_initial_seconds": 0.05,
        "retry_max_seconds": 0.2,
        "job_env": dict(os.environ),
    }
    fields.update(overrides)
    return AgentConfig.model_validate(fields)


class AgentThread:
    """run_agent in a background thread (so no signal handlers are installed)."""

    def __init__(self, config: AgentConfig) -> None:
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, args=(config,), daemon=True)
        self.thread.start()

    def _run(self, config: AgentConfig) -> None:
        self.code = run_agent(config)

    def join(self, timeout: float = 15.0) -> int:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "agent did not finish"
        assert self.code is not None
        return self.code


def pull_lever(fake: MetadataFake, provider: str) -> str | None:
    if provider == "aws":
        fake.schedule_aws_action()
    elif provider == "gcp":
        fake.preempt_gcp()
    else:
        return fake.add_azure_preempt([AZURE_VM_NAME])
    return None


# -- end to end, per provider ---------------------------------------------------------


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_preemption_signals_job_and_reports(
    provider: str, tmp_path: Path, metadata: MetadataFake, daemon: str, reports: MemoryReports
) -> None:
    job = Job(tmp_path)
    agent = AgentThread(make_config(provider, job.argv, metadata_url=metadata.url,
                                    daemon_url=daemon, vm_name=AZURE_VM_NAME))
    assert wait_for(job.ready.exists), "job did not start"
    assert wait_for(lambda: bool(reports.heartbeats)), "no heartbeat"
    event_id = pull_lever(metadata, provider)
    pulled = time.monotonic()

    assert wait_for(job.marker.exists, timeout=3.0), "job got no signal"
    assert time.monotonic() - pulled < 2.0  # poll interval 0.1 s, plus slack for a busy machine
    assert job.marker.read_text() == str(int(signal.SIGTERM))
    assert agent.join() == 143

    assert [n.kind for n in reports.notices] == ["preemption"]
    notice = reports.notices[0]
    assert (notice.job_id, notice.attempt, notice.provider) == (JOB_ID, ATTEMPT, provider)
    assert notice.instance_id == INSTANCE_OF[provider]
    assert notice.deadline is not None and notice.deadline.tzinfo is not None
    assert [e.exit_code for e in reports.exits] == [143]
    assert reports.heartbeats[0].instance_id == INSTANCE_OF[provider]
    if provider == "azure":
        assert metadata.snapshot().azure_acks == [event_id]


def test_train_tiny_checkpoints_on_notice_via_module_entry(
    tmp_path: Path, metadata: MetadataFake, daemon: str, reports: MemoryReports
) -> None:
    ckpt = tmp_path / "ckpt"
    env = {
        **os.environ,
        "SPOTD_AGENT_PROVIDER": "aws",
        "SPOTD_AGENT_METADATA_URL": metadata.url,
        "SPOTD_AGENT_DAEMON_URL": daemon,
        "SPOTD_AGENT_TOKEN": AGENT_TOKEN,
        "SPOTD_AGENT_JOB_ID": JOB_ID,
        "SPOTD_AGENT_ATTEMPT": str(ATTEMPT),
        "SPOTD_AGENT_POLL_SECONDS": "0.1",
        "SPOTD_AGENT_HEARTBEAT_SECONDS": "0.2",
        "SPOTD_CHECKPOINT_URI": str(ckpt),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotd.agent", "--", sys.executable,
         str(ROOT / "examples" / "train_tiny.py"), "--steps", "400", "--step-seconds", "0.02"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        # The first periodic checkpoint (step 10) shows that training is under way.
        assert wait_for(lambda: ck.latest_complete(str(ckpt)) is not None, timeout=10)
        metadata.schedule_aws_action()
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "interrupted at step" in out
    interrupted = int(out.split("interrupted at step ")[1].split()[0])
    latest = ck.latest_complete(str(ckpt))
    assert latest is not None and latest.step == interrupted < 400
    assert [n.kind for n in reports.notices] == ["preemption"]
    assert reports.notices[0].instance_id == AWS_INSTANCE_ID
    assert [e.exit_code for e in reports.exits] == [143]
    assert reports.heartbeats


def test_normal_exit_is_reported_with_heartbeats(
    tmp_path: Path, daemon: str, reports: MemoryReports
) -> None:
    job = Job(tmp_path, seconds=0.6, code=3)
    code = run_agent(make_config("none", job.argv, daemon_url=daemon, instance_id="vm-7"))
    assert code == 3
    assert not job.marker.exists()
    assert [(e.exit_code, e.instance_id) for e in reports.exits] == [(3, "vm-7")]
    assert len(reports.heartbeats) >= 2
    assert reports.notices == []


def test_rebalance_is_reported_but_not_signalled(
    tmp_path: Path, metadata: MetadataFake, daemon: str, reports: MemoryReports
) -> None:
    job = Job(tmp_path, seconds=1.0)
    agent = AgentThread(make_config("aws", job.argv, metadata_url=metadata.url,
                                    daemon_url=daemon))
    assert wait_for(job.ready.exists)
    metadata.recommend_rebalance()
    assert wait_for(lambda: bool(reports.notices), timeout=3)
    assert agent.join() == 0
    assert not job.marker.exists()
    assert [(n.kind, n.deadline) for n in reports.notices] == [("rebalance", None)]


def test_custom_checkpoint_signal(tmp_path: Path, metadata: MetadataFake) -> None:
    job = Job(tmp_path)
    agent = AgentThread(make_config("aws", job.argv, metadata_url=metadata.url,
                                    checkpoint_signal="USR1"))
    assert wait_for(job.ready.exists)
    metadata.schedule_aws_action()
    assert agent.join() == 143
    assert job.marker.read_text() == str(int(signal.SIGUSR1))


# -- the daemon being away --------------------------------------------------------


def test_daemon_down_neither_blocks_signal_nor_loses_reports(
    tmp_path: Path, metadata: MetadataFake, daemon: str, reports: MemoryReports
) -> None:
    reports.down = True
    job = Job(tmp_path)
    agent = AgentThread(make_config("aws", job.argv, metadata_url=metadata.url,
                                    daemon_url=daemon))
    assert wait_for(job.ready.exists)
    metadata.schedule_aws_action()
    assert wait_for(job.marker.exists, timeout=3.0), "a down daemon delayed the signal"
    time.sleep(0.3)  # a few retries against the 503
    assert reports.notices == [] and reports.exits == []
    reports.down = False
    assert agent.join() == 143
    assert [n.kind for n in reports.notices] == ["preemption"]
    assert [e.exit_code for e in reports.exits] == [143]


def test_unreachable_daemon_does_not_kill_the_job(tmp_path: Path) -> None:
    job = Job(tmp_path, seconds=0.5, code=0)
    started = time.monotonic()
    code = run_agent(make_config("none", job.argv, daemon_url=closed_port_url(),
                                 report_timeout_seconds=0.5))
    assert code == 0
    assert job.ready.exists() and not job.marker.exists()
    assert time.monotonic() - started < 5  # the exit report is retried only for a while


def test_wrong_agent_token_is_refused_by_the_daemon(daemon: str, reports: MemoryReports) -> None:
    wrong = DaemonReporter(daemon, agent_token(DAEMON_TOKEN, "another-attempt"))
    right = DaemonReporter(daemon, AGENT_TOKEN)
    report = AgentReport(job_id=JOB_ID, attempt=ATTEMPT, instance_id="i", provider="aws",
                         at="2026-01-01T00:00:00Z")  # type: ignore[arg-type]
    try:
        with pytest.raises(ReportRejected, match="401"):
            wrong.send(report)
        right.send(report)
    finally:
        wrong.close()
        right.close()
    assert len(reports.heartbeats) == 1


# -- signals to the agent -------------------------------------------------------------


def test_sigterm_to_agent_is_forwarded_to_the_job(tmp_path: Path) -> None:
    job = Job(tmp_path)
    env = {**os.environ, "SPOTD_AGENT_JOB_ID": JOB_ID, "SPOTD_AGENT_ATTEMPT": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "spotd.agent", "--", *job.argv], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(job.ready.exists, timeout=10)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert job.marker.read_text() == str(int(signal.SIGTERM))


def test_an_exit_the_daemon_never_took_is_kept_and_outlives_the_node(tmp_path: Path) -> None:
    """The daemon is down when the job ends: the agent keeps the exit beside the job's
    checkpoints, and the node going meanwhile (SIGTERM) ends the agent with the job's
    own code, not the signal's."""
    job = Job(tmp_path, seconds=0.1, code=0)
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "SPOTD_AGENT_JOB_ID": JOB_ID, "SPOTD_AGENT_ATTEMPT": str(ATTEMPT),
           "SPOTD_AGENT_INSTANCE_ID": "i-7", "SPOTD_AGENT_DAEMON_URL": closed_port_url(),
           "SPOTD_AGENT_TOKEN": AGENT_TOKEN, "SPOTD_AGENT_REPORT_TIMEOUT_SECONDS": "600",
           "SPOTD_CHECKPOINT_URI": str(ckpt)}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "spotd.agent", "--", *job.argv], env=env,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert wait_for(lambda: bool(kept_exits(str(ckpt), JOB_ID, ATTEMPT)), timeout=20)
        assert proc.poll() is None, "the agent should still be trying to report"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    kept = kept_exits(str(ckpt), JOB_ID, ATTEMPT)["i-7"]
    assert (kept.exit.exit_code, kept.exit.phase, kept.notice, kept.stopped) == (
        0, "command", None, False
    )


def test_a_preempted_jobs_kept_exit_carries_the_notice(
    tmp_path: Path, metadata: MetadataFake
) -> None:
    job = Job(tmp_path)
    ckpt = tmp_path / "ckpt"
    agent = AgentThread(make_config("aws", job.argv, metadata_url=metadata.url,
                                    daemon_url=closed_port_url(), report_timeout_seconds=0.2,
                                    job_env={**os.environ, "SPOTD_CHECKPOINT_URI": str(ckpt)}))
    assert wait_for(job.ready.exists)
    metadata.schedule_aws_action()
    assert agent.join() == 143
    kept = kept_exits(str(ckpt), JOB_ID, ATTEMPT)[AWS_INSTANCE_ID]
    assert kept.exit.exit_code == 143
    assert kept.notice is not None and kept.notice.kind == "preemption"
    assert kept.stopped, "the agent passed the notice on to the job"


def test_the_job_cannot_read_the_agent_token_from_its_parent(tmp_path: Path) -> None:
    peek = ("import os; environ = open(f'/proc/{os.getppid()}/environ', 'rb').read(); "
            f"print('PEEK', {AGENT_TOKEN!r}.encode() in environ, b'SPOTD_AGENT_JOB_ID' in environ)")
    env = {**os.environ, "SPOTD_AGENT_JOB_ID": JOB_ID, "SPOTD_AGENT_ATTEMPT": "1",
           "SPOTD_AGENT_TOKEN": AGENT_TOKEN}  # fmt: skip
    argv = [sys.executable, "-m", "spotd.agent", "--", sys.executable, "-c", peek]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert "PEEK False True" in done.stdout, "the parent is the agent, without its token"


def test_on_exit_runs_after_the_job(tmp_path: Path) -> None:
    job = Job(tmp_path, seconds=0.1, code=5)
    done = tmp_path / "on-exit"
    on_exit = (sys.executable, "-c", f"open({str(done)!r}, 'w').write('ran')")
    assert run_agent(make_config("none", job.argv, on_exit=on_exit)) == 5
    assert done.read_text() == "ran"


def test_missing_command_gives_127(tmp_path: Path) -> None:
    assert run_agent(make_config("none", (str(tmp_path / "no-such-binary"),))) == 127


# -- watchers, one poll at a time -------------------------------------------------------


def test_aws_token_is_refreshed_before_expiry(metadata: MetadataFake) -> None:
    # A 4 s token is renewed 1 s before it runs out (a quarter of its life): a poll
    # delayed less than that by a loaded machine still reaches IMDS in time.
    watcher = AwsNoticeWatcher(base_url=metadata.url, token_ttl_seconds=4)
    try:
        end = time.monotonic() + 4.5
        while time.monotonic() < end:
            assert watcher.check() is None
            time.sleep(0.1)
    finally:
        watcher.close()
    state = metadata.snapshot()
    assert state.aws_tokens_issued >= 2
    assert state.aws_unauthorized == 0


def test_aws_revoked_token_is_replaced_on_401(metadata: MetadataFake) -> None:
    watcher = AwsNoticeWatcher(base_url=metadata.url)
    try:
        assert watcher.check() is None
        with metadata.cond:
            metadata.state.aws_tokens.clear()
        metadata.schedule_aws_action("stop")
        notice = watcher.check()
    finally:
        watcher.close()
    assert notice is not None and notice.kind == "preemption" and "stop" in notice.detail
    state = metadata.snapshot()
    assert (state.aws_tokens_issued, state.aws_unauthorized) == (2, 1)


def test_aws_preemption_wins_over_rebalance(metadata: MetadataFake) -> None:
    watcher = AwsNoticeWatcher(base_url=metadata.url)
    try:
        metadata.recommend_rebalance()
        first = watcher.check()
        metadata.schedule_aws_action()
        second = watcher.check()
    finally:
        watcher.close()
    assert first is not None and first.kind == "rebalance"
    assert second is not None and second.kind == "preemption" and second.deadline is not None


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_transient_failures_never_raise(provider: str, metadata: MetadataFake) -> None:
    config = make_config(provider, ("true",), metadata_url=metadata.url)
    watcher = make_watcher(config)
    dead = make_watcher(make_config(provider, ("true",), metadata_url=closed_port_url()))
    try:
        metadata.fail_next(2)
        assert watcher.check() is None
        assert dead.check() is None
        assert dead.instance_id() is None
        pull_lever(metadata, provider)
        notice = None
        for _ in range(5):  # a failed long poll may cost one more check
            notice = watcher.check()
            if notice is not None:
                break
        assert notice is not None and notice.kind == "preemption"
    finally:
        watcher.close()
        dead.close()


def test_gcp_long_poll_waits_and_sees_a_change_between_polls(metadata: MetadataFake) -> None:
    # A 3 s long poll leaves room between "answered at once" and "waited it out"
    # even on a loaded machine.
    watcher = GcpNoticeWatcher(base_url=metadata.url, long_poll_seconds=3, poll_interval=0.05)
    try:
        assert watcher.check() is None  # plain read, learns the ETag
        assert watcher.long_polling and watcher.poll_interval == 0
        started = time.monotonic()
        assert watcher.check() is None  # long poll, times out after 3 s
        assert time.monotonic() - started >= 2.9
        metadata.preempt_gcp()  # between two polls: last_etag catches it
        started = time.monotonic()
        notice = watcher.check()
        assert time.monotonic() - started < 2.5  # did not wait out the 3 s long poll
    finally:
        watcher.close()
    assert notice is not None and notice.kind == "preemption"
    assert metadata.snapshot().gcp_long_polls == 2


def test_gcp_long_poll_wakes_on_change(metadata: MetadataFake) -> None:
    watcher = GcpNoticeWatcher(base_url=metadata.url, long_poll_seconds=5)
    try:
        assert watcher.check() is None
        timer = threading.Timer(0.3, metadata.preempt_gcp)
        timer.start()
        started = time.monotonic()
        notice = watcher.check()
        assert 0.2 < time.monotonic() - started < 2
    finally:
        watcher.close()
    assert notice is not None


def test_gcp_falls_back_to_plain_polling(metadata: MetadataFake) -> None:
    metadata.set_break_gcp_long_poll(True)
    watcher = GcpNoticeWatcher(base_url=metadata.url, long_poll_seconds=1, poll_interval=0.05)
    try:
        assert watcher.check() is None  # plain
        assert watcher.check() is None  # long poll fails -> plain at once
        assert not watcher.long_polling and watcher.poll_interval == 0.05
        metadata.preempt_gcp()
        notice = watcher.check()
    finally:
        watcher.close()
    assert notice is not None
    state = metadata.snapshot()
    assert state.gcp_long_polls == 1 and state.gcp_plain_polls == 3


def test_azure_matches_resources_and_acks_per_mode(metadata: MetadataFake) -> None:
    mine = AzureNoticeWatcher(base_url=metadata.url, vm_name=AZURE_VM_NAME, ack="immediate")
    anyone = AzureNoticeWatcher(base_url=metadata.url)
    try:
        other = metadata.add_azure_preempt(["someone-else"])
        assert mine.check() is None
        notice = anyone.check()
        assert notice is not None and other in notice.detail
        assert metadata.snapshot().azure_acks == []  # after-exit mode waits for the job
        anyone.job_ended()
        assert metadata.snapshot().azure_acks == [other]

        ours = metadata.add_azure_preempt([AZURE_VM_NAME.upper()])
        notice = mine.check()
        assert notice is not None and notice.deadline is not None
        assert metadata.snapshot().azure_acks == [other, ours]  # immediate
        assert mine.instance_id() == AZURE_VM_NAME
    finally:
        mine.close()
        anyone.close()


def test_null_watcher_never_notices() -> None:
    watcher = make_watcher(make_config("none", ("true",)))
    assert isinstance(watcher, NullWatcher)
    assert watcher.check() is None and watcher.instance_id() is None


# -- outbox ---------------------------------------------------------------------------


def test_outbox_retries_in_order_and_coalesces_heartbeats() -> None:
    sent: list[AgentReport] = []
    failures = iter([True, True, False])

    def send(report: AgentReport) -> None:
        if isinstance(report, NoticeReport) and next(failures):
            raise ReportFailed("down")
        sent.append(report)

    ids: dict[str, Any] = {"job_id": JOB_ID, "attempt": ATTEMPT, "instance_id": "i",
                           "provider": "aws", "at": "2026-01-01T00:00:00Z"}
    outbox = ReportQueue(send, initial_backoff=0.05, max_backoff=0.1)
    outbox.put(NoticeReport(kind="preemption", **ids))
    for i in range(3):
        outbox.put(AgentReport(**{**ids, "instance_id": f"hb{i}"}))
    outbox.put(ExitReport(exit_code=0, **ids))
    outbox.start()
    try:
        assert outbox.drain(5)
    finally:
        outbox.close()
    assert [type(r).__name__ for r in sent] == ["NoticeReport", "AgentReport", "ExitReport"]
    assert sent[1].instance_id == "hb2"


def test_reporter_posts_json_with_bearer() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(503 if len(seen) == 1 else 204)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    reporter = DaemonReporter("http://daemon.test/", "tok", client=client)
    report = ExitReport(job_id=JOB_ID, attempt=ATTEMPT, instance_id="i", provider="gcp",
                        at="2026-01-01T00:00:00Z", exit_code=1)  # type: ignore[arg-type]
    with pytest.raises(ReportFailed):
        reporter.send(report)
    reporter.send(report)
    assert str(seen[1].url) == "http://daemon.test/v1/agent/exit"
    assert seen[1].headers["Authorization"] == "Bearer tok"
    body = httpx.Response(200, content=seen[1].content).json()
    assert body["exit_code"] == 1 and body["job_id"] == JOB_ID and body["attempt"] == ATTEMPT


# -- daemon routes ---------------------------------------------------------------------


def test_agent_token_is_hmac_of_client_token() -> None:
    expected = hmac.new(b"d", b"c", hashlib.sha256).hexdigest()
    assert agent_token("d", "c") == expected
    assert agent_token("d", "c2") != expected and agent_token("d2", "c") != expected
    assert len(expected) == 64


def test_router_authenticates_each_attempt(daemon: str, reports: MemoryReports) -> None:
    body = {"job_id": JOB_ID, "attempt": ATTEMPT, "instance_id": "i-1", "provider": "aws",
            "at": "2026-01-01T00:00:00Z", "kind": "preemption",
            "deadline": "2026-01-01T00:02:00Z", "detail": "x"}
    auth = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    bad = {"Authorization": f"Bearer {agent_token(DAEMON_TOKEN, 'other')}"}
    daemon_token = {"Authorization": f"Bearer {DAEMON_TOKEN}"}
    with httpx.Client(base_url=daemon, trust_env=False) as client:
        assert client.post("/v1/agent/notice", json=body).status_code == 401
        assert client.post("/v1/agent/notice", json=body, headers=bad).status_code == 401
        assert client.post("/v1/agent/notice", json=body, headers=daemon_token).status_code == 401
        unknown = {**body, "attempt": 9}
        assert client.post("/v1/agent/notice", json=unknown, headers=auth).status_code == 401
        # The token is checked first: a body must name its attempt for that.
        assert client.post("/v1/agent/notice", json={"job_id": JOB_ID},
                           headers=auth).status_code == 401
        assert client.post("/v1/agent/notice", json={"job_id": JOB_ID, "attempt": ATTEMPT},
                           headers=auth).status_code == 422
        assert client.post("/v1/agent/notice", json=body, headers=auth).status_code == 204
        assert client.post("/v1/agent/heartbeat", json=body, headers=auth).status_code == 204
        exit_body = {**body, "exit_code": 0}
        assert client.post("/v1/agent/exit", json=exit_body, headers=auth).status_code == 204
    assert reports.notices[0].deadline is not None
    assert len(reports.heartbeats) == 1 and reports.exits[0].exit_code == 0


# -- configuration ---------------------------------------------------------------------


def test_config_from_env_and_job_env_without_token() -> None:
    environ = {
        "SPOTD_AGENT_PROVIDER": "gcp",
        "SPOTD_AGENT_DAEMON_URL": "http://daemon:8080",
        "SPOTD_AGENT_TOKEN": "secret",
        "SPOTD_JOB_ID": "job-9",
        "SPOTD_ATTEMPT": "4",
        "SPOTD_AGENT_COMMAND": "python train.py --name 'a b'",
        "SPOTD_AGENT_CHECKPOINT_SIGNAL": "usr1",
        "SPOTD_AGENT_ON_EXIT": "shutdown -h now",
        "SPOTD_AGENT_HEARTBEAT_SECONDS": "15",
        "PATH": "/usr/bin",
    }
    config = AgentConfig.from_env(environ)
    assert config.provider == "gcp" and config.metadata_base == "http://metadata.google.internal"
    assert (config.job_id, config.attempt) == ("job-9", 4)
    assert config.command == ("python", "train.py", "--name", "a b")
    assert config.checkpoint_signum is signal.SIGUSR1
    assert config.on_exit == ("shutdown", "-h", "now")
    assert config.heartbeat_seconds == 15 and config.poll_interval == 1.0
    assert config.token.get_secret_value() == "secret"
    assert "SPOTD_AGENT_TOKEN" not in config.job_env and config.job_env["PATH"] == "/usr/bin"
    assert "secret" not in repr(config)
    assert AgentConfig.from_env(environ, ["echo", "hi"]).command == ("echo", "hi")


def test_config_errors_name_the_variable() -> None:
    environ = {"SPOTD_AGENT_JOB_ID": "j", "SPOTD_AGENT_ATTEMPT": "1",
               "SPOTD_AGENT_CHECKPOINT_SIGNAL": "SIGNOPE", "SPOTD_AGENT_PROVIDER": "ibm"}
    with pytest.raises(ConfigError) as info:
        AgentConfig.from_env(environ, ["true"])
    message = str(info.value)
    assert "SPOTD_AGENT_CHECKPOINT_SIGNAL" in message and "SPOTD_AGENT_PROVIDER" in message


def test_main_without_command_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPOTD_AGENT_JOB_ID", "j")
    monkeypatch.setenv("SPOTD_AGENT_ATTEMPT", "1")
    monkeypatch.delenv("SPOTD_AGENT_COMMAND", raising=False)
    assert main(["--"]) == 2
    assert "SPOTD_AGENT_COMMAND" in capsys.readouterr().err


PRIVATE_IPS = {"aws": AWS_PRIVATE_IP, "gcp": GCP_PRIVATE_IP, "azure": AZURE_PRIVATE_IP}


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_watchers_tell_the_nodes_private_address(provider: str, metadata: MetadataFake) -> None:
    from spotd.core.contracts import AddressSource

    watcher = make_watcher(make_config(provider, ("true",), metadata_url=metadata.url))
    dead = make_watcher(make_config(provider, ("true",), metadata_url=closed_port_url()))
    try:
        assert isinstance(watcher, AddressSource) and isinstance(dead, AddressSource)
        assert watcher.private_address() == PRIVATE_IPS[provider]
        assert dead.private_address() is None
    finally:
        watcher.close()
        dead.close()


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_a_cloud_node_joins_its_gang_with_its_private_address(
    provider: str, metadata: MetadataFake, tmp_path: Path
) -> None:
    """On a VM with several NICs the route to the daemon may leave by another one:
    the gang is told the primary NIC's address, as the metadata service gives it."""
    from spotd.core.agent_wire import JoinReport, Roster, Waiting

    joined: list[JoinReport] = []

    def join(report: JoinReport) -> Roster | Waiting:
        joined.append(report)
        return Waiting(joined=1, nodes=2)

    job_env = {"SPOTD_RDZV_ID": "j-1-a1", "SPOTD_NUM_NODES": "2", "SPOTD_PREFLIGHT": "0",
               "SPOTD_GANG_TIMEOUT_SECONDS": "0.2"}  # fmt: skip
    config = make_config(provider, ("true",), metadata_url=metadata.url,
                         daemon_url="http://127.0.0.1:9", run_dir=str(tmp_path),
                         join_poll_seconds=0.05, job_env=job_env)  # fmt: skip
    run_agent(config, send=lambda _report: None, join=join)
    assert joined and {r.address for r in joined} == {PRIVATE_IPS[provider]}
