"""Domain values shared by every layer: offerings, instances, job records.

All are frozen dataclasses or ``str`` enums, so they cross module borders as
typed values, never as loose dicts.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Protocol

from spotd.core.network import Interconnect

if TYPE_CHECKING:
    from spotd.core.capacity import CapacitySeries
    from spotd.core.spec import JobSpec


# -- a job's status ------------------------------------------------------------------


class JobStatus(StrEnum):
    """Where a job is in its life."""

    PENDING = "pending"
    """Submitted, waiting for its first placement."""
    PROVISIONING = "provisioning"
    """An attempt is open and its nodes are being launched or booting."""
    RUNNING = "running"
    """All nodes of the open attempt run the job."""
    CHECKPOINTING = "checkpointing"
    """A preemption notice came: the job is writing its checkpoint."""
    RECOVERING = "recovering"
    """The last attempt ended early; waiting for a new placement."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """Ended without success; ``failure`` says why."""
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
"""The statuses a job ends in. It leaves one only when a user retries it (failed or
cancelled to recovering, :mod:`spotd.engine.retrying`); the loop never moves it."""


class FailureCause(StrEnum):
    """Why a job failed, kept apart so users and reports can tell them apart."""

    NO_CAPACITY = "no-capacity"
    OVER_BUDGET = "over-budget"
    DEADLINE_IMPOSSIBLE = "deadline-impossible"
    USER_COMMAND_FAILED = "user-command-failed"
    PROVIDER_ERROR = "provider-error"
    INVALID_SPEC = "invalid-spec"
    SETUP_FAILED = "setup-failed"
    """The job's setup (or the download of its code) failed on more attempts than
    ``retry.setup_failures`` allows."""
    LAUNCH_FAILED = "launch-failed"
    """Its launches failed (``launch-failed`` or ``no-capacity`` attempts) more often than
    ``retry.launch_failures`` allows, or in every pool it could use more often than
    ``retry.launch_failures_per_pool``."""
    HUNG = "hung"
    """Its gang hung (no rank's step moved for ``gang.hang_timeout``) on more attempts in
    a row than ``retry.hangs`` allows."""


class Market(StrEnum):
    """How an instance is bought."""

    SPOT = "spot"
    """Preemptible capacity at the spot price."""
    ON_DEMAND = "on-demand"
    """Capacity that the provider does not take back."""


@dataclass(frozen=True, slots=True)
class Pool:
    """One place capacity comes from: provider, region, zone and instance type."""

    provider: str
    region: str
    zone: str
    instance_type: str

    def __str__(self) -> str:
        return f"{self.provider}/{self.zone}/{self.instance_type}"


@dataclass(frozen=True, slots=True)
class PriceLink:
    """Where the market takes an offering's prices from: another provider's offering of
    the same machine (:mod:`spotd.market.linked`).

    A provider that runs on another provider's machines and has no price of its own
    for them (a Kubernetes node pool on a cloud's VMs) sets it; the market cache then
    prices each of ``markets`` as ``source`` sells it, and leaves the offering's own
    price where no enabled provider lists that machine.
    """

    source: Pool
    """The provider (by name), region, zone and instance type to match: the region and
    instance type must match, the same zone is preferred."""
    markets: frozenset[Market]
    """The markets priced from ``source``; the offering's own price stands in the others."""


@dataclass(frozen=True, slots=True)
class Offering:
    """An instance type in one zone, with its current prices and capacity.

    Prices are USD per node-hour. ``capacity`` is the provider's signal in
    [0, 1] (placement score, obtainability) that spot capacity is there now;
    None when the provider gives none.
    """

    pool: Pool
    gpu: str
    gpus_per_node: int
    gpu_memory_gb: int
    interconnect: Interconnect
    spot_price: float | None
    on_demand_price: float | None
    capacity: float | None = None
    notice_seconds: int = 120
    price_link: PriceLink | None = None
    """None: the prices are the provider's own; set: the market cache prices the
    link's markets from another provider's offering (:class:`PriceLink`)."""

    def price(self, market: Market) -> float | None:
        """The price per node-hour in ``market``, None where it is not sold."""
        return self.spot_price if market is Market.SPOT else self.on_demand_price


class InstanceState(StrEnum):
    """What a provider says of one instance."""

    PENDING = "pending"
    """Requested, booting: not yet running the job."""
    RUNNING = "running"
    NOTICE = "notice"
    """Running, but the provider has announced it will take it back."""
    PREEMPTED = "preempted"
    """Taken back by the provider."""
    EXITED = "exited"
    """The job's command ended by itself; see ``exit_code``."""
    TERMINATED = "terminated"
    """Stopped on our request."""


ENDED_STATES = frozenset(
    {InstanceState.PREEMPTED, InstanceState.EXITED, InstanceState.TERMINATED}
)


@dataclass(frozen=True, slots=True)
class Instance:
    """One node as the provider describes it."""

    id: str
    pool: Pool
    market: Market
    state: InstanceState
    tags: Mapping[str, str] = field(default_factory=dict)
    exit_code: int | None = None
    launched_at: datetime | None = None
    ended_at: datetime | None = None
    private_address: str | None = None
    """The node's address inside its network, where its gang's peers reach it."""
    oom_kills: int | None = None
    """Processes of the job the kernel's OOM killer killed while it ran (its agent's
    count); None where nobody could tell."""

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES


@dataclass(frozen=True, slots=True)
class PlacementObject:
    """Something besides instances a provider created for one attempt's gang.

    A cluster placement group (AWS), a compact placement resource policy (GCP),
    a scale set with one placement group (Azure): what puts a gang's nodes on
    one fabric. Tagged with the attempt like its instances, so the engine can
    delete it when the attempt ends and reap it when no attempt owns it.
    """

    id: str
    """The provider's name for it, unique within the provider (region included)."""
    kind: str
    """What it is, in the provider's words (``placement-group``, ``resource-policy``...)."""
    region: str
    tags: Mapping[str, str] = field(default_factory=dict)


class Reach(StrEnum):
    """What a node must reach over the network while it runs a job (``spotd check-cloud``
    reports those a node without a public address cannot, :mod:`spotd.core.egress`)."""

    DAEMON = "daemon"
    """``[agent] daemon_url``: heartbeats, notices, the exit code."""
    PACKAGE_INDEX = "package index"
    """Where ``[agent] install`` gets spotd from (PyPI or a mirror)."""
    CHECKPOINT_STORE = "checkpoint store"
    """The job's checkpoint URI, and the shipped code beside it."""


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """One check of ``spotd check-cloud``: passed, or what is missing."""

    name: str
    """What was checked: ``credentials``, ``permission ec2:RunInstances``, ``quota ...``."""
    ok: bool
    detail: str
    """On a pass what was found; on a failure the permission, quota or value to fix."""
    unreachable: tuple[Reach, ...] = ()
    """For a failed egress check: what the nodes of that subnet cannot reach."""


@dataclass(frozen=True, slots=True)
class CloudCheck:
    """What ``check-cloud`` found for one provider, and what a launch would create."""

    provider: str
    outcomes: tuple[CheckOutcome, ...]
    would_create: tuple[str, ...] = ()
    """One line per object a launch of the job would create (nothing was created)."""
    linked: tuple[Offering, ...] = ()
    """The provider's offerings priced from another provider's (:class:`PriceLink`):
    ``check-cloud`` checks the daemon runs that provider and it lists the machine."""

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)


@dataclass(frozen=True, slots=True)
class GangRef:
    """A running gang that a launch adds nodes to (a node repair, :mod:`spotd.engine.repair`).

    The gang's placement objects were made by the launch of the attempt that
    first placed it (its *origin*), named and tagged after that launch, so the
    provider finds them from these: the same placement object, zone and fabric
    interfaces as the kept nodes.
    """

    client_token: str
    """The client token of the origin's launch."""
    tags: Mapping[str, str]
    """The origin launch's tags, which its placement objects carry."""
    instance_ids: tuple[str, ...]
    """The gang's kept nodes, still running, beside which the new ones go."""


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """Everything a provider needs to start the nodes of one attempt.

    ``client_token`` makes the launch idempotent: a second request with the
    same token returns the instances of the first and starts nothing.
    """

    offering: Offering
    market: Market
    nodes: int
    client_token: str
    tags: Mapping[str, str]
    command: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str | None = None
    max_run_seconds: int | None = None
    """How long the provider may keep the nodes at most (the job's ``market.max_run_hours``):
    a provider with such a limit deletes them after it, whatever spotd does."""
    joins: GangRef | None = None
    """None: the ``nodes`` are a gang of their own (with its own placement objects);
    set: they join that running gang, in its placement objects, with its fabric
    interfaces (``nodes`` may then be 1). Idempotent by ``client_token`` all the same."""


class EventCause(StrEnum):
    """Why a job's event was written, when that is not an attempt's end
    (:class:`AttemptEnd` names those)."""

    SUBMITTED = "submitted"
    PLACED = "placed"
    RUNNING = "all nodes running"
    NOTICE = "preemption notice"
    WAITING = "waiting"
    """A new waiting reason, from and to the job's own status (no transition)."""
    HELD = "held"
    """A team limit holds the pending job back (pending to pending)."""
    CANCELLED = "cancelled by user"
    PRIORITY = "priority changed"
    """A user gave the job another priority (from and to its own status)."""
    YIELDING = "yielding"
    """The running job is told to stop as on a preemption notice, for a pending job of its
    team with a higher priority or for its team's budget (running to checkpointing)."""
    NODE_REPLACED = "node replaced"
    """Some nodes of a gang went and the others stand by: the next attempt keeps those and
    launches new nodes for the lost ranks in the same pool (recovering to provisioning)."""
    OVER_BUDGET = "over budget"
    DEADLINE_IMPOSSIBLE = "deadline impossible"
    NO_CAPACITY = "no capacity"
    LAUNCH_FAILED_EVERYWHERE = "launch failed everywhere"
    LAUNCH_REFUSED = "launch request refused"
    CHECKPOINT_UNUSABLE = "checkpoint location unusable"
    HANG = "hang"
    """No rank's step moved for ``gang.hang_timeout`` while its nodes were up: the attempt
    ends ``hung`` (:mod:`spotd.engine.hang`)."""
    RETRIED = "retried"
    """A user retried the failed or cancelled job (``spotd retry``): it recovers, as a new
    attempt under the same id, from its last complete checkpoint (failed or cancelled to
    recovering)."""
    RELEASED = "nodes released"
    """The nodes a failed attempt kept for inspection (``keep_on_failure``) were stopped:
    the hold ran out, or a user released it (from and to the job's own status)."""
    DRILL = "drill"
    """A user's drill (``spotd drill``): the provider was asked to preempt one node of the
    running job through its own notice, which the job then meets as any preemption (from
    and to running; the facts name the node)."""
    DRILL_FAILED = "drill failed"
    """The provider refused a drill (the facts name the node and the error); the job runs on."""


class AttemptEnd(StrEnum):
    """Why a placement attempt ended."""

    SUCCEEDED = "succeeded"
    PREEMPTED = "preempted"
    LOST = "lost"
    """Instance gone without a notice (or its node failed)."""
    USER_FAILED = "user-failed"
    NO_CAPACITY = "no-capacity"
    LAUNCH_FAILED = "launch-failed"
    CANCELLED = "cancelled"
    OVER_BUDGET = "over-budget"
    MIGRATED = "migrated"
    PREFLIGHT_FAILED = "preflight-failed"
    """The gang's preflight (all-reduce bandwidth, node checks) fell short."""
    SETUP_FAILED = "setup-failed"
    """A node could not be prepared for the job: its code, its secrets or a setup command."""
    HUNG = "hung"
    """The gang made no progress for ``gang.hang_timeout`` while its nodes were up: a rank
    died, stopped or got stuck, and the others waited for it (:mod:`spotd.engine.hang`)."""
    YIELDED = "yielded"
    """The job stopped on the daemon's notice (:mod:`spotd.core.orders`): a job of its team
    with a higher priority took its place, or its team's budget would have run out."""


def event_cause(value: str) -> EventCause | AttemptEnd:
    """The cause an event's stored ``value`` names: an :class:`EventCause`, else an
    :class:`AttemptEnd` (their values never overlap). Raises ValueError for any other."""
    try:
        return EventCause(value)
    except ValueError:
        pass
    try:
        return AttemptEnd(value)
    except ValueError:
        raise ValueError(f"{value!r} is no event cause nor attempt end") from None


_SHELL_SIGNAL_BASE = 128
"""A command killed by signal N exits with 128 + N (the agent's
:func:`spotd.agent.runner.exit_code_of`, as a shell reports it)."""
_MAX_SIGNAL = 64
"""The highest signal number Linux has (SIGRTMAX)."""


def signal_of_exit(exit_code: int | None) -> int | None:
    """The signal that killed a command exiting with ``exit_code``: N for 128 + N (the
    shell's and the agent's convention) or for a raw ``-N``; None for any other code."""
    if exit_code is None:
        return None
    if exit_code < 0 and -exit_code <= _MAX_SIGNAL:
        return -exit_code
    if _SHELL_SIGNAL_BASE < exit_code <= _SHELL_SIGNAL_BASE + _MAX_SIGNAL:
        return exit_code - _SHELL_SIGNAL_BASE
    return None


EXIT_NOT_EXECUTABLE = 126
"""The shell's (and the agent's) exit code for a command found but not executable."""
EXIT_NOT_FOUND = 127
"""The shell's (and the agent's) exit code for a command not found."""


class ExitCause(StrEnum):
    """How a command that exited non-zero failed, as far as spotd can tell: derived from
    its exit code and the agent's evidence by :func:`exit_cause_of`, one pure function."""

    NOT_FOUND = "not-found"
    """Exit 127: the command (or a program it ran) was not found."""
    NOT_EXECUTABLE = "not-executable"
    """Exit 126: the command was found but could not be executed (permissions, format)."""
    OUT_OF_MEMORY = "out-of-memory"
    """The kernel's OOM killer killed a process of the job while it ran (the agent saw
    its cgroup's ``oom_kill`` count rise), and the command then failed."""
    SIGNAL = "signal"
    """A signal killed it (exit 128 + N), with no evidence of the OOM killer."""
    ERROR = "error"
    """It exited with a non-zero code of its own."""


def exit_cause_of(exit_code: int | None, oom_kills: int | None = None) -> ExitCause | None:
    """How a command that ended with ``exit_code`` failed: None for exit 0 or no code.

    Out of memory only on evidence (``oom_kills``: processes of the job the kernel's
    OOM killer killed while it ran, as its agent counted them): a SIGKILL alone may
    come from anyone, and is said as the signal it is.
    """
    if exit_code is None or exit_code == 0:
        return None
    if oom_kills:
        return ExitCause.OUT_OF_MEMORY
    if exit_code == EXIT_NOT_FOUND:
        return ExitCause.NOT_FOUND
    if exit_code == EXIT_NOT_EXECUTABLE:
        return ExitCause.NOT_EXECUTABLE
    if signal_of_exit(exit_code) is not None:
        return ExitCause.SIGNAL
    return ExitCause.ERROR


_FACT_TYPES: dict[str, type] = {
    "exit_code": int,
    "signal": int,
    "node": str,
    "rank": int,
    "error_class": str,
    "error_code": str,
    "provider": str,
    "provider_code": str,
    "exit_cause": ExitCause,
    "oom_kills": int,
    "check": str,
    "drill": bool,
}
_FACT_LISTS: dict[str, type] = {"process_ranks": int, "nodes": str}
"""Facts that are lists, by the type of their items."""


@dataclass(frozen=True, slots=True)
class EventFacts:
    """What an event says beside its cause, as typed fields kept in the store, so no
    reader parses them out of the event's ``detail``. Every field is None when the
    event has nothing to say of it; most events carry a few or none.
    """

    exit_code: int | None = None
    """The exit code of the command (or setup) whose end the event records, in shell
    terms (a signal N gives 128 + N)."""
    signal: int | None = None
    """The number of the signal that killed it (9 for SIGKILL), derived from
    ``exit_code`` (:func:`signal_of_exit`). A number, not a name: it is what the exit
    code carries, and :attr:`signal_name` names it."""
    node: str | None = None
    """The instance id of the node the event is about (the one that failed, was noticed
    or was lost)."""
    rank: int | None = None
    """That node's rank in its gang: its place in the attempt's instance ids."""
    error_class: str | None = None
    """spotd's exception class that caused the event (``CapacityError``)."""
    error_code: str | None = None
    """That class's stable machine code (``provider-capacity``,
    :attr:`spotd.core.errors.SpotdError.error_code`)."""
    provider: str | None = None
    """The provider the event happened on."""
    provider_code: str | None = None
    """The provider's own error code (``InsufficientInstanceCapacity``)."""
    exit_cause: ExitCause | None = None
    """How the command (or setup) failed, from ``exit_code`` and ``oom_kills``
    (:func:`exit_cause_of`); None without a failing exit."""
    oom_kills: int | None = None
    """Processes of the job the kernel's OOM killer killed while it ran, as the node's
    agent counted them in its cgroup; None where the agent could not tell."""
    check: str | None = None
    """The preflight check that failed (``checkpoint_writable``), for a failed preflight."""
    process_ranks: tuple[int, ...] | None = None
    """The job's processes the event is about, by global rank (torch's ``RANK``): a hang's
    suspects (their process died or stopped, or their step is behind the others')."""
    nodes: tuple[str, ...] | None = None
    """The instance ids of every node the event is about, ``node`` first (a hang's
    suspect nodes)."""
    drill: bool | None = None
    """True on the notice and the end of an attempt a drill preempted (``spotd drill``):
    the preemption was asked for, not the market's."""

    @property
    def signal_name(self) -> str | None:
        """The signal's name (``SIGKILL``), None without a signal or for one Python
        does not name (a real-time signal)."""
        if self.signal is None:
            return None
        try:
            return _signal.Signals(self.signal).name
        except ValueError:
            return None

    def to_json(self) -> dict[str, int | str | list[int | str]]:
        """The fields that are set, as a JSON object (empty when none is)."""
        pairs = ((name, getattr(self, name)) for name in _FACT_TYPES)
        found: dict[str, int | str | list[int | str]] = {
            name: value for name, value in pairs if value is not None
        }
        for name in _FACT_LISTS:
            if (items := getattr(self, name)) is not None:
                found[name] = list(items)
        return found

    @classmethod
    def from_json(cls, data: Mapping[str, object] | None) -> EventFacts:
        """The facts :meth:`to_json` wrote (None: an event stored without any). Keys it
        does not know are skipped: a newer spotd may have added them. Raises
        ValueError for a value of the wrong type."""
        if not data:
            return EMPTY_FACTS
        known: dict[str, Any] = {}
        for name, value in data.items():
            if name in _FACT_LISTS and value is not None:
                known[name] = _fact_list(name, value, _FACT_LISTS[name])
                continue
            kind = _FACT_TYPES.get(name)
            if kind is None or value is None:
                continue
            if kind is bool:
                if not isinstance(value, bool):
                    raise ValueError(f"event fact {name} is {value!r}, expected bool")
                known[name] = value
                continue
            if issubclass(kind, StrEnum) and isinstance(value, str):
                # A value this spotd does not know is a newer one's: skipped like a key.
                if value in kind._value2member_map_:
                    known[name] = kind(value)
                continue
            # bool is an int to isinstance, never a fact's value.
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"event fact {name} is {value!r}, expected {kind.__name__}")
            known[name] = value
        return cls(**known)


