"""The field types of a job spec and the checks they share: bounds, durations, paths.

The models of :mod:`spotd.core.spec` are built from these. Every bound (the figures
and why: :mod:`spotd.core.limits`) applies to a spec submitted, and none to one read
back from the store (:data:`CTX_STORED`): the bounds may be newer than the spec.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated

from annotated_types import Gt
from pydantic import (
    AfterValidator,
    AllowInfNan,
    BeforeValidator,
    Field,
    PlainSerializer,
    Strict,
    ValidationInfo,
)

from spotd.core.limits import (
    MAX_ARG_BYTES,
    MAX_DURATION,
    MAX_EMAIL_CHARS,
    MAX_ENV_BYTES,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_VARS,
    MAX_FABRIC_ENV_BYTES,
    MAX_GPU_NAME_CHARS,
    MAX_IMAGE_CHARS,
    MAX_PATH_BYTES,
    MAX_PATTERN_CHARS,
)
from spotd.core.spec_errors import describe, number

__all__ = [
    "CTX_BASE_DIR",
    "CTX_FROM_TOML",
    "CTX_STORED",
    "Arg",
    "Duration",
    "Email",
    "EnvName",
    "EnvTable",
    "FabricEnvTable",
    "Glob",
    "GpuName",
    "Image",
    "PositiveFloat",
    "SetupLine",
    "Sha256",
    "absolute",
    "at_least",
    "at_most",
    "at_most_bytes",
    "at_most_chars",
    "at_most_items",
    "checkpoint_location",
    "is_plain_path",
    "no_nul",
    "non_empty_str",
    "parse_duration",
    "path_at_most",
    "submitted",
    "utf8_bytes",
    "whole_seconds",
]

_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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

# Context keys passed to model validation by the TOML path only: the store
# path has absolute paths already and never resolves anything.
CTX_BASE_DIR = "base_dir"
CTX_FROM_TOML = "from_toml"
# Passed by spec_from_json only: a spec the store kept is read whatever its size. The
# bounds of spotd.core.limits may be newer than it, and one stored spec that no longer
# reads would stop every read of the jobs beside it (a listing, a reconcile pass).
CTX_STORED = "stored"


# --------------------------------------------------------------------------
# Small validators shared by the models
# --------------------------------------------------------------------------


def no_nul(value: str) -> str:
    """``value``, if it holds no NUL character."""
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


def non_empty_str(value: str) -> str:
    """``value``, if it is more than spaces."""
    if value.strip() == "":
        raise ValueError("must not be empty")
    return value


# --------------------------------------------------------------------------
# Bounds (the figures and why: spotd.core.limits)
# --------------------------------------------------------------------------


def submitted(info: ValidationInfo) -> bool:
    """Whether the bounds of :mod:`spotd.core.limits` apply: to every spec but one read
    back from the store (see ``CTX_STORED``)."""
    return not (isinstance(info.context, Mapping) and info.context.get(CTX_STORED))


def utf8_bytes(value: str) -> int:
    """The size of ``value`` in UTF-8."""
    # surrogatepass: a JSON body may carry a lone surrogate; it is counted, not a crash.
    return len(value.encode("utf-8", "surrogatepass"))


def _env_bytes(env: Mapping[str, str]) -> int:
    """What ``env`` weighs in an exec: each ``NAME=value`` with its NUL."""
    return sum(len(name) + utf8_bytes(value) + 2 for name, value in env.items())


def at_most(bound: float) -> AfterValidator:
    """At most ``bound``, said as pydantic's own ``le`` is (``must be <= 4096, got ...``)."""

    def check(value: float, info: ValidationInfo) -> float:
        if value > bound and submitted(info):
            raise ValueError(f"must be <= {number(bound)}, got {number(value)}")
        return value

    return AfterValidator(check)


def at_least(bound: float) -> AfterValidator:
    """At least ``bound``, said as pydantic's own ``ge`` is (``must be >= 1e-06, got ...``)."""

    def check(value: float, info: ValidationInfo) -> float:
        if value < bound and submitted(info):
            raise ValueError(f"must be >= {number(bound)}, got {number(value)}")
        return value

    return AfterValidator(check)


def at_most_chars(bound: int) -> AfterValidator:
    """A string of at most ``bound`` characters: names, which are ASCII."""

    def check(value: str, info: ValidationInfo) -> str:
        if len(value) > bound and submitted(info):
            raise ValueError(f"must be at most {bound} characters, got {len(value)}")
        return value

    return AfterValidator(check)


def at_most_bytes(bound: int) -> AfterValidator:
    """A string of at most ``bound`` bytes of UTF-8: what exec and the kernel count."""

    def check(value: str, info: ValidationInfo) -> str:
        size = utf8_bytes(value)
        if size > bound and submitted(info):
            raise ValueError(f"must be at most {bound} bytes (UTF-8), got {size}")
        return value

    return AfterValidator(check)


def at_most_items(bound: int, items: str) -> BeforeValidator:
    """An array or table of at most ``bound`` items, counted before any item is
    checked: a million bad items would otherwise be a million problems."""

    def check(value: object, info: ValidationInfo) -> object:
        if isinstance(value, list | tuple | dict) and len(value) > bound and submitted(info):
            raise ValueError(f"must have at most {bound} {items}, got {len(value)}")
        return value

    return BeforeValidator(check)


def path_at_most(path: str, info: ValidationInfo, *, written: str | None = None) -> str:
    """``path`` if within the bound of a path. ``written``: what the spec said, when
    ``path`` is that made absolute (the bound is on what the nodes are given)."""
    size = utf8_bytes(path)
    if size > MAX_PATH_BYTES and submitted(info):
        made = " once made absolute" if written is not None and written != path else ""
        raise ValueError(f"must be at most {MAX_PATH_BYTES} bytes (UTF-8), got {size}{made}")
    return path


