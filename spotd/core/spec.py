"""The job spec: what a user asks spotd to run, as frozen pydantic models.

:class:`JobSpec` is the whole of a ``job.toml``, its tables the models beside it. A
spec is read from a job file or from the store by :mod:`spotd.core.spec_io`, which
turns every validation error into one line naming the field, the line of the file
and what was expected (:mod:`spotd.core.spec_errors`). The field types and the
bounds they check are in :mod:`spotd.core.spec_fields`.

Paths in a spec (``workdir``, a plain-path ``checkpoint.uri``) are resolved
against the job file's folder while parsing and stored absolute, so a spec
means the same thing wherever the daemon later reads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Annotated, Literal

from annotated_types import Le
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationInfo,
    field_serializer,
    field_validator,
)

from spotd.core.limits import (
    MAX_BUDGET_USD,
    MAX_BUSBW_GBPS,
    MAX_CHECKPOINT_GB,
    MAX_CODE_BYTES,
    MAX_CODE_FILES,
    MAX_COMMAND_ARGS,
    MAX_COMMAND_BYTES,
    MAX_COMPUTE_HOURS,
    MAX_EMAILS,
    MAX_ENV_VARS,
    MAX_EXIT_CODES,
    MAX_GBPS_PER_GPU,
    MAX_GPU_MODELS,
    MAX_GPUS_PER_NODE,
    MAX_MODEL_SIZE_B,
    MAX_NODES,
    MAX_PATH_BYTES,
    MAX_PATTERNS,
    MAX_PRICE_PER_GPU_HOUR,
    MAX_RUN_HOURS,
    MAX_SETUP_LINES,
    MIN_CHECKPOINT_GB,
)
from spotd.core.network import Fabric
from spotd.core.spec_errors import describe
from spotd.core.spec_fields import (
    CTX_FROM_TOML,
    Arg,
    Duration,
    Email,
    EnvName,
    EnvTable,
    FabricEnvTable,
    Glob,
    GpuName,
    Image,
    PositiveFloat,
    Priority,
    SetupLine,
    Sha256,
    absolute,
    at_least,
    at_most,
    at_most_bytes,
    at_most_items,
    checkpoint_location,
    no_nul,
    non_empty_str,
    parse_duration,
    path_at_most,
    submitted,
    utf8_bytes,
    whole_seconds,
)

__all__ = [
    "SHELL",
    "BudgetSpec",
    "CheckpointSpec",
    "CodeRef",
    "DeadlineSpec",
    "GangSpec",
    "JobSpec",
    "MarketMode",
    "MarketSpec",
    "NodeFailure",
    "NotifySpec",
    "PreflightSpec",
    "Resources",
    "RetrySpec",
    "deadline_controlled",
]

SHELL = "/bin/sh"

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_GPU_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class MarketMode(StrEnum):
    """How the capacity of a job may be bought."""

    SPOT = "spot"
    """Spot capacity only."""
    ON_DEMAND = "on-demand"
    """On-demand capacity only."""
    AUTO = "auto"
    """The policy may mix spot and on-demand to meet the deadline."""


class NodeFailure(StrEnum):
    """What a running gang does when some of its nodes are preempted or lost while the
    others are healthy (``[gang] on_node_failure``; see docs/training.md)."""

    AUTO = "auto"
    """Replace the lost nodes when that is the cheaper way on (the pool still sells the
    node and the policy would not move the job anyway); else restart."""
    REPLACE = "replace"
    """Keep the healthy nodes and launch new ones for the lost ranks in the same pool and
    market, whenever the pool still sells the node and the healthy nodes stand by."""
    RESTART = "restart"
    """Stop every node and place the whole gang again where the policy says."""
    MOVE = "move"
    """Stop every node and place the whole gang again, never in the same pool (either
    market) until the job has run again."""


def _hashable(value: object) -> object:
    """``value`` with every dict in it (``env``, ``fabric_env``) made a frozenset of its
    items: hashable, and as blind to the order of keys as a dict's equality is."""
    if isinstance(value, Mapping):
        return frozenset((key, _hashable(item)) for key, item in value.items())
    return value


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    def __hash__(self) -> int:
        # pydantic's frozen hash fails on a dict field. This one takes every field, as
        # equality does, so a spec can key a dict or sit in a set (alone or inside a
        # record such as JobRecord), and specs equal but for their env's order hash alike.
        fields = type(self).model_fields
        return hash((type(self), *(_hashable(getattr(self, name)) for name in fields)))


