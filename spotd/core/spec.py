"""The job spec: what a user asks spotd to run, read from ``job.toml``.

:func:`load_job_file` and :func:`parse_job_toml` turn TOML into a frozen
:class:`JobSpec` or raise :class:`~spotd.core.errors.JobSpecError` with one line
per problem, each naming the dotted field path, the line of the file where
the key is, and what was expected::

    jobs/llama.toml: invalid job spec
      - resources.gpus_per_node (line 7): must be >= 1, got -2
      - resources.colour (line 9): unknown field; expected one of gpus, ...

Nothing else escapes them, whatever the input text. :func:`spec_to_json` and
:func:`spec_from_json` are the round trip the store uses.

Paths in a spec (``workdir``, a plain-path ``checkpoint.uri``) are resolved
against the job file's folder while parsing and stored absolute, so a spec
means the same thing wherever the daemon later reads it.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from annotated_types import Gt, Le
from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    Strict,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
)

from spotd.core.errors import JobSpecError
from spotd.core.limits import (
    MAX_ARG_BYTES,
    MAX_BUDGET_USD,
    MAX_BUSBW_GBPS,
    MAX_CHECKPOINT_GB,
    MAX_CODE_BYTES,
    MAX_CODE_FILES,
    MAX_COMMAND_ARGS,
    MAX_COMMAND_BYTES,
    MAX_COMPUTE_HOURS,
    MAX_DURATION,
    MAX_EMAIL_CHARS,
    MAX_EMAILS,
    MAX_ENV_BYTES,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VARS,
    MAX_EXIT_CODES,
    MAX_FABRIC_ENV_BYTES,
    MAX_GBPS_PER_GPU,
    MAX_GPU_MODELS,
    MAX_GPU_NAME_CHARS,
    MAX_GPUS_PER_NODE,
    MAX_IMAGE_CHARS,
    MAX_MODEL_SIZE_B,
    MAX_NODES,
    MAX_PATH_BYTES,
    MAX_PATTERN_CHARS,
    MAX_PATTERNS,
    MAX_PRICE_PER_GPU_HOUR,
    MAX_RUN_HOURS,
    MAX_SETUP_LINES,
    MIN_CHECKPOINT_GB,
)
from spotd.core.network import Fabric
from spotd.core.toml_lines import KeyLines

__all__ = [
    "BudgetSpec",
    "CheckpointSpec",
    "DeadlineSpec",
    "JobSpec",
    "MarketMode",
    "MarketSpec",
    "NotifySpec",
    "Resources",
    "load_job_file",
    "parse_job_toml",
    "spec_from_json",
    "spec_to_json",
]

SHELL = "/bin/sh"

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GPU_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_GLOB_RE = re.compile(r"[A-Za-z0-9*?\[\]!._-]+")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
# registry/name[:tag][@digest]: lower-case path parts, an optional host[:port] first.
_IMAGE_RE = re.compile(
    r"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@sha256:[0-9a-f]{64})?"
)
_DURATION_RE = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_BARE_PROTOCOL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_TOML_POS_RE = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\s*$")

# Context keys passed to model validation by the TOML path only: the store
# path has absolute paths already and never resolves anything.
_CTX_BASE_DIR = "base_dir"
_CTX_FROM_TOML = "from_toml"
# Passed by spec_from_json only: a spec the store kept is read whatever its size. The
# bounds of spotd.core.limits may be newer than it, and one stored spec that no longer
# reads would stop every read of the jobs beside it (a listing, a reconcile pass).
_CTX_STORED = "stored"


# --------------------------------------------------------------------------
# Small validators shared by the models
# --------------------------------------------------------------------------


def _no_nul(value: str) -> str:
    # exec() and environ cannot carry NUL; TOML can (as \u0000), so catch it here.
    if "\x00" in value:
        raise ValueError("must not contain a NUL character (\\u0000)")
    return value


def _check_env_name(key: str) -> str:
    if not _ENV_NAME_RE.fullmatch(key):
        raise ValueError(
            "not a valid environment variable name "
            "(letters, digits and _, not starting with a digit)"
        )
    return key


def _check_email(address: str) -> str:
    local, at, domain = address.partition("@")
    ok = (
        at == "@"
        and local != ""
        and "@" not in domain
        and "." in domain
        and not domain.startswith(".")
        and not domain.endswith(".")
        and not any(ch.isspace() for ch in address)
    )
    if not ok:
        raise ValueError(f"{address!r} is not an email address (like ml-team@example.com)")
    return address


def _check_glob(pattern: str) -> str:
    if not _GLOB_RE.fullmatch(pattern):
        raise ValueError(
            f"{pattern!r} is not a name pattern (letters, digits, . _ - and the globs * ? [ ])"
        )
    # Provider and region names are lower case everywhere; matching ignores case.
    return pattern.lower()


def _non_empty_str(value: str) -> str:
    if value.strip() == "":
        raise ValueError("must not be empty")
    return value


# --------------------------------------------------------------------------
# Bounds (the figures and why: spotd.core.limits)
# --------------------------------------------------------------------------


def _submitted(info: ValidationInfo) -> bool:
    """Whether the bounds of :mod:`spotd.core.limits` apply: to every spec but one read
    back from the store (see ``_CTX_STORED``)."""
    return not (isinstance(info.context, Mapping) and info.context.get(_CTX_STORED))


def _utf8_bytes(value: str) -> int:
    # surrogatepass: a JSON body may carry a lone surrogate; it is counted, not a crash.
    return len(value.encode("utf-8", "surrogatepass"))


def _env_bytes(env: Mapping[str, str]) -> int:
    """What ``env`` weighs in an exec: each ``NAME=value`` with its NUL."""
    return sum(len(name) + _utf8_bytes(value) + 2 for name, value in env.items())


def _at_most(bound: float) -> AfterValidator:
    """At most ``bound``, said as pydantic's own ``le`` is (``must be <= 4096, got ...``)."""

    def check(value: float, info: ValidationInfo) -> float:
        if value > bound and _submitted(info):
            raise ValueError(f"must be <= {_number(bound)}, got {_number(value)}")
        return value

    return AfterValidator(check)