EMPTY_FACTS = EventFacts()
"""An event that says nothing beside its cause."""


def _fact_list(name: str, value: object, kind: type) -> tuple[Any, ...]:
    """A list fact as stored (a JSON array of ``kind``), as a tuple; ValueError otherwise."""
    if not isinstance(value, list) or any(
        not isinstance(item, kind) or isinstance(item, bool) for item in value
    ):
        raise ValueError(f"event fact {name} is {value!r}, expected a list of {kind.__name__}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class NewAttempt:
    """An attempt to be opened together with a transition."""

    pool: Pool
    market: Market
    nodes: int
    price_per_node_hour: float
    resume_from: str | None
    work_per_hour: float | None = None
    """Reference compute hours one running hour here does (:mod:`spotd.core.progress`)."""
    checkpoint_interval_hours: float | None = None
    """The checkpoint interval the job is told to keep here."""
    saves_on_notice: bool | None = None
    """Whether the job's checkpoint fits in this offering's preemption notice."""


@dataclass(frozen=True, slots=True)
class AttemptClose:
    """An attempt to be closed together with a transition."""

    attempt_id: int
    reason: AttemptEnd
    exit_code: int | None = None
    """The job command's exit code that ended it (its first failing node's), if one did."""
    held_until: datetime | None = None
    """Keep the attempt's nodes for inspection until then (``keep_on_failure``): the
    executor and the reaper leave them running, the ledger bills them."""


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One placement of a job: where, how bought, when, and how it ended."""

    id: int
    job_id: str
    seq: int
    pool: Pool
    market: Market
    nodes: int
    price_per_node_hour: float
    client_token: str
    instance_ids: tuple[str, ...]
    resume_from: str | None
    started_at: datetime
    running_at: datetime | None
    ended_at: datetime | None
    end_reason: AttemptEnd | None
    work_per_hour: float | None = None
    """Reference compute hours one running hour does (:mod:`spotd.core.progress`); None on
    attempts stored before spotd counted it, taken as 1."""
    checkpoint_interval_hours: float | None = None
    """The checkpoint interval the job was told; None on older attempts."""
    saves_on_notice: bool | None = None
    """Whether the job's checkpoint fits in the offering's preemption notice."""
    exit_code: int | None = None
    """The job command's exit code that ended the attempt (its first failing node's);
    None when no command's exit ended it."""
    held_until: datetime | None = None
    """While the closed attempt's nodes are kept for inspection (``keep_on_failure``):
    when the hold runs out. None before and after (:mod:`spotd.engine.holds`)."""
    released_at: datetime | None = None
    """When the nodes a hold kept were stopped; None for an attempt whose nodes were
    never kept, or are kept still."""
    before_retry: bool = False
    """The attempt came before the job's latest retry (``spotd retry``): the ``[retry]``
    bounds no longer count it."""

    @property
    def open(self) -> bool:
        return self.ended_at is None


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One applied transition, with its cause."""

    id: int
    job_id: str
    at: datetime
    from_status: JobStatus | None
    to_status: JobStatus
    cause: EventCause | AttemptEnd
    detail: str
    facts: EventFacts = EMPTY_FACTS
    """What the event says beside its cause (exit code, node, error class...)."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as the store holds it."""

    id: str
    name: str
    spec: JobSpec
    status: JobStatus
    failure: FailureCause | None
    submitted_at: datetime
    updated_at: datetime
    owner: str | None = None
    lease_until: datetime | None = None
    version: int = 0
    """Counts every change of the job's status, attempts or waiting reason (not lease
    renewals): a reader holding the attempts of an equal version holds the current ones."""
    waiting: str | None = None
    """Why a pending or recovering job is not placed yet, as a person reads it (the
    engine's :mod:`spotd.engine.waiting`); None once placed, or never said."""
    failure_facts: EventFacts = EMPTY_FACTS
    """For a failed job, the facts of the event that failed it (exit code, signal, how
    the command failed, node, error, failed check): why it failed, beside ``failure``,
    as typed data (:func:`spotd.core.failures.failure_sentence` says it)."""


