"""What the on-VM agent and the daemon say to each other: report models and agent tokens.

An agent speaks for exactly one attempt of one job. Its bearer token is
``agent_token(daemon_token, client_token)``: an HMAC of the attempt's launch
client token keyed with the daemon's own token. The daemon can recompute it for
any attempt it knows, the VM never sees the daemon's token, and a token stolen
from one VM is worthless for any other attempt.

Routes (all ``POST``, JSON body, ``Authorization: Bearer <agent token>``,
answer ``204`` on success, ``401`` on a missing or wrong token or an unknown
attempt, ``422`` on a malformed body):

``/v1/agent/heartbeat``  :class:`AgentReport`
``/v1/agent/notice``     :class:`NoticeReport`
``/v1/agent/exit``       :class:`ExitReport`
``/v1/agent/preflight``  :class:`PreflightReport`

``POST /v1/agent/log`` (:class:`LogChunk`) answers ``200`` with a :class:`LogAck`: the
node's output the daemon holds, up to which byte; a chunk that would leave a gap
gets ``409`` with the offset the daemon expects (:class:`LogExpected`), from which
the agent sends again.

``POST /v1/agent/secrets`` (:class:`SecretsAsk`) answers ``200`` with the job's
:class:`Secrets`: the values of the names in its spec's ``secrets``. And
``POST /v1/agent/join`` (:class:`JoinReport`), which answers ``200`` with the
gang's :class:`Roster` once every node of the attempt has joined, else ``202``
with a :class:`Waiting` body; the agent asks again until its gang timeout.

The routes themselves are the daemon's (:mod:`spotd.daemon.agent_routes`): this module
is the wire format both sides share, and imports no web framework, so the agent
on a node starts quickly.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from spotd.core.errors import StoreError
from spotd.core.ranks import MAX_RANKS_PER_NODE, RankReading

NoticeKind = Literal["preemption", "rebalance"]
ExitPhase = Literal["command", "setup", "rendezvous", "preflight"]
Port = Annotated[int, Field(ge=1, le=65535)]

# What the daemon tells a node of the job's code, setup, secrets and image, in the
# job's environment (spotd.engine.shipping sets them, spotd.agent.node acts on them).
CODE_URI = "SPOTD_CODE_URI"
CODE_SHA256 = "SPOTD_CODE_SHA256"
SETUP = "SPOTD_SETUP"
"""The setup lines, as a JSON array of strings."""
SECRETS = "SPOTD_SECRETS"
"""The names of the job's secrets, comma-separated (never their values)."""
IMAGE = "SPOTD_IMAGE"
CONTAINER_DEVICES = "SPOTD_CONTAINER_DEVICES"
CONTAINER_MOUNTS = "SPOTD_CONTAINER_MOUNTS"
PREFLIGHT_PYTHON = "SPOTD_PREFLIGHT_PYTHON"
"""The job's ``[preflight] python``: the interpreter its preflight runs with; unset: found."""
PREFLIGHT_TORCH = "SPOTD_PREFLIGHT_TORCH"
"""The job's ``[preflight] torch``: ``1`` or ``0``; unset: torch where the gang needs it."""
JOB_TMPDIR = "SPOTD_JOB_TMPDIR"
"""Set when the job's ``[env]`` names its own ``TMPDIR``: the agent keeps it, where it
otherwise points ``TMPDIR`` into its run folder (removed when the agent ends)."""

MAX_EXIT_DETAIL = 4000
"""Characters of an exit's detail the daemon keeps (a setup's output tail fits)."""

GPU_UTIL_THRESHOLD_PCT = 85.0
"""Under load, a GPU below this utilisation points at a bottleneck, most often the
data pipeline (the practitioners' preflight rule)."""

HEARTBEAT_PATH = "/v1/agent/heartbeat"
NOTICE_PATH = "/v1/agent/notice"
EXIT_PATH = "/v1/agent/exit"
JOIN_PATH = "/v1/agent/join"
PREFLIGHT_PATH = "/v1/agent/preflight"
SECRETS_PATH = "/v1/agent/secrets"
LOG_PATH = "/v1/agent/log"

