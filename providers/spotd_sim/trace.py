"""Spot availability traces in the shared format, and the errors they raise.

A trace file is ``{"metadata": {"gap_seconds": N}, "data": [ints...]}``:
``data[i]`` spot nodes are available from ``i * N`` seconds after the trace
starts until the next tick. Other keys (such as ``prices``) are ignored.
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass
from pathlib import Path

from spotd.core.errors import ProviderError


class TraceError(ProviderError, ValueError):
    """A trace file is missing or malformed; the message names file and problem."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"trace file {path}: {problem}", code="BadTrace")
        self.path = path


@dataclass(frozen=True, slots=True)
class Trace:
    """Available spot nodes per tick; past the last tick it starts over."""

    path: Path
    gap_seconds: float
    values: array[int]

    @property
    def gap_us(self) -> int:
        """Tick length in whole microseconds, so tick starts are exact datetimes."""
        return max(1, round(self.gap_seconds * 1_000_000))

    def tick(self, offset_us: int) -> int:
        """The (unwrapped) tick containing ``offset_us`` microseconds after the start."""
        return offset_us // self.gap_us

    def value_at_tick(self, tick: int) -> int:
        """Nodes available in ``tick``, wrapping around the end."""
        return self.values[tick % len(self.values)]

    def next_change_tick(self, tick: int, nodes: int) -> int | None:
        """First tick after ``tick`` where ``nodes`` flip availability; None if never."""
        now_up = self.value_at_tick(tick) >= nodes
        for later in range(tick + 1, tick + len(self.values) + 1):
            if (self.value_at_tick(later) >= nodes) != now_up:
                return later
        return None


def load_trace(path: Path) -> Trace:
    """Read and check one trace file; raise :class:`TraceError` on any problem."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TraceError(path, f"cannot be read ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(path, f"is not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise TraceError(path, "must hold a JSON object with 'metadata' and 'data'")
    return Trace(path, _gap_seconds(path, raw), _values(path, raw))


def _gap_seconds(path: Path, raw: dict[str, object]) -> float:
    meta = raw.get("metadata")
    if not isinstance(meta, dict) or "gap_seconds" not in meta:
        raise TraceError(path, "missing 'metadata.gap_seconds'")
    gap = meta["gap_seconds"]
    if isinstance(gap, bool) or not isinstance(gap, int | float):
        raise TraceError(path, f"'metadata.gap_seconds' must be a number, got {gap!r}")
    if not math.isfinite(gap) or gap <= 0:
        raise TraceError(path, f"'metadata.gap_seconds' must be positive, got {gap!r}")
    return float(gap)


def _values(path: Path, raw: dict[str, object]) -> array[int]:
    data = raw.get("data")
    if not isinstance(data, list):
        raise TraceError(path, "missing 'data' (a list of non-negative integers)")
    if not data:
        raise TraceError(path, "'data' is empty")
    for i, value in enumerate(data):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceError(path, f"'data[{i}]' must be an integer, got {value!r}")
        if value < 0:
            raise TraceError(path, f"'data[{i}]' must not be negative, got {value}")
    # array('q') keeps a 20k-tick trace compact and indexing fast.
    try:
        return array("q", data)
    except OverflowError as exc:
        raise TraceError(path, f"'data' holds a value out of range ({exc})") from exc