class SubmitWarningKind(StrEnum):
    """Why a job was stored with a warning: something it asks for will not happen as
    asked, and the daemon says so at submit rather than stay silent."""

    MARKET = "market"
    """No offering of the market as it stands can ever run the job (it waits)."""
    NO_EMAIL = "no-email"
    """``notify`` asks for email and this daemon has no ``[email]`` to send it with."""
    NO_ADDRESS = "no-address"
    """``notify.on_end`` asks for the job-end email and ``notify.email`` names no one."""
    OVER_BUDGET = "over-budget"
    """The policy expects the job to cost more than its ``budget.max_usd``
    (``spotd.core.forecast``): it will likely fail over budget before it ends."""


@dataclass(frozen=True, slots=True)
class SubmitWarning:
    """One warning given with a stored job: its kind, for code, and the sentence a
    person reads."""

    kind: SubmitWarningKind
    detail: str


class ExclusionKind(StrEnum):
    """Which rule ruled a candidate out: the hard filters, in the order they are
    checked (``spotd_policies.filters.HARD_FILTERS``), then the budget."""

    GPU_MODEL = "gpu-model"
    """The offering's GPU is not one the job accepts."""
    GPUS_PER_NODE = "gpus-per-node"
    """A node has another number of GPUs than the job asks."""
    FABRIC = "fabric"
    """The scale-out interconnect is slower than the job's size needs."""
    PROVIDER = "provider"
    """``market.providers`` does not match the provider."""
    REGION = "region"
    """``market.regions`` does not match the region."""
    NOT_SOLD = "not-sold"
    """The offering has no price in this market."""
    PRICE_CAP = "price-cap"
    """The price per GPU-hour is over ``market.max_price_per_gpu_hour``."""
    NO_CAPACITY = "no-capacity"
    """The provider's spot capacity signal says none is left now."""
    COOLING_DOWN = "cooling-down"
    """The spot pool cools down after a preemption or failure of this job."""
    OVER_BUDGET = "over-budget"
    """The expected cost is over what is left of the job's budget."""

    @property
    def transient(self) -> bool:
        """Whether it rules the offering out for now only (capacity or a cooldown comes
        back), not for what the offering or the job is."""
        return self in _TRANSIENT

    @property
    def static(self) -> bool:
        """Whether it rules the offering out for what the offering and the job are (its
        GPU, node size, fabric, provider, region, markets), whatever the prices, the
        capacity or the job's spend: no later market state lifts it."""
        return self in _STATIC