MAX_LOG_CHUNK = 64 * 1024
"""The most bytes of a node's output one :class:`LogChunk` carries: about 88 KiB as
base64 JSON, well under the daemon's default body limit (1 MiB). A daemon with a
smaller one answers 413, and the agent halves its chunks."""


def agent_token(daemon_token: str, client_token: str) -> str:
    """The bearer token of the agent of the attempt launched with ``client_token``.

    HMAC-SHA256 keyed with ``daemon_token`` over ``client_token``, as lowercase hex.
    """
    return hmac.new(daemon_token.encode(), client_token.encode(), hashlib.sha256).hexdigest()


class AgentReport(BaseModel):
    """What every report carries: who speaks, from where, and when (aware UTC)."""

    # Agents on VMs may run a newer spotd than the daemon: ignore fields we do not know.
    model_config = ConfigDict(frozen=True, extra="ignore")

    job_id: str
    attempt: int
    instance_id: str
    provider: str
    at: datetime


class GpuReading(BaseModel):
    """One GPU at one moment, as NVML saw it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    index: int
    name: str = ""
    util_pct: float
    mem_used_gb: float = 0.0
    mem_total_gb: float = 0.0


class HeartbeatReport(AgentReport):
    """The agent is alive; with what the job and its GPUs said since the last beat.

    ``step``, ``total_steps`` and ``checkpoint`` come from the job's progress file
    (``spotd.train`` writes it); ``gpus`` from NVML where a driver is present;
    ``ranks`` from the ranks' own progress files (:mod:`spotd.core.ranks`).
    """

    step: int | None = None
    total_steps: int | None = None
    checkpoint: str | None = None
    gpus: tuple[GpuReading, ...] = ()
    ranks: Annotated[tuple[RankReading, ...], Field(max_length=MAX_RANKS_PER_NODE)] = ()


class JoinReport(AgentReport):
    """A booted node's address, and two ports free on it (job, preflight) should it be rank 0."""

    address: str = Field(min_length=1)
    ports: tuple[Port, Port]