def _env_at_most(bound: int) -> AfterValidator:
    """Variables that weigh at most ``bound`` bytes in an exec (:func:`_env_bytes`)."""

    def check(value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        size = _env_bytes(value)
        if size > bound and submitted(info):
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
        raise ValueError(f"expected 64 lowercase hex digits, got {describe(value)}")
    return value


def _check_image(value: str) -> str:
    no_nul(value)
    if not _IMAGE_RE.fullmatch(value):
        raise ValueError(
            "expected an image reference like 'nvcr.io/nvidia/pytorch:24.05-py3' or "
            f"'ghcr.io/org/train@sha256:...', got {describe(value)}"
        )
    return value


def _check_setup_line(value: str) -> str:
    no_nul(value)
    if not value.strip():
        raise ValueError("a setup line must not be empty")
    return value


EnvName = Annotated[
    str, Strict(), at_most_chars(MAX_ENV_NAME_CHARS), AfterValidator(_check_env_name)
]
EnvValue = Annotated[str, Strict(), AfterValidator(no_nul), at_most_bytes(MAX_ARG_BYTES)]
EnvTable = Annotated[
    dict[EnvName, EnvValue],
    at_most_items(MAX_ENV_VARS, "variables"),
    _env_at_most(MAX_ENV_BYTES),
]
FabricEnvTable = Annotated[
    dict[EnvName, EnvValue],
    at_most_items(MAX_ENV_VARS, "variables"),
    _env_at_most(MAX_FABRIC_ENV_BYTES),
]
Arg = Annotated[str, Strict(), at_most_bytes(MAX_ARG_BYTES)]
"""One string a node execs: an item of ``command``, a ``setup`` line."""
Email = Annotated[str, Strict(), at_most_chars(MAX_EMAIL_CHARS), AfterValidator(_check_email)]
Glob = Annotated[str, Strict(), at_most_chars(MAX_PATTERN_CHARS), AfterValidator(_check_glob)]
GpuName = Annotated[str, Strict(), at_most_chars(MAX_GPU_NAME_CHARS)]
Priority = Annotated[int, Strict(), Field(ge=-1_000_000, le=1_000_000)]
"""A job's priority (higher is placed first): the spec's, and ``spotd priority``'s."""
Image = Annotated[str, Strict(), at_most_chars(MAX_IMAGE_CHARS), AfterValidator(_check_image)]
SetupLine = Annotated[Arg, AfterValidator(_check_setup_line)]
Sha256 = Annotated[str, Strict(), AfterValidator(_check_sha256)]


def parse_duration(value: object, *, auto: bool = False, bounded: bool = True) -> timedelta:
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
            f"seconds, got {describe(value)}"
        )
    if isinstance(value, int):
        seconds = value
    else:
        match = _DURATION_RE.fullmatch(value.strip())
        if value.strip() == "" or match is None:
            raise ValueError(
                f'expected {either}a duration like "90s", "15m", "1h30m" or "2h", '
                f"got {describe(value)}"
            )
        hours, minutes, secs = (int(g) if g else 0 for g in match.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds <= 0:
        raise ValueError(f"must be > 0 seconds, got {describe(value)}")
    if bounded and seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"{_LONGEST}, got {describe(value)}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"is too long, got {describe(value)}") from None


_LONGEST = (
    f"must be at most {MAX_DURATION.days} days "
    f'("{MAX_DURATION.days * 24}h" or {MAX_DURATION.days * 86400} seconds)'
)
"""How :func:`parse_duration` says a duration is over the bound, before what it got."""


def _duration(value: object, info: ValidationInfo) -> timedelta:
    return parse_duration(value, bounded=submitted(info))


def absolute(value: str, info: ValidationInfo) -> str:
    """``value`` made absolute against the job file's folder, when parsing a file."""
    context = info.context if isinstance(info.context, Mapping) else {}
    base = context.get(CTX_BASE_DIR)
    if not isinstance(base, Path):
        return value
    path = Path(value)
    if not path.is_absolute():
        path = base / path
    # normpath, not resolve(): the folder may not exist here (it may only exist
    # on the node), and a lexical "a/../b" -> "b" is all that is wanted.
    return os.path.normpath(path)


def whole_seconds(value: timedelta) -> int:
    """``value`` in seconds, as a duration is written back."""
    # Whole seconds (the parser enforces it), which TOML and the parser read back.
    return value.days * 86400 + value.seconds


Duration = Annotated[
    timedelta,
    BeforeValidator(_duration),
    PlainSerializer(whole_seconds, return_type=int, when_used="json"),
]
"""A duration written as ``checkpoint.interval`` is (``"90s"``, ``"1h30m"``, seconds)."""


def checkpoint_location(value: str, info: ValidationInfo) -> str:
    """``value`` if it is a ``checkpoint.uri``: an fsspec URI or chain of protocols fsspec
    knows, or a path, which is made absolute (:func:`absolute`)."""
    non_empty_str(value)
    no_nul(value)
    # Before the protocols are looked for: an endless text is not read through.
    path_at_most(value, info)
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
        return path_at_most(absolute(value, info), info, written=value)
    return value


def is_plain_path(uri: str) -> bool:
    """Whether ``uri`` is a path: no scheme, and no fsspec chain."""
    return "::" not in uri and not _SCHEME_RE.match(uri)


def _fsspec_protocols() -> frozenset[str]:
    # Imported late: fsspec is only needed when a spec names a protocol.
    import fsspec

    return frozenset(str(p).lower() for p in fsspec.available_protocols())