_TRANSIENT = frozenset({ExclusionKind.NO_CAPACITY, ExclusionKind.COOLING_DOWN})
_STATIC = frozenset(
    {
        ExclusionKind.GPU_MODEL,
        ExclusionKind.GPUS_PER_NODE,
        ExclusionKind.FABRIC,
        ExclusionKind.PROVIDER,
        ExclusionKind.REGION,
        ExclusionKind.NOT_SOLD,
    }
)


@dataclass(frozen=True, slots=True)
class Exclusion:
    """Why a candidate is ruled out: the rule (``kind``, for code to decide on) and
    ``detail``, the sentence a person reads (``spotd plan``)."""

    kind: ExclusionKind
    detail: str

    def __str__(self) -> str:
        return self.detail


@dataclass(frozen=True, slots=True)
class Candidate:
    """One way to run a job, as a policy scored it.

    ``price_per_hour`` is for all nodes. ``excluded`` is None for a usable
    candidate and otherwise says which rule ruled it out and why.
    ``breakdown`` carries the named parts of ``expected_cost_usd``.
    """

    offering: Offering
    market: Market
    nodes: int
    price_per_hour: float
    expected_cost_usd: float
    excluded: Exclusion | None = None
    breakdown: Mapping[str, float] = field(default_factory=dict)


