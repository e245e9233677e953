"""The agent's main loop: run the job, watch for notices, report to the daemon.

The job runs in its own process group so that a signal reaches it and every
process it started (a launcher and its workers), and nothing else. The watcher
and the heartbeat run in daemon threads; the main thread only waits for the
job, so signals sent to the agent are handled at once and forwarded. With a
daemon to report to, the node's output (the job's, its setup's and the agent's
own lines) goes to a file the shipping thread sends on (:mod:`spotd.agent.logship`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from spotd.agent.config import TOKEN_VARIABLE, AgentConfig
from spotd.agent.container import job_argv
from spotd.agent.files import read_progress, write_notice
from spotd.agent.gang import Join
from spotd.agent.gpu import GpuSource, open_gpu_source
from spotd.agent.logship import LogShipper, OutputShipping, Ship
from spotd.agent.node import AskSecrets, to_own_stdout
from spotd.agent.oom import kills_between, oom_kill_count
from spotd.agent.orders import OrdersWatcher
from spotd.agent.output import OUTPUT_FILE, AgentLines, NodeOutput
from spotd.agent.ranks import job_ranks
from spotd.agent.rejoin import clear_run_dir, stand_by, stands_by, stopping_on_signals
from spotd.agent.reporter import DaemonReporter, ReportQueue
from spotd.agent.startup import EXIT_NO_GANG, prepare, run_dir_of
from spotd.agent.watchers import make_watcher
from spotd.core.agent_wire import (
    AgentReport,
    ExitPhase,
    ExitReport,
    GpuReading,
    HeartbeatReport,
    NoticeReport,
    ProviderNotice,
    Secrets,
    SecretsAsk,
)
from spotd.core.contracts import AddressSource, NoticeWatcher
from spotd.core.errors import ConfigError
from spotd.core.handlers import on_stop_signals
from spotd.environ import forget
from spotd.exits import KeptExit, keep_exit

log = logging.getLogger(__name__)

Sender = Callable[[AgentReport], None]
AskSecretsOf = Callable[[SecretsAsk], Secrets]
"""One ask for the job's secrets (the daemon's answer)."""

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
EXIT_USAGE = 2


def exit_code_of(returncode: int) -> int:
    """A Popen return code in shell terms: killed by signal N gives 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class _Agent:
    """One run of one job; see :func:`run_agent`."""

    def __init__(
        self,
        config: AgentConfig,
        watcher: NoticeWatcher,
        send: Sender | None,
        join: Join | None = None,
        gpus: GpuSource | None = None,
        *,
        secrets: AskSecretsOf | None = None,
        ship: Ship | None = None,
        lines: AgentLines | None = None,
    ) -> None:
        self.config = config
        self.watcher = watcher
        self.join = join
        self.gpus = gpus
        self.secrets = secrets
        self.exit_detail = ""
        self.phase: ExitPhase = "command"
        self.peer_at_fault = False
        """The preflight failed on another node of the gang, not this one."""
        """What the run's exit ended (the command, or the agent's setup, gang or preflight)."""
        self.oom_kills: int | None = None
        """OOM kills in the agent's cgroup while the command ran (:mod:`spotd.agent.oom`)."""
        self.cwd: Path | None = None
        self.run_dir: Path  # made in run(), once a signal to the agent can no longer kill it
        self.job_env = dict(config.job_env)
        self.outbox: ReportQueue | None = None
        if send is not None:
            self.outbox = ReportQueue(
                send,
                initial_backoff=config.retry_initial_seconds,
                max_backoff=config.retry_max_seconds,
            )
        self.instance_id = ""
        self.stopping = threading.Event()
        self.proc: subprocess.Popen[bytes] | None = None
        self.noticed: set[str] = set()
        self.notice: NoticeReport | None = None
        """The preemption notice, kept with the exit."""
        self.signalled = False
        self.start_lock = threading.Lock()
        self.aborted = threading.Event()
        """Set by SIGTERM or SIGINT to the agent: the node is going."""
        self.ended = False
        """The job ended (or never could start): the agent only reports now."""
        self.leaving = threading.Event()
        """Set by a signal after the job ended: stop waiting for the daemon."""
        self.watch_thread = threading.Thread(
            target=self._watch, name="spotd-agent-watch", daemon=True
        )
        self.beat_thread = threading.Thread(
            target=self._beat, name="spotd-agent-heartbeat", daemon=True
        )
        self.ship = ship
        """Sends a chunk of the node's output; None: no output file, nothing shipped."""
        self.lines = lines
        self.shipping: OutputShipping | None = None

    def run(self) -> int:
        self.instance_id = self._resolve_instance_id()
        self.config = self._with_address(self.config)
        log.info("job %s attempt %s on %s: %s", self.config.job_id, self.config.attempt,
                 self.instance_id, self.config.command)
        if self.outbox is not None:
            self.outbox.start()
        try:
            # Through the report too: a node that goes while the daemon has not taken
            # the exit yet ends the agent with the job's own code, not the signal's.
            # And from the run folder on: the agent leaves by the finally below, which
            # removes it, however it ends (a signal only sets flags from now on).
            with on_stop_signals(self._forward_signal):
                self.run_dir = run_dir_of(self.config)
                try:
                    self._open_output()
                    # Watch and beat from boot: a notice during rendezvous or preflight
                    # counts too.
                    self.watch_thread.start()
                    self.beat_thread.start()
                    code, phase = self._start_and_wait()
                    self.phase = phase
                    self._stop_threads()
                    self._finish(code, phase)
                finally:
                    if self.shipping is not None:
                        self.shipping.close()
                    self._leave_run_dir()
        finally:
            self.stopping.set()
            if self.outbox is not None:
                self.outbox.close()
        return code

    def _start_and_wait(self) -> tuple[int, ExitPhase]:
        """Gang and preflight, then the job to its end: its exit code and phase."""
        # The setup lines' output: into the node's output, when there is one.
        write = self.shipping.output.write if self.shipping is not None else to_own_stdout
        try:
            start = prepare(self.config, instance_id=self.instance_id, run_dir=self.run_dir,
                            join=self.join, put=self._put, gpus=self.gpus,
                            stop=self.aborted, ask_secrets=self._ask_secrets(),
                            write=write)  # fmt: skip
        except Exception:
            # Whatever broke (an address, a port, a disk), the node cannot run the
            # job: say so as a failed start, so the attempt is placed again.
            log.exception("the node could not be prepared for the job")
            return EXIT_NO_GANG, "rendezvous"
        self.job_env = start.env
        self.cwd = start.cwd
        if not start.ready:
            self.exit_detail = start.detail
            self.peer_at_fault = start.peer_at_fault
            return start.exit_code, start.phase
        before = oom_kill_count()  # read before the job runs: its kills come after
        with self.start_lock:
            if "preemption" in self.noticed or self.aborted.is_set():
                log.warning("the node is going before the job started; not starting it")
                return exit_code_of(-signal.SIGTERM), "command"
            failed = self._spawn()
        if failed is not None:
            return failed, "command"
        code = exit_code_of(self._wait())
        self.oom_kills = kills_between(before, oom_kill_count())
        log.info("job exited with %d", code)
        return code, "command"

    def _spawn(self) -> int | None:
        """Start the job; None once it runs, else the shell's code for why it cannot."""
        argv = job_argv(self.config.command, self.job_env, cwd=self.cwd, run_dir=self.run_dir,
                        name=f"spotd-{self.config.job_id}-{self.config.attempt}")  # fmt: skip
        out = self.shipping.output.fileno() if self.shipping is not None else None
        err = subprocess.STDOUT if out is not None else None
        try:
            self.proc = subprocess.Popen(argv, env=self.job_env, process_group=0, cwd=self.cwd,
                                         stdout=out, stderr=err)  # fmt: skip
        except OSError as exc:
            log.error("cannot start the job %s: %s", argv, exc)
            return EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
        return None

    def _ask_secrets(self) -> AskSecrets | None:
        if self.secrets is None:
            return None
        ask, speaker = self.secrets, self._speaker()
        return lambda: ask(SecretsAsk.model_validate(speaker))

    def _wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait()

    def _stop_threads(self) -> None:
        self.stopping.set()
        # So that no heartbeat is queued behind the exit report.
        self.beat_thread.join()

    def _open_output(self) -> None:
        """With a daemon to ship to: the node's output file, the agent's own lines into
        it, and the thread that ships it until the job ends (``stopping``)."""
        if self.ship is None:
            return
        try:
            output = NodeOutput(self.run_dir / OUTPUT_FILE)
        except OSError as exc:
            # The job still runs, its output to the node's log only.
            log.error("cannot open the node's output file; nothing is shipped: %s", exc)
            return
        shipper = LogShipper(output, self.ship, self._speaker,
                             initial_backoff=self.config.retry_initial_seconds,
                             max_backoff=self.config.retry_max_seconds)  # fmt: skip
        self.shipping = OutputShipping(output, shipper, every=self.config.log_seconds,
                                       stop=self.stopping, lines=self.lines)  # fmt: skip
        self.shipping.start()

    def _finish(self, code: int, phase: ExitPhase = "command") -> None:
        """Keep the exit where the daemon finds it, report it, then release the
        provider's event (after the report: on Azure the acknowledgement may end
        the VM at once). A signal to the agent cuts the wait for the report short:
        the node is going, and the kept exit outlives it."""
        # Read before the job counts as ended: a signal from now on is the node going.
        stopped = self.signalled or self.aborted.is_set()
        self.ended = True
        report = ExitReport(exit_code=code, phase=phase, detail=self.exit_detail,
                            oom_kills=self.oom_kills, **self._speaker())  # fmt: skip
        self._keep_exit(report, stopped=stopped)
        if self.shipping is not None:
            # The rest of the output before the exit: a daemon that sees the job end
            # holds all of it. Half the report's time at most, so the exit still has
            # the rest; a signal (the node going) cuts it short.
            self.shipping.finish(self.config.report_timeout_seconds / 2, self.leaving)
        if self.outbox is not None:
            self.outbox.put(report)
            if not self.outbox.drain(self.config.report_timeout_seconds, stop=self.leaving):
                log.warning("daemon did not take the reports within %.0f s or the node "
                            "is going; the exit is kept for it",
                            self.config.report_timeout_seconds)  # fmt: skip
        if "preemption" in self.noticed:
            self.watcher.job_ended()
        # A GCP long poll may still hang in the watch thread: leave its client to
        # the process exit rather than close it under a running request.
        self.watch_thread.join(timeout=1.0)
        if not self.watch_thread.is_alive():
            self.watcher.close()

    def _keep_exit(self, report: ExitReport, *, stopped: bool) -> None:
        """Write the exit beside the job's checkpoints (:mod:`spotd.exits`), so that a
        daemon that is down now still learns it after this node is gone."""
        root = self.job_env.get("SPOTD_CHECKPOINT_URI", "")
        if not root:
            return
        try:
            keep_exit(root, KeptExit(exit=report, notice=self.notice, stopped=stopped))
        except Exception as exc:
            # The report may still go; a node that cannot write here fails its
            # preflight's checkpoint check anyway.
            log.warning("cannot keep the exit in %s: %s", root, exc)

    def _leave_run_dir(self) -> None:
        """Remove the run folder if the agent made it (a configured one is left as it is),
        once its threads write nothing more there: the notice file is written under the
        start lock, and only while the agent is not stopping."""
        self.stopping.set()
        if self.config.run_dir:
            return
        with self.start_lock:
            shutil.rmtree(self.run_dir, ignore_errors=True)

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

    def _on_notice(self, notice: ProviderNotice) -> None:
        if notice.kind in self.noticed:
            return  # the provider repeats its notice at every poll; act once
        log.warning("%s notice: %s (deadline %s)", notice.kind, notice.detail, notice.deadline)
        # Under the start lock: the job either starts before this and is signalled,
        # or sees the notice and never starts.
        with self.start_lock:
            self.noticed.add(notice.kind)
            if notice.kind == "preemption":
                # The file first: a job woken by the signal reads how long it has left.
                # None once the agent is leaving: its run folder is going.
                if not self.stopping.is_set():
                    try:
                        write_notice(self.run_dir, notice)
                    except OSError as exc:
                        log.error("cannot write the notice file: %s", exc)
                self._signal_job()
        report = NoticeReport(
            kind=notice.kind, deadline=notice.deadline, detail=notice.detail, **self._speaker()
        )
        if notice.kind == "preemption":
            self.notice = report
        self._put(report)

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

    def _forward_signal(self, signum: signal.Signals) -> None:
        """SIGTERM or SIGINT to the agent (the node shutting down): pass it to the job
        at once; before the job started, give up starting it. The watch thread
        writes the notice file when the provider announces one."""
        log.info("agent got %s; forwarding it to the job", signum.name)
        self.aborted.set()
        if self.ended:
            self.leaving.set()
            return
        if self.proc is None:
            return
        if signum == self.config.checkpoint_signum:
            # Once is enough: a launcher that gets its stop signal twice (torchrun) may
            # cut its workers' shutdown, and with it their checkpoint.
            self.signalled = True
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)

    def _beat(self) -> None:
        while not self.stopping.is_set():
            self._put(self._heartbeat())
            self.stopping.wait(self.config.heartbeat_seconds)

    def _heartbeat(self) -> HeartbeatReport:
        """A heartbeat with the job's progress files and a GPU sample, where there are."""
        progress = read_progress(self.run_dir)
        gpus: tuple[GpuReading, ...] = ()
        # Only while the job runs: an idle GPU during rendezvous is not the job's.
        if self.gpus is not None and self.proc is not None and self.proc.poll() is None:
            try:
                gpus = tuple(self.gpus.sample())
            except Exception:
                log.exception("GPU sample failed")  # one bad sample must not stop the beats
        return HeartbeatReport(
            step=progress.step, total_steps=progress.total_steps,
            checkpoint=progress.checkpoint, gpus=gpus,
            ranks=job_ranks(self.run_dir, self.job_env), **self._speaker(),
        )  # fmt: skip

    def _put(self, report: AgentReport) -> None:
        if self.outbox is not None:
            self.outbox.put(report)

    def _speaker(self) -> dict[str, object]:
        return self.config.speaker(self.instance_id)

    def _resolve_instance_id(self) -> str:
        if self.config.instance_id:
            return self.config.instance_id
        try:
            found = self.watcher.instance_id()
        except Exception:
            log.exception("asking the metadata service for the instance id failed")
            found = None
        return found or socket.gethostname()

    def _with_address(self, config: AgentConfig) -> AgentConfig:
        """``config`` with the node's private address from the metadata service, if the
        watcher knows one and none was given; else the route to the daemon decides."""
        if config.address or not isinstance(self.watcher, AddressSource):
            return config
        try:
            found = self.watcher.private_address()
        except Exception:
            log.exception("asking the metadata service for the private address failed")
            return config
        return config.model_copy(update={"address": found}) if found else config

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