class Resources(_Spec):
    """The GPUs a job needs: which models, how many per node, how many nodes."""

    gpus: Annotated[tuple[GpuName, ...], at_most_items(MAX_GPU_MODELS, "models")]
    """Acceptable GPU models in order of preference, upper case, no duplicates.

    One run never mixes models: every node of an attempt has the same one.
    """
    gpus_per_node: Annotated[int, Strict(), Field(ge=1, le=MAX_GPUS_PER_NODE)]
    nodes: Annotated[int, Strict(), Field(ge=1), at_most(MAX_NODES)] = 1
    model_size_b: Annotated[PositiveFloat, at_most(MAX_MODEL_SIZE_B)] | None = None
    """Billions of parameters; sets the scale-out bandwidth a multi-node run needs."""
    min_gbps_per_gpu: Annotated[PositiveFloat, at_most(MAX_GBPS_PER_GPU)] | None = None
    """Scale-out bandwidth per GPU in Gbit/s; overrides the model-size rule."""

    @field_validator("gpus")
    @classmethod
    def _normalise_gpus(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError('must list at least one GPU model, like ["H100"]')
        seen: dict[str, None] = {}
        for gpu in value:
            if not _GPU_RE.fullmatch(gpu):
                raise ValueError(f"{gpu!r} is not a GPU model name (like H100 or A100-80GB)")
            seen.setdefault(gpu.upper(), None)
        return tuple(seen)

    @property
    def total_gpus(self) -> int:
        """GPUs over all nodes."""
        return self.nodes * self.gpus_per_node


class MarketSpec(_Spec):
    """Where and how capacity may be bought."""

    type: MarketMode = MarketMode.SPOT
    providers: Annotated[tuple[Glob, ...], at_most_items(MAX_PATTERNS, "patterns")] = ("*",)
    """Glob patterns over provider names (``aws``, ``sim-*``), lower-cased."""
    regions: Annotated[tuple[Glob, ...], at_most_items(MAX_PATTERNS, "patterns")] = ("*",)
    """Glob patterns over region names (``us-east-*``), lower-cased."""
    max_price_per_gpu_hour: Annotated[PositiveFloat, at_most(MAX_PRICE_PER_GPU_HOUR)] | None = None
    """Highest price in USD per GPU-hour the job accepts, None for no limit."""
    max_run_hours: Annotated[PositiveFloat, Le(MAX_RUN_HOURS)] | None = None
    """Longest one attempt's nodes may live; a provider with such a limit (GCP's
    maximum run duration) deletes them after it even if spotd cannot. None: no limit."""

    @field_validator("providers", "regions")
    @classmethod
    def _non_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError('must list at least one pattern; use ["*"] to allow any')
        return value

    def allows_provider(self, name: str) -> bool:
        """Whether a provider called ``name`` matches one of ``providers``."""
        return any(fnmatchcase(name.lower(), pattern) for pattern in self.providers)

    def allows_region(self, region: str) -> bool:
        """Whether ``region`` matches one of ``regions``."""
        return any(fnmatchcase(region.lower(), pattern) for pattern in self.regions)


class CheckpointSpec(_Spec):
    """Where the job's checkpoints go, how often, and how big they are."""

    uri: Annotated[str, Strict()] | None = None
    """An fsspec URI or an absolute path; None lets the daemon pick a per-job folder."""
    interval: Literal["auto"] | timedelta = "auto"
    """How often to checkpoint; ``"auto"`` lets the policy choose from the preemption rate."""
    size_gb: Annotated[PositiveFloat, at_least(MIN_CHECKPOINT_GB), at_most(MAX_CHECKPOINT_GB)] = (
        1.0
    )
    """Expected size of one checkpoint in GB; prices the time to write and read it."""
    on_notice: bool = Field(default=True, strict=True)
    """The job writes a checkpoint when the agent signals a preemption notice (the
    contract of ``docs/agent.md``). Where the write fits in the provider's notice, a
    preemption then loses no work, which makes spot cheaper in the policy's estimates;
    false for a job that only checkpoints on its own schedule."""

    @field_validator("uri")
    @classmethod
    def _check_uri(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else checkpoint_location(value, info)

    @field_validator("interval", mode="before")
    @classmethod
    def _parse_interval(cls, value: object, info: ValidationInfo) -> Literal["auto"] | timedelta:
        if value == "auto":
            return "auto"
        return parse_duration(value, auto=True, bounded=submitted(info))

    @field_serializer("interval", when_used="json")
    def _interval_seconds(self, value: Literal["auto"] | timedelta) -> str | int:
        # Whole seconds (the validator enforces it), which both TOML and this
        # model's validator read back exactly; ISO 8601 durations they would not.
        if isinstance(value, timedelta):
            return whole_seconds(value)
        return value


class DeadlineSpec(_Spec):
    """When the job must be done, and how long it needs."""

    compute_hours: Annotated[PositiveFloat, at_most(MAX_COMPUTE_HOURS)] | None = None
    """Estimated compute time on the GPUs asked for, in hours."""
    finish_by: datetime | None = None
    """Latest acceptable end, timezone-aware, stored in UTC."""

    @field_validator("finish_by", mode="before")
    @classmethod
    def _check_finish_by(cls, value: object, info: ValidationInfo) -> object:
        from_toml = isinstance(info.context, Mapping) and bool(info.context.get(CTX_FROM_TOML))
        if isinstance(value, datetime):
            if value.utcoffset() is None:
                raise ValueError(
                    f"{value.isoformat()} has no timezone: add an offset or Z, "
                    f"like {value.replace(microsecond=0, tzinfo=None).isoformat()}Z"
                )
            return value
        if isinstance(value, date | time) or (from_toml and value is not None):
            unquote = " (a TOML date-time, without quotes)" if isinstance(value, str) else ""
            raise ValueError(
                f"expected an offset date-time like 2026-12-24T00:00:00Z{unquote}, "
                f"got {describe(value)}"
            )
        # From the store (JSON) the value is an ISO string; pydantic parses it.
        return value

    @field_validator("finish_by")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.utcoffset() is None:
            raise ValueError("must be timezone-aware: add an offset or Z")
        try:
            return value.astimezone(UTC)
        except OverflowError:
            raise ValueError(f"{value.isoformat()} is out of range") from None


class GangSpec(_Spec):
    """How the nodes of a multi-node attempt find each other, and how long its ranks may
    stand still (see docs/training.md)."""

    timeout: Duration = timedelta(minutes=15)
    """How long a node's agent waits for its gang's roster. The daemon gives the
    gang this plus ``preflight.timeout`` from the launch to boot, join and pass
    preflight; a gang not assembled by then is ended as lost and relaunched."""
    master_port: Annotated[int, Strict(), Field(ge=1, le=65535)] | None = None
    """The rendezvous port on the rank-0 node; None lets that node's agent pick a free one."""
    on_node_failure: NodeFailure = NodeFailure.AUTO
    """What the gang does when some of its nodes go and the others are healthy
    (:mod:`spotd.engine.repair`)."""
    hang_timeout: Duration | None = None
    """How long (on the daemon's clock) no rank's step may move while the nodes are up
    before the attempt counts as hung: it is stopped and the job resumes from its last
    checkpoint on new nodes (``retry.hangs``). Only a job that reports its steps
    (``spotd.train`` does) is watched; set it above the longest step, checkpoint save
    and start-up (restore, compilation). None: no hang watch. A job of one node is
    watched too."""


class PreflightSpec(_Spec):
    """The checks every new gang passes before the job's command starts."""

    enabled: bool = Field(default=True, strict=True)
    min_busbw_gbps: Annotated[PositiveFloat, at_most(MAX_BUSBW_GBPS)] | None = None
    """Lowest all-reduce bus bandwidth in GB/s the gang must show; None takes the
    fabric's figure from spotd's table (for NCCL on GPUs; a CPU gang has none)."""
    timeout: Duration = timedelta(minutes=5)
    """Longest the checks may take before the attempt counts as failed."""
    python: (
        Annotated[str, Strict(), Field(min_length=1), at_most_bytes(MAX_PATH_BYTES)] | None
    ) = None
    """The interpreter the job trains with, where the preflight's workers run: a path
    (relative to the job's working folder) or a name on the job's PATH. None: the
    command's own (its first word, or its ``#!`` line's), else the first ``python3`` or
    ``python`` on the job's PATH (inside its image when it has one)."""
    torch: bool | None = Field(default=None, strict=True)
    """Whether the job trains with torch. None: torch must import in the job's
    interpreter wherever the gang needs it (2+ processes, for the all-reduce); True:
    also on a node of one process; False: never, and no all-reduce is measured."""


class BudgetSpec(_Spec):
    """The most the job may cost."""

    max_usd: Annotated[PositiveFloat, at_most(MAX_BUDGET_USD)]
    """Total spend in USD over every attempt; the job stops when it would go over."""


class NotifySpec(_Spec):
    """Who hears about the job."""

    email: Annotated[tuple[Email, ...], at_most_items(MAX_EMAILS, "addresses")] = ()
    on_end: bool = Field(default=False, strict=True)
    """Email a report to ``email`` when the job ends."""


class CodeRef(_Spec):
    """The job's working directory as ``spotd submit`` packed and uploaded it.

    Content-addressed: the archive's name is its SHA-256, so the same folder
    content is stored once, and every attempt unpacks exactly these bytes,
    whatever the folder on the submitting machine holds later.
    """

    uri: Annotated[str, Strict(), at_most_bytes(MAX_PATH_BYTES)]
    """fsspec URI of the ``.tar.gz``."""
    sha256: Sha256
    size_bytes: Annotated[int, Strict(), Field(ge=0), at_most(MAX_CODE_BYTES)]
    """Size of the archive."""
    files: Annotated[int, Strict(), Field(ge=0), at_most(MAX_CODE_FILES)]


class RetrySpec(_Spec):
    """How many failed attempts of each kind a job survives before it fails."""

    setup_failures: Annotated[int, Strict(), Field(ge=0, le=100)] = 2
    """Attempts that may end ``setup-failed`` (a setup command or the code download
    failed on a node) and be placed again; the next one fails the job."""
    launch_failures: Annotated[int, Strict(), Field(ge=0, le=1000)] = 20
    """Attempts in a row (since the job last ran) that may end ``launch-failed`` or
    ``no-capacity`` (the provider refused or could not start the nodes) and be placed
    again; the next one fails the job (cause ``launch-failed``). 20 walks through the
    candidate pools of a busy spot market (their cooldowns double with each refusal)
    but stops a job that no pool will start, which otherwise retries forever."""
    launch_failures_per_pool: Annotated[int, Strict(), Field(ge=1, le=1000)] = 3
    """Failed launches (as ``launch_failures`` counts them) in one pool after which the job
    does not use that pool again, in either market, until it runs somewhere: three
    refusals in a row, with doubling cooldowns, say the pool will not serve it soon."""
    max_restarts_on_errors: Annotated[int, Strict(), Field(ge=0, le=1000)] = 0
    """Times the job is started again, from its last checkpoint, after its command exits
    non-zero with a code ``restart_on_exit_codes`` covers; past it (and by default,
    0) such an exit fails the job (cause ``user-command-failed``)."""
    hangs: Annotated[int, Strict(), Field(ge=0, le=1000)] = 3
    """Attempts in a row that may end ``hung`` (``gang.hang_timeout``) and be placed
    again, from the last checkpoint; the next one fails the job (cause ``hung``): a job
    that hangs wherever it runs is stuck in its own code."""
    restart_on_exit_codes: Annotated[
        tuple[Annotated[int, Strict(), Field(ge=-255, le=255)], ...],
        at_most_items(MAX_EXIT_CODES, "codes"),
    ] = ()
    """Exit codes that are restarted (an NCCL timeout's, a GPU Xid error's, 137 for a
    SIGKILL); empty restarts every non-zero code. A gang is restarted when any of its
    failed nodes exited with a listed code."""


class JobSpec(_Spec):
    """A whole job: what to run, on what, where, and within which limits."""

    name: Annotated[str, Strict()]
    """1-63 characters of ``[A-Za-z0-9._-]``, starting with a letter or digit."""
    command: tuple[Arg, ...]
    """argv of the command; a shell string in TOML becomes ``("/bin/sh", "-c", s)``."""
    env: EnvTable = Field(default_factory=dict)
    workdir: Annotated[str, Strict()] | None = None
    """Absolute working directory of the command; None lets the daemon decide. A folder
    that exists on the submitting machine is packed and shipped (see ``code``)."""
    code: CodeRef | None = None
    """The shipped ``workdir``: set by ``spotd submit``; the nodes run in its unpacked copy."""
    image: Image | None = None
    """A container image the command runs in on every node; None runs it on the node itself."""
    setup: Annotated[
        tuple[SetupLine, ...],
        at_most_items(MAX_SETUP_LINES, "lines"),
    ] = ()
    """Shell command lines run once per node, in order, before the job (and its gang)."""
    secrets: Annotated[tuple[EnvName, ...], at_most_items(MAX_ENV_VARS, "names")] = ()
    """Names of values the daemon holds (``[secrets]`` in its config) that the job's
    environment gets on the node, and nothing else ever shows."""
    retry: RetrySpec = RetrySpec()
    keep_on_failure: Duration | None = None
    """How long (real time) the nodes of the attempt that fails the job are kept running for
    inspection, their addresses in ``spotd status``, billed as any node; ``spotd release``
    stops them sooner. None: stopped at once. Not for a job failed over its budget."""
    priority: Priority = 0
    """Higher is placed first when jobs wait for the same capacity; equal priorities
    go oldest first. A running job gives way to a higher one only within its team's
    ``max_running_jobs`` (``spotd.engine.yielding``), never for the market's capacity."""
    team: Annotated[str, Strict()] | None = None
    """The team (or project) the job is counted against: ``[teams.<name>]`` limits in
    the daemon's config. Same characters as ``name``."""
    resources: Resources
    market: MarketSpec = MarketSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    deadline: DeadlineSpec | None = None
    budget: BudgetSpec | None = None
    notify: NotifySpec = NotifySpec()
    gang: GangSpec = GangSpec()
    preflight: PreflightSpec = PreflightSpec()
    fabric_env: dict[Fabric, FabricEnvTable] = Field(default_factory=dict)
    """Per fabric kind, variables merged over spotd's table (an empty value removes one)."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME_RE.fullmatch(value):
            raise ValueError(
                "must be 1-63 characters of letters, digits, '.', '_' and '-', "
                f"starting with a letter or digit, got {describe(value)}"
            )
        return value

    @field_validator("team")
    @classmethod
    def _check_team(cls, value: str | None) -> str | None:
        if value is not None and not _NAME_RE.fullmatch(value):
            raise ValueError(
                "must be 1-63 characters of letters, digits, '.', '_' and '-', "
                f"starting with a letter or digit, got {describe(value)}"
            )
        return value

    @field_validator("command", mode="before")
    @classmethod
    def _shell_string(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str):
            if value.strip() == "":
                raise ValueError("must not be empty: give a shell command or an argv array")
            return (SHELL, "-c", value)
        if not isinstance(value, list | tuple):
            raise ValueError(
                f"expected an array of strings (argv) or a shell command string, "
                f"got {describe(value)}"
            )
        if len(value) > MAX_COMMAND_ARGS and submitted(info):
            raise ValueError(f"must have at most {MAX_COMMAND_ARGS} items, got {len(value)}")
        return value

    @field_validator("command")
    @classmethod
    def _check_argv(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if not value:
            raise ValueError('must not be empty, like ["python3", "train.py"]')
        if value[0].strip() == "":
            raise ValueError("the program (first item) must not be empty")
        for arg in value:
            no_nul(arg)
        size = sum(utf8_bytes(arg) + 1 for arg in value)
        if size > MAX_COMMAND_BYTES and submitted(info):
            raise ValueError(
                f"must add up to at most {MAX_COMMAND_BYTES} bytes (each item with a NUL, "
                f"as exec counts them), got {size}"
            )
        return value

    @field_validator("workdir")
    @classmethod
    def _check_workdir(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        non_empty_str(value)
        no_nul(value)
        return path_at_most(absolute(value, info), info, written=value)

    @field_validator("secrets")
    @classmethod
    def _check_secrets(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("names a secret twice")
        spotd = [n for n in value if n.startswith("SPOTD_")]
        if spotd:
            raise ValueError(f"SPOTD_ names are spotd's own variables, got {', '.join(spotd)}")
        both = sorted(set(value) & set(info.data.get("env") or {}))
        if both:
            raise ValueError(
                f"{', '.join(both)} is in env too: a secret's value comes from the "
                "daemon, so leave it out of env"
            )
        return value

    @property
    def total_gpus(self) -> int:
        """GPUs over all nodes: ``nodes * gpus_per_node``."""
        return self.resources.total_gpus

    def allows_provider(self, name: str) -> bool:
        """Whether the provider called ``name`` matches ``market.providers``."""
        return self.market.allows_provider(name)

    def allows_region(self, region: str) -> bool:
        """Whether ``region`` matches ``market.regions``."""
        return self.market.allows_region(region)


def deadline_controlled(spec: JobSpec) -> bool:
    """Whether the policy must steer the job to its deadline: market ``auto`` with both
    ``deadline.compute_hours`` and ``deadline.finish_by``."""
    d = spec.deadline
    return (
        spec.market.type is MarketMode.AUTO
        and d is not None
        and d.compute_hours is not None
        and d.finish_by is not None
    )