class PoolStats(Protocol):
    """What history says about spot pools; None where there is too little to say."""

    def preemptions_per_hour(self, pool: Pool) -> float | None:
        """How often a running spot node of the pool was taken back."""
        ...

    def availability(self, pool: Pool) -> float | None:
        """Share of the observed time the pool had spot capacity, in [0, 1]."""
        ...

    def capacity_series(self, pool: Pool) -> CapacitySeries | None:
        """The pool's spot capacity over the observed time, as a regular series."""
        ...


@dataclass(frozen=True, slots=True)
class PlacementContext:
    """What a policy knows of a job when it places (or re-places) it.

    ``cooldown`` maps pools that recently failed or preempted this job to the
    reason, until their cooldown ends. ``spent_usd`` is the job's cost so far by its
    ledger (:func:`spotd.billing.ledger.spend_so_far`).
    ``current`` and ``current_market`` say where the job runs now (None when
    it is not running), ``done_hours`` how much of ``spec.deadline.compute_hours``
    is behind it, and ``changeover_hours`` what a new start costs in time
    (boot, setup, restore) before progress resumes. ``stats`` gives pool
    history where the caller has it.
    """

    job_id: str
    spec: JobSpec
    now: datetime
    spent_usd: float = 0.0
    current: Pool | None = None
    current_market: Market | None = None
    cooldown: Mapping[Pool, str] = field(default_factory=dict)
    done_hours: float = 0.0
    changeover_hours: float = 0.1
    stats: PoolStats | None = None
    checkpoint_at: Pool | None = None
    """Where the latest checkpoint was written (the last attempt's pool), if anywhere."""