def _at_least(bound: float) -> AfterValidator:
    """At least ``bound``, said as pydantic's own ``ge`` is (``must be >= 1e-06, got ...``)."""

    def check(value: float, info: ValidationInfo) -> float:
        if value < bound and _submitted(info):
            raise ValueError(f"must be >= {_number(bound)}, got {_number(value)}")
        return value

    return AfterValidator(check)


def _at_most_chars(bound: int) -> AfterValidator:
    """A string of at most ``bound`` characters: names, which are ASCII."""

    def check(value: str, info: ValidationInfo) -> str:
        if len(value) > bound and _submitted(info):
            raise ValueError(f"must be at most {bound} characters, got {len(value)}")
        return value

    return AfterValidator(check)


def _at_most_bytes(bound: int) -> AfterValidator:
    """A string of at most ``bound`` bytes of UTF-8: what exec and the kernel count."""

    def check(value: str, info: ValidationInfo) -> str:
        size = _utf8_bytes(value)
        if size > bound and _submitted(info):
            raise ValueError(f"must be at most {bound} bytes (UTF-8), got {size}")
        return value

    return AfterValidator(check)


def _at_most_items(bound: int, items: str) -> BeforeValidator:
    """An array or table of at most ``bound`` items, counted before any item is
    checked: a million bad items would otherwise be a million problems."""

    def check(value: object, info: ValidationInfo) -> object:
        if isinstance(value, list | tuple | dict) and len(value) > bound and _submitted(info):
            raise ValueError(f"must have at most {bound} {items}, got {len(value)}")
        return value

    return BeforeValidator(check)


def _path_at_most(path: str, info: ValidationInfo, *, written: str | None = None) -> str:
    """``path`` if within the bound of a path. ``written``: what the spec said, when
    ``path`` is that made absolute (the bound is on what the nodes are given)."""
    size = _utf8_bytes(path)
    if size > MAX_PATH_BYTES and _submitted(info):
        made = " once made absolute" if written is not None and written != path else ""
        raise ValueError(f"must be at most {MAX_PATH_BYTES} bytes (UTF-8), got {size}{made}")
    return path


