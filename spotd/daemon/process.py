"""The long-running daemon: reconcile loop and price polls on APScheduler 3, HTTP API on uvicorn.

Shutdown is graceful: on SIGTERM or SIGINT the API stops taking requests, the
reconcile pass in flight finishes (bounded by ``daemon.drain_seconds``), and
instances keep running: they are cloud machines, and the next daemon start
picks them up from the store.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import make_url
from starlette.types import ASGIApp

from spotd.core.clock import WALL, DatabaseClock, clock_note
from spotd.core.contracts import AgentHost, Clock
from spotd.core.errors import StoreError
from spotd.core.handlers import on_stop_signals
from spotd.daemon.api import create_app
from spotd.daemon.config import Settings
from spotd.daemon.http11 import MAX_HEAD_BYTES, DaemonHttp
from spotd.daemon.secrets import load_secrets, secret_variables
from spotd.daemon.tokens import ensure_token
from spotd.daemon.wiring import build_engine, build_mailer_for, build_reader
from spotd.engine.reconcile import Engine
from spotd.environ import forget, hide
from spotd.mail import schedule_mail
from spotd.mail.webhook_worker import build_dispatcher, schedule_webhooks
from spotd.registry import find_kind_of, provider_kinds
from spotd.store.base import make_engine
from spotd.store.board import SqlOfferingBoard
from spotd.store.coordination import Coordinator

log = logging.getLogger(__name__)


class _ThreadServer(uvicorn.Server):
    """uvicorn without its own signal handling: the daemon owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def api_server_config(app: ASGIApp) -> uvicorn.Config:
    """uvicorn's configuration for the API: its HTTP protocol named, not left to what
    is installed, so that a request head over :data:`MAX_HEAD_BYTES` gets 431 and a
    malformed request 400, each drained before the close (:mod:`spotd.daemon.http11`)."""
    return uvicorn.Config(
        app, http=DaemonHttp, h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        log_level="warning", lifespan="off",
    )  # fmt: skip


def quiet_scheduler_log(verbose: bool = False) -> None:
    """APScheduler logs every run of every job at INFO, and a pass or poll that
    overran its interval (skipped, as ``max_instances=1`` means it to be) as a
    WARNING: both only with ``verbose``."""
    logging.getLogger("apscheduler").setLevel(logging.DEBUG if verbose else logging.ERROR)


def start_summary(
    settings: Settings, config_file: Path | None, providers: list[str], clock: Clock = WALL
) -> str:
    """The line a daemon logs at start: what it read and what it will do."""
    source = str(config_file) if config_file else "no config file (defaults and SPOTD_* variables)"
    database = make_url(settings.db_url).render_as_string(hide_password=True)
    mail = settings.email
    email = f"on via {mail.host}, to {len(mail.to)} address(es)" if mail.host else "off"
    hooks = ", ".join(sorted(settings.webhooks)) or "none"
    return (
        f"config: {source}; database: {database}; providers: {', '.join(providers) or 'none'}; "
        f"email: {email}; webhooks: {hooks}; clock: {clock_note(clock) or 'real time'}, "
        f"times shown in {settings.display.timezone}"
    )


def _clear_secrets() -> None:
    """Once the daemon has read them, its secrets leave what ``/proc`` shows of it
    (:mod:`spotd.environ`): spotd's own variables go, the cloud SDKs' keys stay for
    their clients. A job on the daemon's host could read them there otherwise."""
    cleared = forget(secret_variables(Settings, os.environ))
    cleared += hide(name for kind in provider_kinds() for name in kind.secret_variables)
    if cleared:
        log.info("secrets read and cleared from the environment: %s", ", ".join(cleared))