class Decision:
    """A policy's answer: the choice (None when nothing passes) and all candidates.

    ``candidates`` lists the usable ones ranked, then the excluded ones with
    their reasons. A policy may pass ``later``, a function giving the rest
    of the list: the daemon only needs the choice, so scoring and explaining
    every other offering of a large market waits until someone looks. It may
    pass ``near`` too, a function giving :meth:`near_misses` for less than
    the whole list costs.
    """

    __slots__ = ("_later", "_near", "_ranked", "_resolved", "choice")

    def __init__(
        self,
        choice: Candidate | None,
        candidates: Sequence[Candidate] = (),
        *,
        later: Callable[[], Sequence[Candidate]] | None = None,
        near: Callable[[], Sequence[Candidate]] | None = None,
    ) -> None:
        self.choice = choice
        self._ranked = tuple(candidates)
        self._later = later
        self._near = near
        self._resolved: tuple[Candidate, ...] | None = None if later else self._ranked

    def near_misses(self) -> tuple[Candidate, ...]:
        """The excluded candidates of the job's own GPU models and node size: what could
        have run the job and why it may not now (the engine's waiting reason). Taken
        from the policy's ``near`` where it gave one (a walk of the offerings the job
        could use), else from the whole list."""
        if self._near is not None:
            return tuple(self._near())
        wrong_type = (ExclusionKind.GPU_MODEL, ExclusionKind.GPUS_PER_NODE)
        excluded = (c for c in self.candidates if c.excluded is not None)
        return tuple(c for c in excluded if c.excluded and c.excluded.kind not in wrong_type)

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        """Usable candidates, best first, then the excluded ones."""
        if self._resolved is None:
            rest = self._later() if self._later else ()
            self._resolved = (*self._ranked, *rest)
        return self._resolved

    def __repr__(self) -> str:
        return f"Decision(choice={self.choice!r}, usable={len(self._ranked)})"


