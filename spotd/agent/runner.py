"""The agent's main loop: run the job, watch for notices, report to the daemon.

The job runs in its own process group so that a signal reaches it and every
process it started (a launcher and its workers), and nothing else. The watcher
and the heartbeat run in daemon threads; the main thread only waits for the
job, so signals sent to the agent are handled at once and forwarded.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from types import FrameType

from spotd.agent.config import AgentConfig
from spotd.agent.reporter import DaemonReporter, Outbox
from spotd.agent.watchers import Notice, NoticeWatcher, make_watcher
from spotd.agent_api import AgentReport, ExitReport, NoticeReport
from spotd.errors import ConfigError

log = logging.getLogger(__name__)

Sender = Callable[[AgentReport], None]

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
EXIT_USAGE = 2


def exit_code_of(returncode: int) -> int:
    """A Popen return code in shell terms: killed by signal N gives 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class _Agent:
    """One run of one job; see :func:`run_agent`."""

    def __init__(self, config: AgentConfig, watcher: NoticeWatcher, send: Sender | None) -> None:
        self.config = config
        self.watcher = watcher
        self.outbox: Outbox | None = None
        if send is not None:
            self.outbox = Outbox(
                send,
                initial_backoff=config.retry_initial_seconds,
                max_backoff=config.retry_max_seconds,
            )
        self.instance_id = ""
        self.stopping = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self.noticed: set[str] = set()
        self.signalled = False
        self.watch_thread = threading.Thread(
            target=self._watch, name="spotd-agent-watch", daemon=True
        )
        self.beat_thread = threading.Thread(
            target=self._beat, name="spotd-agent-heartbeat", daemon=True
        )

    def run(self) -> int:
        self.instance_id = self._resolve_instance_id()
        log.info("job %s attempt %s on %s: %s", self.config.job_id, self.config.attempt,
                 self.instance_id, self.config.command)
        if self.outbox is not None:
            self.outbox.start()
        try:
            code = self._run_job()
            self._finish(code)
        finally:
            self.stopping.set()
            if self.outbox is not None:
                self.outbox.close()
        self._run_on_exit()
        return code

    def _run_job(self) -> int:
        try:
            self.proc = subprocess.Popen(
                self.config.command, env=self.config.job_env, process_group=0
            )
        except OSError as exc:
            log.error("cannot start the job %s: %s", self.config.command, exc)
            return EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
        self.watch_thread.start()
        self.beat_thread.start()
        with _forwarding_signals(self.proc.pid):
            code = exit_code_of(self.proc.wait())
        self.stopping.set()
        # So that no heartbeat is queued behind the exit report.
        self.beat_thread.join()
        log.info("job exited with %d", code)
        return code

    def _finish(self, code: int) -> None:
        """Report the exit, then release the provider's event (after the report:
        on Azure the acknowledgement may end the VM at once)."""
        if self.outbox is not None:
            self.outbox.put(ExitReport(exit_code=code, **self._ids()))
            if not self.outbox.drain(self.config.report_timeout_seconds):
                log.warning("daemon did not take the reports within %.0f s; going on",
                            self.config.report_timeout_seconds)
        if "preemption" in self.noticed:
            self.watcher.job_ended()
        # A GCP long poll may still hang in the watch thread: leave its client to
        # the process exit rather than close it under a running request.
        if self.watch_thread.ident is not None:  # not started when the job failed to start
            self.watch_thread.join(timeout=1.0)
        if not self.watch_thread.is_alive():
            self.watcher.close()

    def _watch(self) -> None:
        while not self.stopping.is_set():
            try:
                notice = self.watcher.check()
            except Exception:
                # check() should not raise; if it does, keep watching rather than go blind.
                log.exception("notice check failed")
                notice = None
            if notice is not None:
                self._on_notice(notice)
            self.stopping.wait(max(self.watcher.poll_interval, 0.01))

    def _on_notice(self, notice: Notice) -> None:
        if notice.kind in self.noticed:
            return  # the provider repeats its notice at every poll; act once
        self.noticed.add(notice.kind)
        log.warning("%s notice: %s (deadline %s)", notice.kind, notice.detail, notice.deadline)
        if notice.kind == "preemption":
            self._signal_job()
        if self.outbox is not None:
            self.outbox.put(NoticeReport(
                kind=notice.kind, deadline=notice.deadline, detail=notice.detail, **self._ids()
            ))

    def _signal_job(self) -> None:
        # Signal before reporting: the checkpoint is what the notice window is for.
        if self.proc is None or self.signalled:
            return
        self.signalled = True
        sig = self.config.checkpoint_signum
        try:
            os.killpg(self.proc.pid, sig)
            log.info("sent %s to the job's process group %d", sig.name, self.proc.pid)
        except ProcessLookupError:
            log.info("job already gone; %s not sent", sig.name)

    def _beat(self) -> None:
        while not self.stopping.is_set():
            if self.outbox is not None:
                self.outbox.put(AgentReport(**self._ids()))
            self.stopping.wait(self.config.heartbeat_seconds)

    def _ids(self) -> dict[str, object]:
        return {
            "job_id": self.config.job_id,
            "attempt": self.config.attempt,
            "instance_id": self.instance_id,
            "provider": self.config.provider,
            "at": datetime.now(UTC),
        }

    def _resolve_instance_id(self) -> str:
        if self.config.instance_id:
            return self.config.instance_id
        try:
            found = self.watcher.instance_id()
        except Exception:
            log.exception("asking the metadata service for the instance id failed")
            found = None
        return found or socket.gethostname()

    def _run_on_exit(self) -> None:
        if not self.config.on_exit:
            return
        log.info("running on_exit: %s", self.config.on_exit)
        try:
            done = subprocess.run(self.config.on_exit, check=False)
        except OSError as exc:
            log.error("on_exit %s failed to start: %s", self.config.on_exit, exc)
            return
        if done.returncode != 0:
            log.warning("on_exit exited with %d", done.returncode)