class StoreFaults:
    """The log of a store fault that fails pass after pass: one line when it comes (or
    changes), none while the same one repeats, one when a pass gets through again.

    A database outage lasts many passes; a traceback on each would bury every
    other line of the log, and would tell nothing the first line did not.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._last: tuple[type[StoreError], str] | None = None

    def failed(self, exc: StoreError) -> None:
        """A pass failed on ``exc``: logged unless it is the fault logged last."""
        seen = (type(exc), str(exc))
        if seen != self._last:
            self._log.error("reconcile pass failed: %s; each pass retries, and this is logged "
                            "again when it changes or clears", exc)  # fmt: skip
        self._last = seen

    def passed(self) -> None:
        """A pass got through: the fault, if one was logged, has cleared."""
        if self._last is not None:
            self._log.info("reconcile passes again: the store fault cleared")
        self._last = None


class Daemon:
    """One daemon process: engine, scheduler and API server; ``wall`` is the real clock
    (when the scheduled work first runs, the prices' ages, SQLite's database time),
    which the engine's, on a simulated market, is not."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine | None = None,
        *,
        config_file: Path | None = None,
        wall: Clock = WALL,
    ) -> None:
        self.settings = settings
        self._wall = wall
        self.config_file = config_file
        self.engine = engine or build_engine(settings)
        self.reader = build_reader(self.engine, zone=settings.display.zone,
                                   can_email=settings.email.enabled)
        """What the API and the dashboard read and ask through: never the engine."""
        self.mailer = build_mailer_for(settings, self.engine)
        if self.mailer is not None:
            self.engine.on_end = self.mailer.job_ended
        self.scheduler = BackgroundScheduler(timezone="UTC")
        sql = make_engine(settings.db_url)
        self.coordinator = Coordinator(sql, wall=wall)
        if self.coordinator.shared:
            # One daemon polls the clouds' price APIs (rate-limited) for all of them.
            board = SqlOfferingBoard(sql, DatabaseClock(self.coordinator.database_time).now)
            self.engine.market.share(
                board, lambda: self.coordinator.leading, self._stale_after()
            )
        # Free jobs are shared out between the daemons alive on the database.
        self.engine.peers = self.coordinator.live_daemons
        # Webhooks are sent by the leader only: one daemon POSTs each transition.
        self.webhooks = build_dispatcher(
            settings.webhooks, self.engine.store, self.engine.clock,
            leading=lambda: self.coordinator.leading,
        )  # fmt: skip
        self._stopping = threading.Event()
        self._in_pass = threading.Lock()
        self._ticks = 0
        self._store_faults = StoreFaults(log)
        self._server: _ThreadServer | None = None
        self._server_thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Start the API server and the scheduled work in background threads.

        Refuses (:class:`~spotd.core.errors.ConfigError`) to start beside a live
        daemon on the same data_dir, the same SQLite database, or the same owner
        name on one PostgreSQL database.
        """
        self.coordinator.claim_daemon(self.settings.data_dir, self.settings.daemon.owner)
        self.engine.announce()
        token = ensure_token(self.settings.token_file)
        sock = self._bind()
        outbox = self.mailer.outbox if self.mailer is not None else None
        app = create_app(
            self.reader, token, outbox=outbox, secrets=load_secrets(self.settings.secrets),
            max_body_bytes=self.settings.daemon.max_body_bytes,
            body_timeout_seconds=self.settings.daemon.body_timeout_seconds, wall=self._wall,
            log_keep_bytes=self.settings.agent.log_keep_bytes,
        )  # fmt: skip
        self._server = _ThreadServer(api_server_config(app))
        self._server_thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="spotd-api", daemon=True
        )
        self._server_thread.start()
        self._link_agents(token)
        self._schedule()
        if self.mailer is not None:
            schedule_mail(self.scheduler, self.mailer)
        if self.webhooks is not None:
            every = self.settings.daemon.tick_seconds
            schedule_webhooks(self.scheduler, self.webhooks, seconds=every)
        self.scheduler.start()
        log.info(start_summary(self.settings, self.config_file, sorted(self.engine.providers),
                               self.engine.clock))  # fmt: skip
        log.info("spotd daemon listening on %s:%d", self.settings.daemon.host, self.port)
        # Last: clients (and tests) take the address file as the sign the daemon is up,
        # its start lines logged and its scheduled work running.
        self._write_address()

    def stop(self) -> None:
        """Drain: stop the API, let the pass in flight finish, stop the scheduler."""
        self._stopping.set()
        if self._server is not None:
            self._server.should_exit = True
        drain = self.settings.daemon.drain_seconds
        if self._server_thread is not None:
            self._server_thread.join(timeout=drain)
        if self.webhooks is not None:
            self.webhooks.stop()
        if self.scheduler.running:  # not yet, when Ctrl-C cut start() short
            self.scheduler.shutdown(wait=False)
        # Bounded wait for the pass in flight: each step is short and safe to
        # cut (the next start repeats it), so a stuck provider call must not
        # hold the shutdown hostage.
        if self._in_pass.acquire(timeout=drain):
            self._in_pass.release()
        else:
            log.warning("a reconcile pass is still running after %.0f s; stopping anyway", drain)
        with contextlib.suppress(FileNotFoundError):
            self.settings.address_file.unlink()
        self.coordinator.release()
        self.engine.store.close()
        # The line an operator looks for after Ctrl-C or SIGTERM: what stopped, what did not.
        log.info("stopped: the API is closed and no pass runs; instances keep running, "
                 "and the next start picks them up")  # fmt: skip

    def run_forever(self) -> None:
        """Start, then block until SIGTERM or SIGINT, then drain."""
        done = threading.Event()

        def drain(sig: signal.Signals) -> None:
            log.info("received %s, draining", sig.name)
            done.set()

        # Kept while it drains, too: a second signal then changes nothing.
        with on_stop_signals(drain):
            self.start()
            _clear_secrets()
            while not done.wait(0.5):
                pass
            self.stop()

    # -- scheduled work ----------------------------------------------------

    def _schedule(self) -> None:
        every = self.settings.daemon.tick_seconds
        self.scheduler.add_job(
            self._reconcile, "interval", seconds=every, id="reconcile",
            max_instances=1, coalesce=True, next_run_time=self._wall.now(),
        )
        for name, poll in self._poll_seconds().items():
            self.scheduler.add_job(
                self.engine.market.refresh, "interval", args=[name], seconds=poll,
                id=f"poll-{name}", max_instances=1, coalesce=True, next_run_time=self._wall.now(),
            )

    def _poll_seconds(self) -> dict[str, float]:
        """How often each provider's prices are polled.

        The provider's kind says (the simulator's market moves with its fast
        clock); a cloud's API has rate limits and its prices move over minutes:
        ``[scheduling] price_poll_seconds``.
        """
        every = self.settings.daemon.tick_seconds
        default = self.settings.scheduling.price_poll_seconds
        polls: dict[str, float] = {}
        for name in self.engine.providers:
            kind = find_kind_of(name)
            own = None if kind is None else kind.price_poll_seconds
            polls[name] = default if own is None else max(every, own)
        return polls

    def _stale_after(self) -> dict[str, float]:
        """When a follower stops waiting for the leader's poll and polls itself:
        two polls missed, plus the pass in which a new leader is found."""
        every = self.settings.daemon.tick_seconds
        return {name: 2 * poll + every for name, poll in self._poll_seconds().items()}

    def _reconcile(self) -> None:
        with self._in_pass:
            if self._stopping.is_set():
                return
            try:
                leading = self.coordinator.try_lead()
                self.engine.keeps_history = leading
                self.engine.tick()
                self._ticks += 1
                if leading and self._ticks % self.settings.daemon.reap_every_ticks == 0:
                    # The leader reaps for every owner: a dead daemon's orphans included.
                    owners = {self.settings.daemon.owner, *self.engine.store.job_owners()}
                    self.engine.reap(sorted(owners))
            except StoreError as exc:
                # A database outage: the same fault pass after pass, logged once.
                self._store_faults.failed(exc)
            except Exception:
                # The loop must outlive any one bad pass: an error of no known kind
                # is a bug, whose traceback is wanted each time.
                log.exception("reconcile pass failed; next pass retries")
            else:
                self._store_faults.passed()

    # -- helpers --------------------------------------------------------------

    def _link_agents(self, token: str) -> None:
        """Tell the providers whose nodes need it where this daemon answers."""
        host = self.settings.daemon.host
        if host in ("0.0.0.0", "::", ""):  # noqa: S104 - the bind-all address, read not bound
            host = "127.0.0.1"
        url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}"
        for provider in self.engine.providers.values():
            if isinstance(provider, AgentHost):
                provider.link_agents(url, token)

    def _bind(self) -> socket.socket:
        host, port = self.settings.daemon.host, self.settings.daemon.port
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listen now, not when uvicorn gets to it: clients that read the address
        # file the moment it appears queue in the backlog instead of being refused.
        sock.listen(128)
        self.port = sock.getsockname()[1]
        return sock

    def _write_address(self) -> None:
        info = {"host": self.settings.daemon.host, "port": self.port, "pid": os.getpid()}
        tmp = self.settings.address_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(self.settings.address_file)