@dataclass(frozen=True, slots=True)
class PricePoint:
    """One polled price of a pool in one market."""

    pool: Pool
    market: Market
    price: float
    capacity: float | None
    at: datetime


@dataclass(frozen=True, slots=True)
class InstanceReport:
    """What an instance's on-VM agent last reported; None where it said nothing yet."""

    instance_id: str
    provider: str
    job_id: str
    attempt: int
    heartbeat_at: datetime | None = None
    notice_at: datetime | None = None
    notice_kind: str | None = None
    notice_deadline: datetime | None = None
    exit_code: int | None = None
    exited_at: datetime | None = None
    address: str | None = None
    """The node's address in its gang, as its agent reported on joining."""
    ports: str | None = None
    """Two ports free on the node when it joined, ``"job,preflight"``."""
    joined_at: datetime | None = None
    command_at: datetime | None = None
    """When the agent started the job's command (after rendezvous and preflight)."""
    exit_phase: str | None = None
    """What the exit ended: ``command``, or the agent's ``setup``, ``rendezvous`` or
    ``preflight``."""
    exit_detail: str | None = None
    """What the agent said of an exit before the command (a failed setup's output tail)."""
    oom_kills: int | None = None
    """Processes of the job the kernel's OOM killer killed while it ran, as the agent
    counted them (its cgroup's ``oom_kill``); None where it could not tell."""
    preflight: str | None = None
    """The gang's preflight figures as JSON (``spotd.core.agent_wire.PreflightFigures``)."""
    step: int | None = None
    total_steps: int | None = None
    checkpoint: str | None = None
    """The job's last complete checkpoint, as the job reported it."""
    gpus: str | None = None
    """The latest GPU readings as JSON (a list of ``spotd.core.agent_wire.GpuReading``)."""
    gpu_util_sum: float | None = None
    """Sum over samples of the lowest GPU's utilisation in %; in a report, this one's share."""
    gpu_samples: int | None = None
    gpu_low_samples: int | None = None
    """Samples in which some GPU was under the utilisation threshold."""
    ranks: str | None = None
    """The job's ranks on the node at the last heartbeat, as JSON
    (:func:`spotd.core.ranks.ranks_json`): step, pid and process state of each."""
    progress_key: str | None = None
    """A digest of the node's progress at the last heartbeat that said any
    (:func:`spotd.core.ranks.progress_key`)."""
    progress_at: datetime | None = None
    """When (the daemon's clock) ``progress_key`` last changed: the node's progress moved."""
    heard_at: datetime | None = None
    """When (the daemon's clock) the last heartbeat with a ``progress_key`` came."""

    @property
    def gpu_util_mean_pct(self) -> float | None:
        """Mean over samples of the lowest GPU's utilisation, None without samples."""
        if not self.gpu_samples or self.gpu_util_sum is None:
            return None
        return self.gpu_util_sum / self.gpu_samples


