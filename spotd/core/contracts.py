"""The contracts between spotd's layers, all in one place.

Adapters implement these protocols; mypy checks that they fit, and one
contract test suite per protocol runs against every implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar, runtime_checkable

from spotd.core.errors import ConfigError
from spotd.core.intents import IntentKind, IntentOutcome, IntentRecord
from spotd.core.spec import JobSpec
from spotd.core.values import (
    AttemptRecord,
    CloudCheck,
    Decision,
    EventCause,
    EventFacts,
    EventRecord,
    Instance,
    InstanceReport,
    JobRecord,
    JobStatus,
    LaunchRequest,
    LedgerEntry,
    Offering,
    PlacementContext,
    PlacementObject,
    Pool,
    PricePoint,
    Transition,
)

if TYPE_CHECKING:
    from spotd.core.agent_wire import ProviderNotice
    from spotd.core.values import NodeUsage


class Clock(Protocol):
    """Where "now" comes from: the wall clock, or a simulated one (see
    :mod:`spotd.core.clock`: nothing else reads the time)."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Real seconds from an arbitrary start, never going back: for timeouts,
        backoffs and cache ages. Only the difference of two readings means anything."""
        ...

    def seconds_to_real(self, seconds: float) -> float:
        """Real seconds that ``seconds`` of this clock's time take."""
        ...


@runtime_checkable
class Provider(Protocol):
    """A market of GPU instances: a cloud, or the simulator.

    Every method raises only :class:`~spotd.core.errors.ProviderError` subclasses
    for failures on the provider's side.
    """

    name: str

    def offerings(self) -> Sequence[Offering]:
        """Current offerings with spot and on-demand prices and capacity."""
        ...

    def launch(self, request: LaunchRequest) -> Sequence[Instance]:
        """Start ``request.nodes`` nodes, all or none; idempotent by client token."""
        ...

    def describe(self, instance_ids: Sequence[str]) -> Sequence[Instance]:
        """The current state of these instances (unknown ids are left out)."""
        ...

    def list_instances(self, tags: Mapping[str, str]) -> Sequence[Instance]:
        """Every instance whose tags include all of ``tags``, ended ones too."""
        ...

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Stop these instances; ids already gone are ignored."""
        ...

    def logs(self, instance_id: str) -> str:
        """The job's output on that instance, as far as the provider keeps it."""
        ...


@runtime_checkable
class Metered(Protocol):
    """A provider that keeps its own meter (launch, end and price of each node).

    The ledger bills from it when it is there, to match the provider's own
    bill to the cent; otherwise it bills from what ``describe`` says.
    """

    def usage(self, instance_ids: Sequence[str]) -> Mapping[str, NodeUsage]:
        """The meter's record of each instance, by id."""
        ...


@runtime_checkable
class PlacementHost(Protocol):
    """A provider that creates placement objects for gangs (see :class:`PlacementObject`).

    ``launch`` creates them (idempotently, named after job and attempt) before
    the instances and tags them as it tags the instances. The engine deletes an
    attempt's objects when the attempt ends, and the reaper deletes every one
    whose attempt is closed or unknown once no live instance of it is left.
    """

    def list_placements(self, tags: Mapping[str, str]) -> Sequence[PlacementObject]:
        """Every placement object spotd made whose tags include all of ``tags``."""
        ...

    def delete_placements(self, placements: Sequence[PlacementObject]) -> None:
        """Delete these; ones already gone are ignored.

        Raises :class:`~spotd.core.errors.ProviderError` when one cannot go yet
        (its instances are still shutting down): the reaper tries again later.
        """
        ...


@runtime_checkable
class CloudChecker(Protocol):
    """A provider that can check, spending nothing, that a launch would be accepted."""

    def check_cloud(self, request: LaunchRequest | None) -> CloudCheck:
        """Check credentials, permissions and quotas, and ``request`` if given.

        Creates nothing billable and nothing at all that outlives the call:
        dry runs and read-only or validation calls only. Never raises for a
        failing check: each failure is an outcome naming what is missing.
        """
        ...