def _env_at_most(bound: int) -> AfterValidator:
    """Variables that weigh at most ``bound`` bytes in an exec (:func:`_env_bytes`)."""

    def check(value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        size = _env_bytes(value)
        if size > bound and _submitted(info):
            raise ValueError(
                f"must add up to at most {bound} bytes (each NAME=value with a NUL, "
                f"as exec counts them), got {size}"
            )
        return value

    return AfterValidator(check)


PositiveFloat = Annotated[float, Strict(), AllowInfNan(False), Gt(0)]
"""A finite float > 0; TOML integers are accepted, booleans and strings are not."""


def _check_sha256(value: str) -> str:
    if not _SHA256_RE.fullmatch(value):
        raise ValueError(f"expected 64 lowercase hex digits, got {_describe(value)}")
    return value


def _check_image(value: str) -> str:
    _no_nul(value)
    if not _IMAGE_RE.fullmatch(value):
        raise ValueError(
            "expected an image reference like 'nvcr.io/nvidia/pytorch:24.05-py3' or "
            f"'ghcr.io/org/train@sha256:...', got {_describe(value)}"
        )
    return value


def _check_setup_line(value: str) -> str:
    _no_nul(value)
    if not value.strip():
        raise ValueError("a setup line must not be empty")
    return value


EnvName = Annotated[
    str, Strict(), _at_most_chars(MAX_ENV_NAME_CHARS), AfterValidator(_check_env_name)
]
EnvValue = Annotated[str, Strict(), AfterValidator(_no_nul), _at_most_bytes(MAX_ARG_BYTES)]
EnvTable = Annotated[
    dict[EnvName, EnvValue],
    _at_most_items(MAX_ENV_VARS, "variables"),
    _env_at_most(MAX_ENV_BYTES),
]
FabricEnvTable = Annotated[
    dict[EnvName, EnvValue],
    _at_most_items(MAX_ENV_VARS, "variables"),
    _env_at_most(MAX_FABRIC_ENV_BYTES),
]
Arg = Annotated[str, Strict(), _at_most_bytes(MAX_ARG_BYTES)]
"""One string a node execs: an item of ``command``, a ``setup`` line."""
Email = Annotated[str, Strict(), _at_most_chars(MAX_EMAIL_CHARS), AfterValidator(_check_email)]
Glob = Annotated[str, Strict(), _at_most_chars(MAX_PATTERN_CHARS), AfterValidator(_check_glob)]
GpuName = Annotated[str, Strict(), _at_most_chars(MAX_GPU_NAME_CHARS)]


def _parse_duration(value: object, *, auto: bool = False, bounded: bool = True) -> timedelta:
    """``"90s"``, ``"15m"``, ``"1h30m"``, ``"2h"``, an int of seconds, or a timedelta.

    ``auto``: the field also takes ``"auto"``, so the error names it too.
    ``bounded``: at most :data:`~spotd.core.limits.MAX_DURATION` (false for a stored spec).
    """
    either = '"auto" or ' if auto else ""
    if isinstance(value, timedelta):
        if value.microseconds or value.total_seconds() <= 0:
            raise ValueError(f"must be a whole number of seconds > 0, got {value}")
        if bounded and value > MAX_DURATION:
            raise ValueError(f"{_LONGEST}, got {value}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(
            f'expected {either}a duration like "15m" or "1h30m", or an integer of '
            f"seconds, got {_describe(value)}"
        )
    if isinstance(value, int):
        seconds = value
    else:
        match = _DURATION_RE.fullmatch(value.strip())
        if value.strip() == "" or match is None:
            raise ValueError(
                f'expected {either}a duration like "90s", "15m", "1h30m" or "2h", '
                f"got {_describe(value)}"
            )
        hours, minutes, secs = (int(g) if g else 0 for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds <= 0:
        raise ValueError(f"must be > 0 seconds, got {_describe(value)}")
    if bounded and seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"{_LONGEST}, got {_describe(value)}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"is too long, got {_describe(value)}") from None


_LONGEST = (
    f"must be at most {MAX_DURATION.days} days "
    f'("{MAX_DURATION.days * 24}h" or {MAX_DURATION.days * 86400} seconds)'
)
"""How :func:`_parse_duration` says a duration is over the bound, before what it got."""


def _duration(value: object, info: ValidationInfo) -> timedelta:
    return _parse_duration(value, bounded=_submitted(info))


def _absolute(value: str, info: ValidationInfo) -> str:
    """``value`` made absolute against the job file's folder, when parsing a file."""
    context = info.context if isinstance(info.context, Mapping) else {}
    base = context.get(_CTX_BASE_DIR)
    if not isinstance(base, Path):
        return value
    path = Path(value)
    if not path.is_absolute():
        path = base / path
    # normpath, not resolve(): the folder may not exist here (it may only exist
    # on the node), and a lexical "a/../b" -> "b" is all that is wanted.
    return os.path.normpath(path)


def relative_paths(spec: JobSpec) -> list[tuple[str, str]]:
    """The (field, value) pairs of ``spec`` that are relative paths: ``workdir``, and a
    ``checkpoint.uri`` that is a path without a scheme. A spec parsed from a file has
    none (they resolve against its folder); one sent as JSON may, and only the sender
    knows what they were relative to."""
    found = []
    if spec.workdir is not None and not Path(spec.workdir).is_absolute():
        found.append(("workdir", spec.workdir))
    uri = spec.checkpoint.uri
    is_path = uri is not None and "::" not in uri and not _SCHEME_RE.match(uri)
    if uri is not None and is_path and not Path(uri).is_absolute():
        found.append(("checkpoint.uri", uri))
    return found


# --------------------------------------------------------------------------
# The models
# --------------------------------------------------------------------------


class MarketMode(StrEnum):
    """How the capacity of a job may be bought."""

    SPOT = "spot"
    """Spot capacity only."""
    ON_DEMAND = "on-demand"
    """On-demand capacity only."""
    AUTO = "auto"
    """The policy may mix spot and on-demand to meet the deadline."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Resources(_Spec):
    """The GPUs a job needs: which models, how many per node, how many nodes."""

    gpus: Annotated[tuple[GpuName, ...], _at_most_items(MAX_GPU_MODELS, "models")]
    """Acceptable GPU models in order of preference, upper case, no duplicates.

    One run never mixes models: every node of an attempt has the same one.
    """
    gpus_per_node: Annotated[int, Strict(), Field(ge=1, le=MAX_GPUS_PER_NODE)]
    nodes: Annotated[int, Strict(), Field(ge=1), _at_most(MAX_NODES)] = 1
    model_size_b: Annotated[PositiveFloat, _at_most(MAX_MODEL_SIZE_B)] | None = None
    """Billions of parameters; sets the scale-out bandwidth a multi-node run needs."""
    min_gbps_per_gpu: Annotated[PositiveFloat, _at_most(MAX_GBPS_PER_GPU)] | None = None
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
    providers: Annotated[tuple[Glob, ...], _at_most_items(MAX_PATTERNS, "patterns")] = ("*",)
    """Glob patterns over provider names (``aws``, ``sim-*``), lower-cased."""
    regions: Annotated[tuple[Glob, ...], _at_most_items(MAX_PATTERNS, "patterns")] = ("*",)
    """Glob patterns over region names (``us-east-*``), lower-cased."""
    max_price_per_gpu_hour: Annotated[PositiveFloat, _at_most(MAX_PRICE_PER_GPU_HOUR)] | None = None
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
    size_gb: Annotated[PositiveFloat, _at_least(MIN_CHECKPOINT_GB), _at_most(MAX_CHECKPOINT_GB)] = (
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
        if value is None:
            return None
        _non_empty_str(value)
        _no_nul(value)
        # Before the protocols are looked for: an endless text is not read through.
        _path_at_most(value, info)
        if value != value.strip():
            raise ValueError(f"must not start or end with spaces, got {value!r}")
        parts = value.split("::")
        protocols: list[str] = []
        for index, part in enumerate(parts):
            scheme = _SCHEME_RE.match(part)
            if scheme is not None:
                protocols.append(scheme.group(1))
            elif index < len(parts) - 1:
                # In an fsspec chain ("simplecache::s3://b/k") the links before
                # the last may be bare protocol names.
                if not _BARE_PROTOCOL_RE.fullmatch(part):
                    raise ValueError(f"{part!r} in {value!r} is not a protocol name")
                protocols.append(part)
        unknown = sorted({p for p in protocols if p.lower() not in _fsspec_protocols()})
        if unknown:
            raise ValueError(
                f"unknown storage protocol {', '.join(map(repr, unknown))} in {value!r} "
                "(expected one fsspec knows, like file, s3, gs, az)"
            )
        if not protocols:
            return _path_at_most(_absolute(value, info), info, written=value)
        return value

    @field_validator("interval", mode="before")
    @classmethod
    def _parse_interval(cls, value: object, info: ValidationInfo) -> Literal["auto"] | timedelta:
        if value == "auto":
            return "auto"
        return _parse_duration(value, auto=True, bounded=_submitted(info))

    @field_serializer("interval", when_used="json")
    def _interval_seconds(self, value: Literal["auto"] | timedelta) -> str | int:
        # Whole seconds (the validator enforces it), which both TOML and this
        # model's validator read back exactly; ISO 8601 durations they would not.
        if isinstance(value, timedelta):
            return value.days * 86400 + value.seconds
        return value


class DeadlineSpec(_Spec):
    """When the job must be done, and how long it needs."""

    compute_hours: Annotated[PositiveFloat, _at_most(MAX_COMPUTE_HOURS)] | None = None
    """Estimated compute time on the GPUs asked for, in hours."""
    finish_by: datetime | None = None
    """Latest acceptable end, timezone-aware, stored in UTC."""

    @field_validator("finish_by", mode="before")
    @classmethod
    def _check_finish_by(cls, value: object, info: ValidationInfo) -> object:
        from_toml = isinstance(info.context, Mapping) and bool(info.context.get(_CTX_FROM_TOML))
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
                f"got {_describe(value)}"
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


def _whole_seconds(value: timedelta) -> int:
    # Whole seconds (the parser enforces it), which TOML and the parser read back.
    return value.days * 86400 + value.seconds


Duration = Annotated[
    timedelta,
    BeforeValidator(_duration),
    PlainSerializer(_whole_seconds, return_type=int, when_used="json"),
]
"""A duration written as ``checkpoint.interval`` is (``"90s"``, ``"1h30m"``, seconds)."""


class GangSpec(_Spec):
    """How the nodes of a multi-node attempt find each other (see docs/training.md)."""

    timeout: Duration = timedelta(minutes=15)
    """How long a node's agent waits for its gang's roster. The daemon gives the
    gang this plus ``preflight.timeout`` from the launch to boot, join and pass
    preflight; a gang not assembled by then is ended as lost and relaunched."""
    master_port: Annotated[int, Strict(), Field(ge=1, le=65535)] | None = None
    """The rendezvous port on the rank-0 node; None lets that node's agent pick a free one."""


class PreflightSpec(_Spec):
    """The checks every new gang passes before the job's command starts."""

    enabled: bool = Field(default=True, strict=True)
    min_busbw_gbps: Annotated[PositiveFloat, _at_most(MAX_BUSBW_GBPS)] | None = None
    """Lowest all-reduce bus bandwidth in GB/s the gang must show; None takes the
    fabric's figure from spotd's table (for NCCL on GPUs; a CPU gang has none)."""
    timeout: Duration = timedelta(minutes=5)
    """Longest the checks may take before the attempt counts as failed."""


class BudgetSpec(_Spec):
    """The most the job may cost."""

    max_usd: Annotated[PositiveFloat, _at_most(MAX_BUDGET_USD)]
    """Total spend in USD over every attempt; the job stops when it would go over."""


class NotifySpec(_Spec):
    """Who hears about the job."""

    email: Annotated[tuple[Email, ...], _at_most_items(MAX_EMAILS, "addresses")] = ()
    on_end: bool = Field(default=False, strict=True)
    """Email a report to ``email`` when the job ends."""


class CodeRef(_Spec):
    """The job's working directory as ``spotd submit`` packed and uploaded it.

    Content-addressed: the archive's name is its SHA-256, so the same folder
    content is stored once, and every attempt unpacks exactly these bytes,
    whatever the folder on the submitting machine holds later.
    """

    uri: Annotated[str, Strict(), _at_most_bytes(MAX_PATH_BYTES)]
    """fsspec URI of the ``.tar.gz``."""
    sha256: Annotated[str, Strict(), AfterValidator(_check_sha256)]
    size_bytes: Annotated[int, Strict(), Field(ge=0), _at_most(MAX_CODE_BYTES)]
    """Size of the archive."""
    files: Annotated[int, Strict(), Field(ge=0), _at_most(MAX_CODE_FILES)]


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
    restart_on_exit_codes: Annotated[
        tuple[Annotated[int, Strict(), Field(ge=-255, le=255)], ...],
        _at_most_items(MAX_EXIT_CODES, "codes"),
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
    image: (
        Annotated[str, Strict(), _at_most_chars(MAX_IMAGE_CHARS), AfterValidator(_check_image)]
        | None
    ) = None
    """A container image the command runs in on every node; None runs it on the node itself."""
    setup: Annotated[
        tuple[Annotated[Arg, AfterValidator(_check_setup_line)], ...],
        _at_most_items(MAX_SETUP_LINES, "lines"),
    ] = ()
    """Shell command lines run once per node, in order, before the job (and its gang)."""
    secrets: Annotated[tuple[EnvName, ...], _at_most_items(MAX_ENV_VARS, "names")] = ()
    """Names of values the daemon holds (``[secrets]`` in its config) that the job's
    environment gets on the node, and nothing else ever shows."""
    retry: RetrySpec = RetrySpec()
    priority: Annotated[int, Strict(), Field(ge=-1_000_000, le=1_000_000)] = 0
    """Higher is placed first when jobs wait for the same capacity; equal priorities
    go oldest first. A running job is never stopped for a higher one."""
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
                f"starting with a letter or digit, got {_describe(value)}"
            )
        return value

    @field_validator("team")
    @classmethod
    def _check_team(cls, value: str | None) -> str | None:
        if value is not None and not _NAME_RE.fullmatch(value):
            raise ValueError(
                "must be 1-63 characters of letters, digits, '.', '_' and '-', "
                f"starting with a letter or digit, got {_describe(value)}"
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
                f"got {_describe(value)}"
            )
        if len(value) > MAX_COMMAND_ARGS and _submitted(info):
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
            _no_nul(arg)
        size = sum(_utf8_bytes(arg) + 1 for arg in value)
        if size > MAX_COMMAND_BYTES and _submitted(info):
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
        _non_empty_str(value)
        _no_nul(value)
        return _path_at_most(_absolute(value, info), info, written=value)

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

    def __hash__(self) -> int:
        # pydantic's frozen hash would hash the env dict and fail; equal
        # specs (env order aside) must hash alike, so hash its items as a set.
        return hash(
            (
                type(self),
                self.name,
                self.command,
                frozenset(self.env.items()),
                self.workdir,
                self.code,
                self.image,
                self.setup,
                self.secrets,
                self.retry,
                self.resources,
                self.market,
                self.checkpoint,
                self.deadline,
                self.budget,
                self.notify,
                self.gang,
                self.preflight,
                frozenset((k, frozenset(v.items())) for k, v in self.fabric_env.items()),
            )
        )

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


# --------------------------------------------------------------------------
# Loading, and the round trip through the store
# --------------------------------------------------------------------------


def load_job_file(path: str | Path) -> JobSpec:
    """Read and validate the job file at ``path``.

    Relative paths in it resolve against the file's folder. Raises
    :class:`JobSpecError` for an unreadable file and for any invalid content.
    """
    file = Path(path)
    source = str(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise JobSpecError(source, [f"cannot read the file: {reason}"]) from None
    try:
        # utf-8-sig: a BOM from a Windows editor is harmless, so drop it.
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise JobSpecError(source, [f"not UTF-8 text (bad byte at offset {exc.start})"]) from None
    return parse_job_toml(text, source=source, base_dir=file.absolute().parent)


def parse_job_toml(text: str, *, source: str, base_dir: Path) -> JobSpec:
    """Parse and validate the TOML ``text`` of a job spec.

    ``source`` names the text in errors (usually the file's path);
    ``base_dir`` is the folder relative paths resolve against. Raises
    :class:`JobSpecError`, and nothing else, for any input.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # tomllib lets lone surrogates through, but they cannot be stored,
        # passed to exec or put in an environment.
        line = text.count("\n", 0, exc.start) + 1
        bad = exc.object[exc.start]
        raise JobSpecError(
            source, [f"line {line}: not valid Unicode text (lone surrogate {bad!r})"]
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobSpecError(source, [_toml_syntax_problem(exc)]) from None
    except ValueError:
        # Not a TOMLDecodeError: Python's own limit on reading an integer's digits.
        limit = sys.get_int_max_str_digits()
        raise JobSpecError(source, [f"invalid TOML: an integer of over {limit} digits"]) from None
    except RecursionError:
        raise JobSpecError(source, ["invalid TOML: arrays or tables nested too deeply"]) from None
    context = {_CTX_BASE_DIR: Path(base_dir).absolute(), _CTX_FROM_TOML: True}
    try:
        return JobSpec.model_validate(data, context=context)
    except ValidationError as exc:
        locator = KeyLines(text)
        problems = [_problem(error, locator) for error in exc.errors(include_url=False)]
        raise JobSpecError(source, problems) from None


def spec_to_json(spec: JobSpec) -> str:
    """The JSON form of ``spec`` the store keeps; :func:`spec_from_json` reads it back."""
    return spec.model_dump_json()


def spec_from_json(text: str, *, source: str = "stored job spec") -> JobSpec:
    """Read back what :func:`spec_to_json` wrote; the result equals the original.

    Raises :class:`JobSpecError` when ``text`` is not a valid spec (for
    instance one stored by a version with other rules). The bounds of
    :mod:`spotd.core.limits` are not checked again: a job stored before them
    is still read, as it was submitted.
    """
    try:
        return JobSpec.model_validate_json(text, context={_CTX_STORED: True})
    except ValidationError as exc:
        problems = [_problem(error, None) for error in exc.errors(include_url=False)]
        raise JobSpecError(source, problems) from None


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


def passed_deadline(spec: JobSpec, now: datetime) -> str | None:
    """What is wrong with a ``deadline.finish_by`` that is not after ``now``; None if
    there is none or it is ahead. For a new job only: a stored job whose deadline
    has passed is still a valid spec (it is read again after a restart)."""
    finish_by = spec.deadline.finish_by if spec.deadline is not None else None
    if finish_by is None or finish_by > now:
        return None
    ago = _round_duration(now - finish_by)
    return (
        f"deadline.finish_by: {finish_by:%Y-%m-%dT%H:%M:%SZ} has passed ({ago} before now, "
        f"{now.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ} on the daemon's clock): give a time ahead, "
        "or leave finish_by out"
    )


def _round_duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (seconds, "s")]
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0 s"


# --------------------------------------------------------------------------
# Error messages
# --------------------------------------------------------------------------


def _toml_syntax_problem(exc: tomllib.TOMLDecodeError) -> str:
    message = str(exc)
    # tomllib in 3.11 has no lineno/colno attributes; the position is only in the text.
    pos = _TOML_POS_RE.search(message)
    if pos is None:
        return f"invalid TOML: {message}"
    detail = message[: pos.start()]
    if pos.group(1) is None:
        return f"end of file: invalid TOML: {detail}"
    return f"line {pos.group(1)}, column {pos.group(2)}: invalid TOML: {detail}"


def _fsspec_protocols() -> frozenset[str]:
    # Imported late: fsspec is only needed when a spec names a protocol.
    import fsspec

    return frozenset(str(p).lower() for p in fsspec.available_protocols())


_TYPE_NAMES: dict[type, str] = {
    bool: "boolean",
    int: "integer",
    float: "float",
    str: "string",
    list: "array",
    tuple: "array",
    dict: "table",
    datetime: "date-time",
    date: "date",
    time: "time",
}


def _describe(value: object) -> str:
    """A short description of a TOML value for an error: its type, and the value if small."""
    kind = next((name for cls, name in _TYPE_NAMES.items() if type(value) is cls), None)
    if kind is None:
        return type(value).__name__
    if isinstance(value, list | tuple | dict):
        # Never repr a container: it may be huge or nested deeper than repr can go.
        return f"empty {kind}" if not value else kind
    if isinstance(value, bool):
        return f"boolean {'true' if value else 'false'}"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{kind} {value!r}" if math.isfinite(value) else f"{kind} {value}"
    if isinstance(value, date | time):
        return f"{kind} {value.isoformat()}"
    if isinstance(value, int):
        return f"{kind} {_integer(value)}"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{kind} {text}"


def _integer(value: int) -> str:
    # Python will not write an int of over 4300 digits, and no one reads one of 40.
    return str(value) if abs(value) < 10**40 else "(a huge number)"


def _number(value: object) -> str:
    """A number for a bound's message: ``4096``, ``0.5``, ``1e+308``."""
    if isinstance(value, int):
        return _integer(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


def _bare(key: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9_-]+", key) is not None


def _dotted(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = part if _bare(part) else _quote(part)
        out += f".{text}" if out else text
    return out or "(top level)"


def _quote(key: str) -> str:
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(ch if ch.isprintable() else _escape_char(ch) for ch in escaped)
    return f'"{escaped}"'


def _escape_char(ch: str) -> str:
    code = ord(ch)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _model_at(keys: Sequence[str]) -> type[BaseModel] | None:
    """The model class found by following ``keys`` down from :class:`JobSpec`."""
    model: type[BaseModel] = JobSpec
    for key in keys:
        field = model.model_fields.get(key)
        if field is None:
            return None
        found = next(
            (
                t
                for t in (field.annotation, *get_args(field.annotation))
                if isinstance(t, type) and issubclass(t, BaseModel)
            ),
            None,
        )
        if found is None:
            return None
        model = found
    return model


_EXPECTED: dict[str, str] = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "finite_number": "expected a finite number",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "tuple_type": "expected an array",
    "list_type": "expected an array",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "datetime_type": "expected an offset date-time like 2026-12-24T00:00:00Z",
    "datetime_parsing": "expected an offset date-time like 2026-12-24T00:00:00Z",
    "datetime_from_date_parsing": "expected an offset date-time like 2026-12-24T00:00:00Z",
}
"""pydantic error types that mean "wrong type", and what to say was expected."""

_BOUNDS: dict[str, tuple[str, str]] = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def _message(error: Mapping[str, Any]) -> str:
    """What was expected, in words, for one pydantic error."""
    kind: str = error["type"]
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    got = _describe(error.get("input"))
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind in _EXPECTED:
        return f"{_EXPECTED[kind]}, got {got}"
    if kind in _BOUNDS:
        key, op = _BOUNDS[kind]
        return f"must be {op} {_number(ctx.get(key))}, got {_number(error.get('input'))}"
    if kind == "enum":
        return f"expected one of {ctx.get('expected')}, got {got}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}, got {got}"
    if kind == "too_short":
        return "must not be empty"
    msg = str(error["msg"])
    return msg[:1].lower() + msg[1:]


def _problem(error: Mapping[str, Any], locator: KeyLines | None) -> str:
    """One line of a :class:`JobSpecError`: path, line, and what was expected."""
    # "[key]" marks an error in a dict key; the key itself is already in loc.
    loc = [part for part in error["loc"] if part != "[key]"]
    keys = [part for part in loc if isinstance(part, str)]
    path = _dotted(loc)
    kind = error["type"]
    if kind == "missing":
        parent = keys[:-1]
        where = ""
        if parent:
            line = locator.line_of(parent) if locator else None
            table = f"[{_dotted(parent)}]"
            where = f" (table {table} at line {line})" if line else f" (table {table})"
        return f"{path}: field required{where}"
    message = _message(error)
    if kind == "extra_forbidden":
        model = _model_at(keys[:-1])
        message = "unknown field"
        if model is not None:
            message += f"; expected one of {', '.join(model.model_fields)}"
    line = locator.line_of(keys) if locator else None
    return f"{path} (line {line}): {message}" if line else f"{path}: {message}"