def attempt_reports(
    attempt: AttemptRecord, reports: Sequence[InstanceReport]
) -> dict[str, InstanceReport]:
    """The reports of this attempt's own instances, by instance id."""
    ids = set(attempt.instance_ids)
    return {
        r.instance_id: r
        for r in reports
        if r.attempt == attempt.seq and r.provider == attempt.pool.provider and r.instance_id in ids
    }


# -- the ledger's lines -------------------------------------------------------------

EntryKind = Literal["compute", "changeover", "egress"]
"""What a ledger line bills: a node's running time, its boot, or a checkpoint's move."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One billed line: one kind of cost of one attempt on one UTC day.

    ``billed_seconds`` are node-seconds (summed over the attempt's nodes),
    after rounding up; ``gpus`` is the attempt's total GPUs over ``nodes``
    nodes. ``usd`` is what was paid, ``on_demand_usd`` what the same time
    would have cost on-demand (0 for egress).
    """

    job_id: str
    attempt: int
    provider: str
    region: str
    zone: str
    instance_type: str
    gpu: str
    gpus: int
    nodes: int
    fabric: str
    market: str
    kind: EntryKind
    start: datetime
    end: datetime
    billed_seconds: float
    usd: float
    on_demand_usd: float
    job_status: str

    @property
    def gpu_hours(self) -> float:
        """GPU-hours billed: node-hours times GPUs per node."""
        return self.billed_seconds / 3600.0 * self.gpus / max(1, self.nodes)

    @property
    def wall_hours(self) -> float:
        """Hours of the attempt's clock this entry covers (node-seconds over nodes)."""
        return self.billed_seconds / 3600.0 / max(1, self.nodes)


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """A provider's own record of one node: its launch, its end and a price fixed at launch.

    ``ended_at`` None: still running. ``price_per_hour`` None: the provider
    bills the prices in force (the ledger integrates the price history).
    """

    instance_id: str
    launched_at: datetime
    ended_at: datetime | None
    price_per_hour: float | None = None


@dataclass(frozen=True, slots=True)
class Transition:
    """One requested change of a job's status, with what goes with it.

    An attempt may be opened (``open_attempt``) or closed (``close_attempt``)
    in the same transaction, so history and status never disagree.
    """

    job_id: str
    expected: JobStatus
    new: JobStatus
    cause: EventCause | AttemptEnd
    detail: str = ""
    failure: FailureCause | None = None
    open_attempt: NewAttempt | None = None
    close_attempt: AttemptClose | None = None
    facts: EventFacts = EMPTY_FACTS
    """What the event says beside its cause, kept with it."""