class Roster(BaseModel):
    """The assembled gang, as every node of it gets it. Ranks follow the launch order."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    rank: int
    nodes: int
    addresses: tuple[str, ...]
    master_addr: str
    master_port: int
    preflight_port: int
    rdzv_id: str


class Waiting(BaseModel):
    """The gang is not complete yet."""

    joined: int
    nodes: int


class PreflightCheckName(StrEnum):
    """What one preflight check looks at (:attr:`PreflightCheck.name`)."""

    PREFLIGHT = "preflight"
    """The whole preflight, reported skipped when the job turned it off."""
    GPU_DRIVER = "gpu_driver"
    """An NVIDIA driver answers NVML on a node whose offering has GPUs."""
    GPU_COUNT = "gpu_count"
    """NVML sees as many GPUs as offered."""
    GPU_MODEL = "gpu_model"
    """They are of the offered model."""
    GPU_MEMORY = "gpu_memory"
    """Each has the offered memory (within NVML's rounding)."""
    CHECKPOINT = "checkpoint_writable"
    """The checkpoint location takes a write."""
    JOB_PYTHON = "job_python"
    """The job's own Python interpreter starts and runs the preflight worker."""
    TORCH = "torch_import"
    """torch imports in the job's interpreter."""
    TORCH_GPUS = "torch_gpus"
    """That torch sees the node's GPUs through CUDA."""
    PROCESS_GROUP = "process_group"
    """Every rank of the gang joined one process group."""
    BANDWIDTH = "allreduce_busbw"
    """The all-reduce ran, at no less than its floor."""
    NODE_LINK = "node_link"
    """A node's own links carried the floor: in a gang of three nodes or more whose
    all-reduce fell under it, the one node both of whose links (from the node before it,
    to the node after it) did not is named (:func:`spotd.agent.preflight.slow_node`)."""
    GANG = "gang_checks"
    """Every node of the gang passed its own checks."""
    OTHER = "other"
    """A check this spotd does not know (a newer agent's)."""


class PreflightFailure(StrEnum):
    """Why a preflight check failed (:attr:`PreflightCheck.reason`)."""

    NO_DRIVER = "no-driver"
    GPU_COUNT = "gpu-count"
    GPU_MODEL = "gpu-model"
    GPU_MEMORY = "gpu-memory"
    CHECKPOINT_UNWRITABLE = "checkpoint-unwritable"
    PYTHON_MISSING = "python-missing"
    """The job's interpreter is not there (a wrong ``[preflight] python``, none on PATH)."""
    PYTHON_UNUSABLE = "python-unusable"
    """It started but ran no worker (too old a Python, a crash)."""
    TORCH_MISSING = "torch-missing"
    """torch is not installed in the job's interpreter."""
    TORCH_BROKEN = "torch-broken"
    """torch is installed but its import fails (a library it needs, a CUDA mismatch)."""
    NO_GPU = "no-gpu"
    """torch sees fewer CUDA devices than the node's GPUs (a CPU-only build, no passthrough)."""
    PROCESS_GROUP_FAILED = "process-group-failed"
    ALLREDUCE_FAILED = "allreduce-failed"
    BELOW_FLOOR = "below-floor"
    """The bus bandwidth is under ``[preflight] min_busbw_gbps`` or the fabric's floor."""
    TIMED_OUT = "timed-out"
    """A peer never arrived or a worker hung until ``[preflight] timeout``."""
    PEER_FAILED = "peer-failed"
    """Another node of the gang failed its own checks."""
    OTHER = "other"
    """A reason this spotd does not know (a newer agent's)."""


_CHECK_NAMES = frozenset(m.value for m in PreflightCheckName)
_FAILURES = frozenset(m.value for m in PreflightFailure)


def _check_name(value: object) -> object:
    # A newer agent's check or reason must not make its whole report unreadable.
    if isinstance(value, str) and value not in _CHECK_NAMES:
        return PreflightCheckName.OTHER
    return value


def _failure(value: object) -> object:
    if isinstance(value, str) and value not in _FAILURES:
        return PreflightFailure.OTHER
    return value


class PreflightCheck(BaseModel):
    """One check of a node: passed, failed (with a typed reason), or skipped (with why)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: PreflightCheckName
    ok: bool
    detail: str = ""
    skipped: bool = False
    reason: PreflightFailure | None = None
    """Why it failed; None when it passed or was skipped."""

    _known_name = field_validator("name", mode="before")(_check_name)
    _known_reason = field_validator("reason", mode="before")(_failure)


class PreflightFigures(BaseModel):
    """What a gang's preflight measured; every node of the gang reports the same verdict."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    passed: bool
    busbw_gbps: float | None = None
    """All-reduce bus bandwidth in GB/s (nccl-tests' definition); None when not measured."""
    min_busbw_gbps: float | None = None
    """The threshold it was held to; None for none."""
    backend: str = ""
    world_size: int = 1
    seconds: float = 0.0
    checks: tuple[PreflightCheck, ...] = ()
    reason: str = ""
    """Why it failed, in one line; empty when it passed."""
    failed_rank: int | None = None
    """The node the verdict names, by its rank in the gang; None when it passed or the
    failure is the gang's as a whole (a bandwidth under the floor, a timeout)."""
    failed_check: PreflightCheckName | None = None
    """The check the verdict rests on; None when it passed."""
    failed_reason: PreflightFailure | None = None
    """Why that check failed; None when it passed."""

    _known_check = field_validator("failed_check", mode="before")(_check_name)
    _known_reason = field_validator("failed_reason", mode="before")(_failure)


class PreflightReport(AgentReport):
    """The preflight of this node's gang ended (``figures.passed`` says how)."""

    figures: PreflightFigures


class NoticeReport(AgentReport):
    """The provider announced it takes the VM back (``preemption``) or may soon (``rebalance``).

    ``deadline`` is when the provider will act, if it said so.
    """

    kind: NoticeKind
    deadline: datetime | None = None
    detail: str = ""


class ExitReport(AgentReport):
    """The job's command ended. ``exit_code`` is 128 + N when signal N killed it."""

    exit_code: int
    phase: ExitPhase = "command"
    """What ended: the job's command, or the agent before it (a failed setup, no gang,
    a failed preflight)."""
    detail: Annotated[str, Field(max_length=MAX_EXIT_DETAIL)] = ""
    """Before the command: what went wrong, with the tail of a failed setup's output."""
    oom_kills: Annotated[int, Field(ge=0)] | None = None
    """Processes the kernel's OOM killer killed in the agent's cgroup while the command
    ran (:mod:`spotd.agent.oom`); None where the agent could not tell."""


class LogChunk(AgentReport):
    """The next bytes of the node's output (the job's, its setup's and the agent's own
    lines, in the order they were written): ``data`` starts at byte ``offset`` of it.

    The offset makes a retry harmless: bytes the daemon holds already are not kept
    twice, and a chunk past what it holds is refused (:class:`LogGap`)."""

    # bytes travel as base64 in JSON (URL-safe alphabet, as pydantic writes it).
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    offset: Annotated[int, Field(ge=0)]
    data: Annotated[bytes, Field(max_length=MAX_LOG_CHUNK)]


class LogAck(BaseModel):
    """The daemon holds the node's output up to byte ``end`` (the next it expects)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    end: Annotated[int, Field(ge=0)]


class LogExpected(BaseModel):
    """What a ``409`` to a :class:`LogChunk` carries besides its problem: where the
    daemon's copy of the node's output ends, so where the next chunk must start."""

    model_config = ConfigDict(extra="ignore")

    expected: Annotated[int, Field(ge=0)]


class LogGap(StoreError):
    """A chunk of a node's output starts past the end of what the daemon holds of it:
    taken, it would leave a hole. ``expected`` is where the daemon's copy ends."""

    def __init__(self, message: str, *, expected: int, job_id: str | None = None) -> None:
        super().__init__(message, job_id=job_id)
        self.expected = expected


class SecretsAsk(AgentReport):
    """A node asks for the values of its job's ``secrets`` before it starts the job."""


class Secrets(BaseModel):
    """The values of the job's secrets the daemon holds, by name, and the names it lacks."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    values: dict[str, str]
    missing: tuple[str, ...] = ()

    def __repr__(self) -> str:
        # Never the values: this object may end up in a log line or a traceback.
        return f"Secrets(names={sorted(self.values)}, missing={list(self.missing)})"

    __str__ = __repr__


class AgentReports(Protocol):
    """Where the daemon's agent routes deliver authenticated reports.

    Called from FastAPI's worker threads, so implementations must be thread-safe.
    """

    def heartbeat(self, report: HeartbeatReport) -> None:
        """The agent of ``report.job_id``/``report.attempt`` is alive."""

    def notice(self, report: NoticeReport) -> None:
        """The provider sent a preemption or rebalance notice to the VM."""

    def exited(self, report: ExitReport) -> None:
        """The job's command on the VM ended with ``report.exit_code``."""

    def join(self, report: JoinReport) -> Roster | Waiting:
        """A node booted: keep its address; the roster once the whole gang joined."""

    def preflight(self, report: PreflightReport) -> None:
        """The gang's preflight ended on this node (and, if it passed, the command started)."""

    def secrets(self, ask: SecretsAsk) -> Secrets:
        """The values of the secrets the node's job names, as far as the daemon holds them."""


class AgentLogs(Protocol):
    """Where the daemon's log route keeps the nodes' output. Thread-safe, as
    :class:`AgentReports`."""

    def append(self, chunk: LogChunk) -> int:
        """Keep ``chunk`` of its node's output; the end of what is kept of it then.
        Bytes held already are skipped; :class:`LogGap` for a chunk past the end."""


@dataclass(frozen=True, slots=True)
class ProviderNotice:
    """A provider's announcement.

    ``preemption``: the VM will be taken back, at ``deadline`` if known.
    ``rebalance``: an early warning (AWS) that preemption is likely; not a notice to act on.
    """

    kind: NoticeKind
    deadline: datetime | None
    detail: str