def run_agent(
    config: AgentConfig,
    *,
    watcher: NoticeWatcher | None = None,
    send: Sender | None = None,
    join: Join | None = None,
    ship: Ship | None = None,
    lines: AgentLines | None = None,
) -> int:
    """Run the job of ``config`` to its end and return its exit code.

    A node of a gang that reports to a daemon stands by once its command ended and
    may run the job again as a node of the job's next attempt (:mod:`spotd.agent.rejoin`);
    ``config.on_exit`` runs once, when the agent leaves. See :func:`_run_attempt` for
    the arguments.
    """
    while True:
        agent, code, following = _run_attempt(config, watcher=watcher, send=send, join=join,
                                              ship=ship, lines=lines)  # fmt: skip
        if following is None:
            break
        config, watcher = following, None  # a new run, with a watcher of its own
        clear_run_dir(config)
    agent._run_on_exit()
    return code


def _run_attempt(
    config: AgentConfig,
    *,
    watcher: NoticeWatcher | None = None,
    send: Sender | None = None,
    join: Join | None = None,
    ship: Ship | None = None,
    lines: AgentLines | None = None,
) -> tuple[_Agent, int, AgentConfig | None]:
    """Run the job of ``config`` as a node of its attempt: the agent, the job's exit
    code, and the configuration of the next run if the node rejoins the job.

    ``watcher`` defaults to the one for ``config.provider``; ``send`` (one
    delivery of one report, raising ``ReportFailed`` to be retried), ``join``
    (one ask for the gang's roster) and ``ship`` (one chunk of the node's output)
    default to a :class:`DaemonReporter` on ``config.daemon_url``, or to no
    reporting, no gang and no shipping when that is unset. ``lines``: the handler
    the agent's own log lines go through, which then writes them into the node's
    output too (:class:`~spotd.agent.output.AgentLines`).
    """
    reporter: DaemonReporter | None = None
    secrets: AskSecretsOf | None = None
    if send is None and config.daemon_url:
        reporter = DaemonReporter(config.daemon_url, config.token.get_secret_value())
        send, join, secrets = reporter.send, reporter.join, reporter.secrets
        ship = ship or reporter.ship
    gpus = open_gpu_source(config.job_env)
    watcher = watcher or make_watcher(config)
    orders: OrdersWatcher | None = None
    if reporter is not None:
        # The daemon may stop the job as the market would (spotd.core.orders).
        orders = OrdersWatcher(watcher, reporter.orders, every=config.heartbeat_seconds)
        watcher = orders
    try:
        agent = _Agent(config, watcher, send, join, gpus,
                       secrets=secrets, ship=ship, lines=lines)  # fmt: skip
        if orders is not None:
            orders.speaker = lambda: agent._speaker() if agent.instance_id else None
        code = agent.run()
        following = None
        if reporter is not None and stands_by(agent.config, phase=agent.phase,
                                              noticed="preemption" in agent.noticed,
                                              stopped=agent.aborted.is_set(),
                                              peer_at_fault=agent.peer_at_fault):  # fmt: skip
            stop = threading.Event()
            with stopping_on_signals(stop):
                resolved = agent.config.model_copy(update={"instance_id": agent.instance_id})
                following = stand_by(resolved, reporter.next_step, stop=stop)
        return agent, code, following
    finally:
        if reporter is not None:
            reporter.close()
        if gpus is not None:
            gpus.close()


USAGE = "usage: python -m spotd.agent [--] COMMAND [ARG...]   (settings: SPOTD_AGENT_* variables)"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: settings from the environment, the job's argv from ``argv``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command = args[1:] if args and args[0] == "--" else args
    level = os.environ.get("SPOTD_AGENT_LOG_LEVEL", "INFO").strip().upper()
    lines = AgentLines()  # to stderr, and into the node's output while the job runs
    logging.basicConfig(
        level=logging.getLevelNamesMapping().get(level, logging.INFO),
        format="%(asctime)s spotd-agent %(levelname)s %(name)s: %(message)s",
        handlers=[lines],
    )
    # One line per report would bury the job's own output in `spotd logs`.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = AgentConfig.from_env(os.environ, command or None)
    except ConfigError as exc:
        print(f"spotd agent: {exc}\n{USAGE}", file=sys.stderr)
        return EXIT_USAGE
    # Read once: the job, a child of this process, must not find it in our /proc environ.
    forget([TOKEN_VARIABLE])
    return run_agent(config, lines=lines)
