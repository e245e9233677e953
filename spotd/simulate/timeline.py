"""Trace files of a scenario on one shared timeline, optionally resampled to a coarser tick.

Traces are read with :func:`spotd_sim.trace.load_trace` (the one
validated loader); this module finds them, checks they share a timeline and
turns them into a numpy array of available nodes per (offering, tick).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from spotd.core.errors import SpotdError
from spotd.simulate.scenario import Scenario
from spotd_sim.trace import TraceError, load_trace

__all__ = ["TRACES_ENV", "Timeline", "TraceMissingError", "build_timeline", "resample"]

TRACES_ENV = "SPOTD_TRACES"
"""Environment variable naming the traces root (like ``--traces``)."""

_HOW_TO_GET = (
    "The traces are the public spot availability traces of Wu et al., \"Can't Be Late: "
    'Optimizing Spot Instance Savings under Deadlines" (NSDI 2024), in the GitHub '
    "repository skypilot-org/spot-traces: clone it and pass its folder with --traces DIR "
    f"(or set {TRACES_ENV}), keeping one folder per trace set as the scenario names them."
)

IntArray = npt.NDArray[np.int64]


class TraceMissingError(SpotdError):
    """A trace file of a scenario is not where it was looked for."""

    bad_input = True


@dataclass(frozen=True, slots=True)
class Timeline:
    """Available spot nodes per offering and tick, all on one clock.

    ``values[z, i]`` is the value of offering ``z`` in tick ``i``;
    ``tick_hours`` the length of a tick.
    """

    values: IntArray
    tick_hours: float
    paths: tuple[Path, ...]

    @property
    def ticks(self) -> int:
        """Number of ticks every offering has."""
        return int(self.values.shape[1])


def resample(values: IntArray, gap_seconds: float, tick_seconds: float) -> IntArray:
    """Values per coarser tick: the minimum of the samples taken in the tick.

    Sample ``i`` is a probe at ``i * gap_seconds``; a coarse tick counts as
    available for n nodes only if every probe taken in it saw at least n, as
    the reference setting asks. Only whole coarse ticks are kept. Ticks must
    not be finer than the samples (every coarse tick then holds a probe).
    """
    if tick_seconds < gap_seconds:
        raise ValueError(f"tick {tick_seconds:g} s is finer than the trace's {gap_seconds:g} s")
    # Whole milliseconds keep the tick borders exact (195 s vs 360 s never meet in floats).
    gap_ms, tick_ms = round(gap_seconds * 1000), round(tick_seconds * 1000)
    if gap_ms == tick_ms:
        return values.copy()
    n = (len(values) * gap_ms) // tick_ms
    owner = (np.arange(len(values), dtype=np.int64) * gap_ms) // tick_ms
    kept = owner < n
    firsts = np.searchsorted(owner, np.arange(n, dtype=np.int64))
    return np.minimum.reduceat(values[kept], firsts).astype(np.int64)


def _roots(scenario_file: Path, scenario: Scenario, traces: Path | None) -> list[Path]:
    if traces is not None:
        return [traces]
    env = os.environ.get(TRACES_ENV)
    if env:
        return [Path(env)]
    base = scenario_file.absolute().parent
    if scenario.traces_root is not None:
        return [Path(os.path.normpath(base / scenario.traces_root))]
    return [base]


def resolve_trace(name: str, scenario_file: Path, scenario: Scenario, traces: Path | None) -> Path:
    """Where the trace ``name`` of a scenario is, or :class:`TraceMissingError`."""
    path = Path(name)
    candidates = [path] if path.is_absolute() else [r / path for r in _roots(
        scenario_file, scenario, traces)]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    raise TraceMissingError(
        f"{scenario_file}: trace file {name!r} not found (looked at {looked}). {_HOW_TO_GET}"
    )


def build_timeline(scenario_file: Path, scenario: Scenario, traces: Path | None) -> Timeline:
    """Load every offering's trace, check they share a tick, resample, cut to one length."""
    loaded = []
    for entry in scenario.offerings:
        loaded.append(load_trace(resolve_trace(entry.trace, scenario_file, scenario, traces)))
    gaps = {t.gap_seconds for t in loaded}
    if len(gaps) > 1:
        detail = ", ".join(f"{t.path}: {t.gap_seconds:g} s" for t in loaded)
        raise TraceError(
            loaded[0].path,
            f"traces of one scenario must share a timeline, but their ticks differ ({detail})",
        )
    gap = loaded[0].gap_seconds
    tick = scenario.tick_seconds or gap
    try:
        rows = [resample(np.asarray(t.values, dtype=np.int64), gap, tick) for t in loaded]
    except ValueError as exc:
        raise TraceError(loaded[0].path, f"cannot resample: {exc}") from None
    # Files of one folder share their start; a shorter one just ended earlier.
    length = min(len(r) for r in rows)
    values = np.stack([r[:length] for r in rows])
    return Timeline(values=values, tick_hours=tick / 3600.0, paths=tuple(t.path for t in loaded))
