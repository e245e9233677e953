"""Nothing reads the time except through a clock (:mod:`spotd.core.clock`).

Every shipped module that needs "now" or an interval is handed a
:class:`~spotd.core.contracts.Clock`; only the clock modules themselves call
``time.time``, ``time.monotonic``, ``datetime.now`` and the like. The check reads
the code's syntax trees, so an alias (``from time import monotonic as tick``,
``import datetime as dt``) is seen, and a bare reference counts as much as a call:
``default=time.monotonic`` reads the time behind the caller's back all the same.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("spotd", "providers", "policies")

CLOCK_MODULES = frozenset({
    "spotd/core/clock.py", "providers/spotd_sim/clock.py",
    # Runs in the job's interpreter without spotd: its main is its own clock.
    "spotd/agent/preflight_worker.py",
})  # fmt: skip
"""The only modules allowed to read the time."""

TIME_READERS = frozenset({
    "time.time", "time.time_ns", "time.monotonic", "time.monotonic_ns",
    "time.perf_counter", "time.perf_counter_ns",
    "datetime.datetime.now", "datetime.datetime.utcnow", "datetime.datetime.today",
    "datetime.date.today",
})  # fmt: skip
"""Fully qualified names of the functions that read a clock of the machine."""


def time_reads(source: str) -> list[tuple[int, str]]:
    """(line, qualified name) of every reference to a time reader in ``source``.

    Names are resolved through the file's imports, wherever they are (a function's
    own ``import time`` too); a name bound by several imports is taken as any of them.
    """
    tree = ast.parse(source)
    bound: defaultdict[str, set[str]] = defaultdict(set)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname is not None:
                    bound[alias.asname].add(alias.name)
                else:  # ``import a.b`` binds ``a``
                    top = alias.name.partition(".")[0]
                    bound[top].add(top)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name].add(f"{node.module}.{alias.name}")
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        for name in _qualified(node, bound):
            if name in TIME_READERS:
                found.append((node.lineno, name))
    return sorted(found)


def _qualified(node: ast.AST, bound: dict[str, set[str]]) -> set[str]:
    """What ``node`` (a name or a dotted attribute chain) may stand for; empty otherwise."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in bound:
        return set()
    rest = "".join(f".{p}" for p in reversed(parts))
    return {f"{target}{rest}" for target in bound[node.id]}


def _shipped() -> dict[str, Path]:
    return {
        path.relative_to(ROOT).as_posix(): path
        for root in SOURCE_ROOTS
        for path in sorted((ROOT / root).rglob("*.py"))
    }


def _readers() -> dict[str, list[tuple[int, str]]]:
    """Every shipped module outside the clock modules that reads the time."""
    readers = {}
    for name, path in _shipped().items():
        if name in CLOCK_MODULES:
            continue
        reads = time_reads(path.read_text(encoding="utf-8"))
        if reads:
            readers[name] = reads
    return readers


def test_only_the_clock_modules_read_the_time() -> None:
    lines = [f"{name}:{line}: {what}" for name, reads in sorted(_readers().items())
             for line, what in reads]  # fmt: skip
    assert not lines, (
        "these read the time behind their clock's back; take a Clock "
        "(spotd.core.clock: now() and monotonic()) instead:\n" + "\n".join(lines)
    )


def test_the_clock_modules_exist() -> None:
    assert all((ROOT / name).is_file() for name in CLOCK_MODULES)


def test_the_check_sees_calls_references_and_aliases() -> None:
    source = """
import time
import time as t
import datetime as dt
from datetime import UTC, date, datetime
from time import monotonic as tick, sleep

a = time.time()
b = t.perf_counter
c = dt.datetime.now(UTC)
d = datetime.utcnow()
e = date.today()
f = tick
g = datetime.fromtimestamp(0, UTC)
sleep(0)
"""
    assert {what for _, what in time_reads(source)} == {
        "time.time", "time.perf_counter", "datetime.datetime.now",
        "datetime.datetime.utcnow", "datetime.date.today", "time.monotonic",
    }  # fmt: skip
    assert [line for line, _ in time_reads(source)] == [8, 9, 10, 11, 12, 13]


def test_a_datetime_time_is_not_the_time_module() -> None:
    source = "from datetime import time\nnoon = time(12)\nx = time.max\n"
    assert time_reads(source) == []
