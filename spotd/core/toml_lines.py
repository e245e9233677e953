"""Where a key is written in a TOML text, for error messages that name the line.

Not a TOML parser: :class:`KeyLines` lexes just enough to tell a header or a
``key = value`` line from the inside of a value, and lets :mod:`tomllib`
decode each key (:mod:`spotd.core.spec_io` uses it to put line numbers on problems).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["KeyLines"]


class KeyLines:
    """Finds the line where a dotted key path is written in a TOML text.

    Not a TOML parser: it lexes just enough (strings, comments, open arrays)
    to tell a ``[table]`` header or a ``key = value`` line from the inside of
    a value, and lets :mod:`tomllib` decode each key. It never raises; what it
    cannot make sense of it skips, and :meth:`line_of` then answers None.
    """

    def __init__(self, text: str) -> None:
        self._entries: list[tuple[int, tuple[str, ...]]] = list(self._scan(text))

    def line_of(self, keys: Sequence[str]) -> int | None:
        """1-based line of ``keys``, else of its longest prefix that is there, else None.

        A table is found at its header, or at the first key that defines it
        (``resources.gpus = ...``); a key inside an inline table at the line
        of the inline table.
        """
        wanted = tuple(keys)
        for size in range(len(wanted), 0, -1):
            prefix = wanted[:size]
            for line, path in self._entries:
                if path[:size] == prefix:
                    return line
        return None

    def _scan(self, text: str) -> Iterator[tuple[int, tuple[str, ...]]]:
        table: tuple[str, ...] = ()
        lexer = _ValueLexer()
        # TOML ends lines at \n only; str.splitlines() would also split at \f,
        # \x1c, \u2028 and so on and put every later line number off.
        for number, raw in enumerate(text.split("\n"), start=1):
            line = raw.removesuffix("\r")
            if not lexer.idle:
                lexer.feed(line)
                continue
            stripped = line.lstrip()
            if stripped.startswith("["):
                header = _decode_header(stripped)
                if header is not None:
                    table = header
                    yield number, header
                continue
            split = _key_end(stripped)
            if split is None:
                continue
            key = _decode_key(stripped[:split])
            if key is not None:
                yield number, table + key
            lexer.feed(stripped[split + 1 :])


class _ValueLexer:
    """Tracks, across lines, whether we are inside a multi-line string or an open array."""

    def __init__(self) -> None:
        self.depth = 0
        self.multiline: str | None = None  # the closing delimiter, '"""' or "'''"

    @property
    def idle(self) -> bool:
        return self.depth == 0 and self.multiline is None

    def feed(self, line: str) -> None:
        i, n = 0, len(line)
        while i < n:
            if self.multiline is not None:
                i = self._close_multiline(line, i)
                continue
            ch = line[i]
            if ch == "#":
                return
            if line.startswith('"""', i) or line.startswith("'''", i):
                self.multiline = line[i : i + 3]
                i += 3
            elif ch == '"':
                i = _skip_basic(line, i + 1)
            elif ch == "'":
                end = line.find("'", i + 1)
                i = n if end < 0 else end + 1
            elif ch in "[{":
                self.depth += 1
                i += 1
            elif ch in "]}":
                self.depth = max(0, self.depth - 1)
                i += 1
            else:
                i += 1

    def _close_multiline(self, line: str, i: int) -> int:
        delimiter = self.multiline or '"""'
        n = len(line)
        while i < n:
            if delimiter == '"""' and line[i] == "\\":
                i += 2
                continue
            if line.startswith(delimiter, i):
                self.multiline = None
                i += 3
                # Up to two more quotes may close the string: they belong to it.
                while i < n and line[i] == delimiter[0]:
                    i += 1
                return i
            i += 1
        return n


def _skip_basic(line: str, i: int) -> int:
    """Index just after the basic string that starts at ``i`` (after its quote)."""
    n = len(line)
    while i < n:
        if line[i] == "\\":
            i += 2
        elif line[i] == '"':
            return i + 1
        else:
            i += 1
    return n


def _key_end(line: str) -> int | None:
    """Index of the ``=`` that ends the key at the start of ``line``, if any."""
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if ch == "=":
            return i
        if ch == "#":
            return None
        if ch == '"':
            i = _skip_basic(line, i + 1)
        elif ch == "'":
            end = line.find("'", i + 1)
            if end < 0:
                return None
            i = end + 1
        else:
            i += 1
    return None


def _single_path(data: object) -> tuple[str, ...] | None:
    """The one key path through a parsed ``a.b.c = 0`` or ``[a.b]`` document."""
    keys: list[str] = []
    while True:
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
            continue
        if isinstance(data, dict) and len(data) == 1:
            key, data = next(iter(data.items()))
            keys.append(str(key))
            continue
        break
    return tuple(keys) or None


def _toml_or_none(text: str) -> dict[str, Any] | None:
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):
        return None


def _decode_key(text: str) -> tuple[str, ...] | None:
    if "\n" in text or "\r" in text:
        return None
    return _single_path(_toml_or_none(f"{text}= 0"))


def _decode_header(line: str) -> tuple[str, ...] | None:
    return _single_path(_toml_or_none(line))
