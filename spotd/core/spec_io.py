"""Reading a job spec in: from a job file's TOML, from the JSON the store keeps, and
the checks a spec from outside passes before it is stored.

:func:`load_job_file` and :func:`parse_job_toml` turn TOML into a frozen
:class:`~spotd.core.spec.JobSpec` or raise :class:`~spotd.core.errors.JobSpecError`
with one line per problem, each naming the dotted field path, the line of the file
where the key is, and what was expected::

    jobs/llama.toml: invalid job spec
      - resources.gpus_per_node (line 7): must be >= 1, got -2
      - resources.colour (line 9): unknown field; expected one of gpus, ...

Nothing else escapes them, whatever the input text. :func:`spec_to_json` and
:func:`spec_from_json` are the round trip the store uses.
"""

from __future__ import annotations

import sys
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import ValidationError

from spotd.core.errors import JobSpecError
from spotd.core.spec import JobSpec
from spotd.core.spec_errors import problem, toml_syntax_problem
from spotd.core.spec_fields import CTX_BASE_DIR, CTX_FROM_TOML, CTX_STORED, is_plain_path
from spotd.core.toml_lines import KeyLines

__all__ = [
    "load_job_file",
    "parse_job_toml",
    "passed_deadline",
    "relative_paths",
    "spec_from_json",
    "spec_to_json",
]


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
        raise JobSpecError(source, [toml_syntax_problem(exc, text)]) from None
    except ValueError:
        # Not a TOMLDecodeError: Python's own limit on reading an integer's digits.
        limit = sys.get_int_max_str_digits()
        raise JobSpecError(source, [f"invalid TOML: an integer of over {limit} digits"]) from None
    except RecursionError:
        raise JobSpecError(source, ["invalid TOML: arrays or tables nested too deeply"]) from None
    context = {CTX_BASE_DIR: Path(base_dir).absolute(), CTX_FROM_TOML: True}
    try:
        return JobSpec.model_validate(data, context=context)
    except ValidationError as exc:
        locator = KeyLines(text)
        problems = [problem(error, locator, JobSpec) for error in exc.errors(include_url=False)]
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
        return JobSpec.model_validate_json(text, context={CTX_STORED: True})
    except ValidationError as exc:
        problems = [problem(error, None, JobSpec) for error in exc.errors(include_url=False)]
        raise JobSpecError(source, problems) from None


def relative_paths(spec: JobSpec) -> list[tuple[str, str]]:
    """The (field, value) pairs of ``spec`` that are relative paths: ``workdir``, and a
    ``checkpoint.uri`` that is a path without a scheme. A spec parsed from a file has
    none (they resolve against its folder); one sent as JSON may, and only the sender
    knows what they were relative to."""
    found = []
    if spec.workdir is not None and not Path(spec.workdir).is_absolute():
        found.append(("workdir", spec.workdir))
    uri = spec.checkpoint.uri
    if uri is not None and is_plain_path(uri) and not Path(uri).is_absolute():
        found.append(("checkpoint.uri", uri))
    return found


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