@runtime_checkable
class Driller(Protocol):
    """A provider that can preempt one of its spot nodes on purpose, through its own
    mechanism, for a drill (``spotd drill``): the node gets the provider's notice as from
    its market, so a job proves its checkpoint and resume before a preemption counts."""

    def drill(self, instance_id: str) -> None:
        """Have the provider preempt this spot instance as its market would: its notice
        reaches the node, and the node is taken back when the notice is over. Returns
        once the provider took the request.

        Raises :class:`~spotd.core.errors.NotFoundError` for an instance it does not
        have or that has ended, :class:`~spotd.core.errors.InvalidRequestError` for an
        on-demand one or a drill the account is not set up for, and any other
        :class:`~spotd.core.errors.ProviderError` as its other calls do.
        """
        ...


@runtime_checkable
class AgentHost(Protocol):
    """A provider whose nodes run spotd's agent only once told where the daemon is.

    The cloud adapters get the daemon's URL from the configuration at build
    time (their boot scripts carry it); the simulated market learns it when
    the daemon has bound its port, which may be any free one.
    """

    def link_agents(self, daemon_url: str, daemon_token: str) -> None:
        """Run the agent around the job on nodes launched from now on."""
        ...


class Policy(Protocol):
    """Decides where a job runs. The daemon, ``spotd plan`` and the simulator share them."""

    name: str

    def place(self, ctx: PlacementContext, offerings: Sequence[Offering]) -> Decision:
        """Score every offering for the job and choose one (or none)."""
        ...


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of a job listing (:meth:`JobStore.jobs_page`), newest first."""

    jobs: Sequence[JobRecord]
    next: str | None
    """The cursor of the page after this one; None when this is the last."""


class JobStore(Protocol):
    """Durable jobs, their events and their placement attempts, and the leases on them."""

    def create_job(
        self, spec: JobSpec, *, now: datetime, idempotency_key: str | None = None
    ) -> JobRecord:
        """Insert a new PENDING job (and its first event).

        With an ``idempotency_key`` another job already holds, nothing is inserted
        and that job is returned: a retried submit finds the job it made.
        """
        ...

    def job_by_idempotency_key(self, key: str) -> JobRecord | None:
        """The job submitted with this idempotency key, None when there is none."""
        ...

    def get_job(self, job_id: str) -> JobRecord:
        """The job with this id, or :class:`~spotd.core.errors.JobNotFound`."""
        ...

    def find_job(self, ref: str) -> JobRecord:
        """A job by id, unique id prefix, or name (the newest of that name)."""
        ...

    def jobs_by_id(self, job_ids: Collection[str]) -> dict[str, JobRecord]:
        """These jobs, those that exist, by id: one read for many jobs."""
        ...

    def list_jobs(self, statuses: Collection[JobStatus] | None = None) -> list[JobRecord]:
        """Jobs, oldest first, optionally only those in ``statuses``."""
        ...

    def jobs_page(
        self,
        *,
        statuses: Collection[JobStatus] | None = None,
        team: str | None = None,
        limit: int,
        cursor: str | None = None,
        name: str | None = None,
    ) -> JobPage:
        """Up to ``limit`` jobs, newest first (by submit time, then id), optionally only
        those in ``statuses``, of ``team`` (``spec.team``) and whose name contains
        ``name`` (any case), starting after ``cursor`` (a page's ``next``).

        A keyset read: each page costs the same however deep it is, and a job that
        was there when the first page was read is on exactly one page (one whose
        status changes across a status filter meanwhile may not be).
        :class:`~spotd.core.errors.StoreError` for a cursor the store did not make.
        """
        ...

    def compare_and_set(self, change: Transition, *, now: datetime) -> JobRecord:
        """Apply ``change`` if the job is still in ``change.expected``.

        In one transaction: the status update guarded by the expected status,
        the event row, and the attempt opened or closed with it. Raises
        :class:`~spotd.core.errors.LostTransition` when the guard fails.
        """
        ...

    def set_waiting(
        self, job_id: str, status: JobStatus, reason: str, *, now: datetime, cause: EventCause = ...
    ) -> bool:
        """Record why the job, still in ``status``, waits, with an event (``status`` to
        ``status``, ``cause``: ``WAITING_CAUSE`` by default), only if the job is in
        ``status`` and the reason is new; whether it wrote. Any later change of status
        clears the reason."""
        ...

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        """All attempts of a job in order."""
        ...

    def attempts_for(self, job_ids: Collection[str]) -> dict[str, list[AttemptRecord]]:
        """The attempts of many jobs at once, by job id (every id is a key)."""
        ...

    def set_attempt_instances(self, attempt_id: int, instance_ids: Sequence[str]) -> None:
        """Record the instances a launch returned; the job's ``version`` goes up."""
        ...

    def mark_attempt_running(self, attempt_id: int, *, at: datetime) -> None:
        """Record when all nodes of the attempt started running the job (the first time
        only; that write, like every change of a job's status or attempts, bumps its
        ``version``)."""
        ...

    def events(self, job_id: str) -> list[EventRecord]:
        """All events of a job in order."""
        ...

    def job_owners(self) -> list[str]:
        """Every daemon owner name that holds or held a job's lease."""
        ...

    def claim_jobs(
        self, owner: str, *, now: datetime | None = None, lease_seconds: float
    ) -> list[str]:
        """Take or renew the lease of active jobs free or already ours; return their ids."""
        ...

    def claim_notification(self, key: str, *, at: datetime) -> bool:
        """Record notification ``key`` as sent; True when this call was the first."""
        ...


class HistoryStore(Protocol):
    """What was observed over time: polled prices per pool, and the agents' reports."""

    def record_prices(self, offerings: Sequence[Offering], *, at: datetime) -> int:
        """Keep the offerings' prices as history; returns the rows written."""
        ...

    def price_history(self, pool: Pool, *, since: datetime) -> list[PricePoint]:
        """The pool's polled prices since ``since``, oldest first."""
        ...

    def save_report(self, report: InstanceReport) -> None:
        """Merge an agent's report (fields left None keep their value)."""
        ...

    def reports(self, job_id: str) -> list[InstanceReport]:
        """What the agents of a job's instances reported."""
        ...

    def reports_for(self, job_ids: Collection[str]) -> dict[str, list[InstanceReport]]:
        """The agents' reports of many jobs at once, by job id (every id is a key)."""
        ...


class LedgerStore(Protocol):
    """The ledger: every billed line of every job (:mod:`spotd.billing.ledger`)."""

    def replace_ledger(self, job_id: str, entries: Sequence[LedgerEntry]) -> None:
        """Replace the job's ledger lines with ``entries`` in one transaction."""
        ...

    def ledger(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        job_id: str | None = None,
    ) -> list[LedgerEntry]:
        """Ledger lines starting in ``[since, until)``, of one job or all, oldest first."""
        ...

    def ledger_for(self, job_ids: Collection[str]) -> dict[str, list[LedgerEntry]]:
        """The ledger lines of many jobs at once, by job id (every id is a key)."""
        ...

    def unbilled_jobs(self, owner: str) -> list[str]:
        """Ended jobs last held by ``owner`` with an ended attempt that ran nodes and
        has no ledger line (a daemon died between the job's end and its bill)."""
        ...


@dataclass(frozen=True, slots=True)
class Published:
    """One provider's offerings as the leading daemon last polled them."""

    offerings: tuple[Offering, ...]
    published_at: datetime
    """When the leader published them, on the database's clock."""
    age_seconds: float
    """Seconds since then, on the same clock."""


class OfferingBoard(Protocol):
    """Where the leading daemon publishes its price polls for the others to read."""

    def publish(self, provider: str, offerings: Sequence[Offering]) -> None:
        """Replace ``provider``'s publication with ``offerings``."""
        ...

    def read(self, provider: str) -> Published | None:
        """``provider``'s last publication, None if there is none."""
        ...


class IntentStore(Protocol):
    """What users asked of jobs, kept for the reconcile loop (:mod:`spotd.core.intents`)."""

    def request_intent(
        self,
        job_id: str,
        kind: IntentKind,
        *,
        at: datetime,
        priority: int | None = None,
        node: int | None = None,
    ) -> IntentRecord:
        """Store what a user asks of an active job (the open one, if it is asked
        already) and bump the job's version so that its daemon steps it."""
        ...

    def settle_intent(
        self,
        intent: IntentRecord,
        outcome: IntentOutcome,
        *,
        at: datetime,
        cause: EventCause | None = None,
        detail: str = "",
        facts: EventFacts = ...,
    ) -> None:
        """Settle ``intent`` as ``outcome`` and, with a ``cause``, write an event of it
        (from and to the job's status, with ``detail`` and ``facts``) in one transaction."""
        ...

    def open_intents(self, job_ids: Collection[str] | None = None) -> dict[str, list[IntentRecord]]:
        """The intents not settled yet, by job, oldest first; of ``job_ids`` only, if given."""
        ...

    def intents(self, job_id: str) -> list[IntentRecord]:
        """Every intent of the job, settled or not, oldest first."""
        ...

    def apply_priority(self, intent: IntentRecord, *, at: datetime) -> JobRecord:
        """Give the job the priority the intent asks and settle it, in one transaction."""
        ...


class Store(JobStore, HistoryStore, LedgerStore, IntentStore, Protocol):
    """The whole durable state (SQLite or PostgreSQL: :class:`spotd.store.SqlStore`)."""

    def close(self) -> None:
        """Release connections."""
        ...


class SessionStore(Protocol):
    """The dashboard's logged-out sessions, shared by the daemons on one database."""

    def end_session(self, session_id: str, *, until: datetime) -> None:
        """Refuse session ``session_id`` from now on; it expires at ``until`` anyway
        (ended sessions past it are forgotten)."""
        ...

    def session_ended(self, session_id: str) -> bool:
        """Whether session ``session_id`` was logged out of."""
        ...


class HoldStore(Protocol):
    """The nodes failed attempts keep for inspection (``keep_on_failure``), read and ended
    by the hold's keeper (:mod:`spotd.engine.holds`)."""

    def held_attempts(self, owners: Collection[str]) -> list[AttemptRecord]:
        """The attempts whose nodes a hold keeps, of the jobs ``owners`` hold or last held."""
        ...

    def end_hold(self, attempt_id: int, *, at: datetime, detail: str) -> bool:
        """Record the kept nodes stopped (an event, the release intents settled); False
        when the attempt keeps none."""
        ...


class EngineStore(Store, SessionStore, HoldStore, Protocol):
    """The store as the engine reads it: the contract, and reads that keep a pass
    proportional to what changed (:class:`spotd.store.SqlStore` has them)."""

    def claim_job_versions(
        self,
        owner: str,
        *,
        now: datetime | None = None,
        lease_seconds: float,
        share_of: int = 1,
    ) -> dict[str, int]:
        """Renew ``owner``'s lease, take free jobs up to its ``1 / share_of`` of the
        active ones, return every active job held, with its version."""
        ...

    def renew_lease(self, owner: str, *, lease_seconds: float) -> None:
        """Renew ``owner``'s lease without taking a job (a daemon starting)."""
        ...

    def job_versions(self, job_ids: Collection[str]) -> dict[str, int]:
        """The versions of these jobs, by id."""
        ...

    def report_changes(self, since: int) -> tuple[list[InstanceReport], int]:
        """The agents' reports written since ``since``, and the ``since`` of the next read."""
        ...

    def report_cursor(self) -> int:
        """The ``since`` from which :meth:`report_changes` returns what is written later."""
        ...


class JobSource(Protocol):
    """The part of :class:`~spotd.core.contracts.Store` the mailer reads."""

    def list_jobs(self, statuses: Collection[JobStatus] | None = None) -> list[JobRecord]:
        """Jobs, oldest first, optionally only those in ``statuses``."""
        ...

    def attempts_for(self, job_ids: Collection[str]) -> dict[str, list[AttemptRecord]]:
        """The attempts of many jobs at once, by job id."""
        ...

    def events(self, job_id: str) -> list[EventRecord]:
        """All events of a job in order."""
        ...

    def ledger(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        job_id: str | None = None,
    ) -> list[LedgerEntry]:
        """Stored ledger lines, of one job or all, oldest first."""
        ...


class TransitionSource(Protocol):
    """The part of :class:`~spotd.core.contracts.Store` the webhooks read and claim."""

    def get_job(self, job_id: str) -> JobRecord:
        """The job, or JobNotFound."""
        ...

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        """All attempts of a job in order."""
        ...

    def ledger(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        job_id: str | None = None,
    ) -> list[LedgerEntry]:
        """Stored ledger lines, of one job or all, oldest first."""
        ...

    def claim_notification(self, key: str, *, at: datetime) -> bool:
        """Record that notification ``key`` goes out; True only for the first claimer."""
        ...


class Notifier(Protocol):
    """Sends a message to people (email now; chat later)."""

    def send(
        self,
        to: Sequence[str],
        subject: str,
        text: str,
        html: str | None = None,
        images: Mapping[str, bytes] | None = None,
    ) -> None:
        """Deliver one message (or accept it for delivery) or raise.

        ``images`` maps a Content-ID to PNG bytes shown inline in ``html``,
        which refers to each as ``cid:<content-id>``.
        """
        ...


SettingsT_contra = TypeVar("SettingsT_contra", contravariant=True)


@dataclass(frozen=True, slots=True)
class ProviderContext:
    """What the daemon hands a kind's ``build`` hook besides its settings table."""

    state_dir: Path
    """A folder of the kind's own under the daemon's data_dir (created on demand)."""
    boot_script: Callable[[LaunchRequest], str] | None = None
    """Renders the boot script of a launch request's nodes on this kind's carrier;
    None for a kind without a carrier."""
    wall: Callable[[], float] | None = None
    """The daemon's reference for POSIX time, when it keeps one other than this
    host's clock (the database server's, when several daemons share it). A kind
    that brings its own clock runs it on this, so every daemon agrees."""

    def require_boot_script(self, kind: str) -> Callable[[LaunchRequest], str]:
        """The boot-script renderer, or a ConfigError when the daemon has none."""
        if self.boot_script is None:
            raise ConfigError(f"[providers.{kind}] needs a boot script, and none was given")
        return self.boot_script


@dataclass(frozen=True, slots=True)
class BuiltProviders:
    """What a ``build`` hook returns: the kind's providers and, if it keeps one, its clock."""

    providers: Sequence[Provider]
    clock: Clock | None = None
    """None: the providers run on the wall clock."""


class ProviderFactory(Protocol[SettingsT_contra]):
    """A provider kind's ``build`` hook (:class:`spotd.core.kinds.ProviderKind`)."""

    def __call__(self, settings: SettingsT_contra, context: ProviderContext, /) -> BuiltProviders:
        """The kind's providers from its ``[providers.<name>]`` table.

        Loads the kind's SDK if it has one. Raises ConfigError, or ValueError for a
        setting the kind refuses (reported against its table).
        """
        ...


@runtime_checkable
class AddressSource(Protocol):
    """A notice watcher that can also tell the node's private address (cloud metadata).

    The agent joins its gang with it: on a VM with several NICs (GCP's A3) the
    route to the daemon need not leave by the NIC its peers reach it on.
    """

    def private_address(self) -> str | None:
        """The primary NIC's private IPv4 address, None if unknown."""
        ...


class NoticeWatcher(Protocol):
    """What the runner needs of a provider's notice source."""

    @property
    def poll_interval(self) -> float:
        """Seconds to wait between two :meth:`check` calls."""
        ...

    def check(self) -> ProviderNotice | None:
        """One poll; None when nothing is announced or the metadata service failed."""
        ...

    def instance_id(self) -> str | None:
        """This VM's id as the provider's API names it, or None if unknown."""
        ...

    def job_ended(self) -> None:
        """The job exited after a preemption notice (its checkpoint is done)."""
        ...

    def close(self) -> None:
        """Release the HTTP client."""
        ...


class WatcherSettings(Protocol):
    """What a notice watcher reads of the agent's settings (the agent's ``AgentConfig``)."""

    @property
    def metadata_base(self) -> str:
        """The metadata service's base URL, without a trailing slash."""
        ...

    @property
    def poll_interval(self) -> float:
        """Seconds between two polls."""
        ...

    @property
    def vm_name(self) -> str:
        """The VM's name where the provider's events name VMs (Azure); may be empty."""
        ...

    @property
    def long_poll_seconds(self) -> float:
        """How long a metadata long poll may wait (GCP)."""
        ...

    @property
    def azure_ack(self) -> Literal["after-exit", "immediate"]:
        """When a scheduled event is acknowledged (Azure)."""
        ...

    @property
    def sim_state(self) -> str:
        """A simulated node's status file."""
        ...


class NoticeWatcherFactory(Protocol):
    """A provider kind's ``notice_watcher`` hook: the agent's watcher on its nodes."""

    def __call__(self, config: WatcherSettings, /) -> NoticeWatcher:
        """The watcher of ``config``'s metadata service (``config.metadata_base``) polling
        every ``config.poll_interval`` seconds."""
        ...


class ClockOpener(Protocol):
    """A provider kind's ``open_clock`` hook: the clock its records are on."""

    def __call__(self, state_dir: Path, /) -> Clock | None:
        """The kind's saved clock in ``state_dir``; None when it has not started.
        Raises OSError or ValueError on an unreadable one."""
        ...