@contextmanager
def _forwarding_signals(pgid: int) -> Iterator[None]:
    """Forward SIGTERM and SIGINT sent to the agent to the job's process group.

    Only the main thread may install handlers; elsewhere (tests) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: FrameType | None) -> None:
        del frame
        log.info("agent got %s; forwarding it to the job", signal.Signals(signum).name)
        with suppress(ProcessLookupError):
            os.killpg(pgid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_agent(
    config: AgentConfig,
    *,
    watcher: NoticeWatcher | None = None,
    send: Sender | None = None,
) -> int:
    """Run the job of ``config`` to its end and return its exit code.

    ``watcher`` defaults to the one for ``config.provider``; ``send`` (one
    delivery of one report, raising ``ReportFailed`` to be retried) defaults to
    a :class:`DaemonReporter` on ``config.daemon_url``, or to no reporting when
    that is unset.
    """
    reporter: DaemonReporter | None = None
    if send is None and config.daemon_url:
        reporter = DaemonReporter(config.daemon_url, config.token.get_secret_value())
        send = reporter.send
    try:
        return _Agent(config, watcher or make_watcher(config), send).run()
    finally:
        if reporter is not None:
            reporter.close()


USAGE = "usage: python -m spotd.agent [--] COMMAND [ARG...]   (settings: SPOTD_AGENT_* variables)"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: settings from the environment, the job's argv from ``argv``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command = args[1:] if args and args[0] == "--" else args
    level = os.environ.get("SPOTD_AGENT_LOG_LEVEL", "INFO").strip().upper()
    logging.basicConfig(
        level=logging.getLevelNamesMapping().get(level, logging.INFO),
        format="%(asctime)s spotd-agent %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = AgentConfig.from_env(os.environ, command or None)
    except ConfigError as exc:
        print(f"spotd agent: {exc}\n{USAGE}", file=sys.stderr)
        return EXIT_USAGE
    return run_agent(config)
