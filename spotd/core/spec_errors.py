"""A job spec's problems in words: each pydantic error as one line of a
:class:`~spotd.core.errors.JobSpecError`, naming the dotted field path, the line of
the job file where the key is, and what was expected::

    resources.gpus_per_node (line 7): must be >= 1, got -2

:func:`describe` and :func:`number` are also how the spec's own validators put a
value in a message, so every problem reads alike.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from datetime import date, datetime, time
from typing import Any, get_args

from pydantic import BaseModel

from spotd.core.toml_lines import KeyLines

__all__ = ["closest", "describe", "number", "problem", "toml_syntax_problem"]

_TOML_POS_RE = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\s*$")


def toml_syntax_problem(exc: tomllib.TOMLDecodeError, text: str | None = None) -> str:
    """tomllib's complaint as one problem line, its position put first; at the end of
    the file (an array or string left open), the last line of ``text`` that has any."""
    message = str(exc)
    # tomllib in 3.11 has no lineno/colno attributes; the position is only in the text.
    pos = _TOML_POS_RE.search(message)
    if pos is None:
        return f"invalid TOML: {message}"
    detail = message[: pos.start()]
    if pos.group(1) is None:
        content = (text or "").rstrip()
        if not content:
            return f"end of file: invalid TOML: {detail}"
        # The last line with text, not the empty one after the final newline.
        last = content.count("\n") + 1
        return f"line {last} (end of file): invalid TOML: {detail}"
    return f"line {pos.group(1)}, column {pos.group(2)}: invalid TOML: {detail}"


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


def describe(value: object) -> str:
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


def number(value: object) -> str:
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


def _model_at(root: type[BaseModel], keys: Sequence[str]) -> type[BaseModel] | None:
    """The model class found by following ``keys`` down from ``root``."""
    model = root
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
    got = describe(error.get("input"))
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind in _EXPECTED:
        return f"{_EXPECTED[kind]}, got {got}"
    if kind in _BOUNDS:
        key, op = _BOUNDS[kind]
        return f"must be {op} {number(ctx.get(key))}, got {number(error.get('input'))}"
    if kind == "enum":
        return f"expected one of {ctx.get('expected')}, got {got}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}, got {got}"
    if kind == "too_short":
        return "must not be empty"
    msg = str(error["msg"])
    return msg[:1].lower() + msg[1:]


def closest(name: str, known: Sequence[str]) -> str | None:
    """The one of ``known`` that ``name`` most likely misspells (``gpu`` for ``gpus``,
    ``max_restart`` for ``max_restarts_on_errors``), by :mod:`difflib`; None when none
    is close. Case and ``-`` for ``_`` count as no difference."""
    folded = {k.lower().replace("-", "_"): k for k in known}
    wanted = name.lower().replace("-", "_")
    if wanted in folded:
        return folded[wanted]
    found = difflib.get_close_matches(wanted, list(folded), n=1, cutoff=0.6)
    if not found:
        # A prefix: ``max_restarts`` of ``max_restarts_on_errors``.
        found = [k for k in folded if len(wanted) >= 4 and k.startswith(wanted)][:1]
    return folded[found[0]] if found else None


def problem(error: Mapping[str, Any], locator: KeyLines | None, root: type[BaseModel]) -> str:
    """One line of a :class:`~spotd.core.errors.JobSpecError`: path, line, and what was
    expected. ``locator`` finds the line (None for text that was not TOML); ``root`` is
    the model validated, whose fields an unknown key is told of."""
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
        model = _model_at(root, keys[:-1])
        message = "unknown field"
        if model is not None:
            known = list(model.model_fields)
            guess = closest(keys[-1], known) if keys else None
            fields = ", ".join(known)
            # The guess first: it is the fix, where the list is only the menu.
            message += f"; did you mean {guess}? (expected one of {fields})" if guess else (
                f"; expected one of {fields}"
            )
    line = locator.line_of(keys) if locator else None
    return f"{path} (line {line}): {message}" if line else f"{path}: {message}"
