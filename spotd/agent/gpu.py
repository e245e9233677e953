"""GPU sampling on the node: NVML where a driver answers, a recorded session elsewhere.

:func:`open_gpu_source` picks the source from the environment:

1. ``SPOTD_AGENT_NVML_RECORD`` names a recorded session (below): a
   :class:`RecordedSource` replays it. Tests and the simulated market take this
   path, as no GPU exists there.
2. Else NVML (``pynvml``, from the ``nvidia-ml-py`` package) if the library
   imports, ``nvmlInit`` succeeds and it counts at least one GPU.
3. Else None: no driver, nothing to sample. This is not an error.

Recorded session format (JSON)::

    {
      "gpus": ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"],
      "samples": [
        [{"util_pct": 12.0, "mem_used_gb": 3.1, "mem_total_gb": 80.0},
         {"util_pct": 10.0, "mem_used_gb": 3.0, "mem_total_gb": 80.0}],
        [{"util_pct": 97.0, "mem_used_gb": 61.2, "mem_total_gb": 80.0},
         {"util_pct": 64.0, "mem_used_gb": 60.8, "mem_total_gb": 80.0}]
      ],
      "after_last": "hold"
    }

``gpus`` names the GPUs in index order (NVML's ``nvmlDeviceGetName``); each
entry of ``samples`` is one moment, with one reading per GPU in the same order
(``mem_used_gb`` and ``mem_total_gb`` default to 0). Every call of
:meth:`RecordedSource.sample` returns the next moment; past the last one,
``after_last`` says whether to ``"hold"`` it (the default) or ``"cycle"`` back to
the first. ``samples`` may be empty: the GPUs are then reported idle with no memory
figures. GB here are GiB (2**30 bytes), as in the offerings' ``gpu_memory_gb``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spotd.core.agent_wire import GPU_UTIL_THRESHOLD_PCT, GpuReading
from spotd.core.errors import ConfigError

__all__ = [
    "RECORD_VARIABLE",
    "UTIL_THRESHOLD_PCT",
    "GpuSource",
    "NvmlSource",
    "NvmlUnavailable",
    "RecordedSource",
    "open_gpu_source",
    "underused",
]

log = logging.getLogger(__name__)

RECORD_VARIABLE = "SPOTD_AGENT_NVML_RECORD"
"""Environment variable naming a recorded NVML session to replay instead of NVML."""

UTIL_THRESHOLD_PCT = GPU_UTIL_THRESHOLD_PCT
"""A GPU under this utilisation while the job runs is waiting on something, most
often the data pipeline (the daemon's figure, one definition for both sides)."""

BYTES_PER_GB = 2**30
"""NVML counts bytes; spotd's GPU memory figures are GiB, like the offerings'."""


class GpuSource(Protocol):
    """Where the agent reads its node's GPUs from."""

    def sample(self) -> list[GpuReading]:
        """One reading per GPU, in index order, taken now."""
        ...

    def close(self) -> None:
        """Release the source; :meth:`sample` is not called after this."""
        ...


def underused(
    readings: list[GpuReading], threshold_pct: float = UTIL_THRESHOLD_PCT
) -> list[GpuReading]:
    """The readings whose utilisation is under ``threshold_pct``."""
    return [r for r in readings if r.util_pct < threshold_pct]


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node: no library, no driver, or no GPU."""


class NvmlSource:
    """The node's GPUs through NVML (``pynvml``).

    The constructor initialises NVML and raises :class:`NvmlUnavailable` if the
    library is missing, no driver answers or it counts no GPU.
    """

    def __init__(self) -> None:
        self._nvml = _import_pynvml()
        try:
            self._nvml.nvmlInit()
        except Exception as exc:  # pynvml.NVMLError and its per-code subclasses
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from exc
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            # Names do not change while the driver runs: read them once.
            self._names = [_text(self._nvml.nvmlDeviceGetName(h)) for h in self._handles]
        except Exception as exc:
            self.close()
            raise NvmlUnavailable(f"NVML could not list the GPUs: {exc}") from exc
        if not self._handles:
            self.close()
            raise NvmlUnavailable("NVML counts no GPU")

    def sample(self) -> list[GpuReading]:
        """Utilisation and memory of every GPU now. NVML errors propagate."""
        return [self._read(i, h) for i, h in enumerate(self._handles)]

    def _read(self, index: int, handle: Any) -> GpuReading:
        util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
        mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
        return GpuReading(
            index=index,
            name=self._names[index],
            util_pct=float(util.gpu),
            mem_used_gb=int(mem.used) / BYTES_PER_GB,
            mem_total_gb=int(mem.total) / BYTES_PER_GB,
        )

    def close(self) -> None:
        """Shut NVML down; errors are logged, not raised."""
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown failed: %s", exc)


def _import_pynvml() -> Any:
    # pynvml ships no type information: it stays behind this Any boundary.
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise NvmlUnavailable("pynvml (package nvidia-ml-py) is not installed") from exc


def _text(value: object) -> str:
    # pynvml returns bytes from older releases, str from newer ones.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class _RecordedReading(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    util_pct: float = Field(ge=0, le=100)
    mem_used_gb: float = Field(default=0.0, ge=0)
    mem_total_gb: float = Field(default=0.0, ge=0)


class _Recording(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: tuple[str, ...] = Field(min_length=1)
    samples: tuple[tuple[_RecordedReading, ...], ...] = ()
    after_last: Literal["hold", "cycle"] = "hold"

    @model_validator(mode="after")
    def _one_reading_per_gpu(self) -> _Recording:
        for i, moment in enumerate(self.samples):
            if len(moment) != len(self.gpus):
                raise ValueError(
                    f"samples[{i}] has {len(moment)} readings for {len(self.gpus)} GPUs"
                )
        return self


class RecordedSource:
    """Replays a recorded NVML session (the module docstring gives the format).

    Raises ConfigError naming ``path`` if the file cannot be read or is malformed.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._recording = _Recording.model_validate_json(self.path.read_bytes())
        except (OSError, ValidationError) as exc:
            raise ConfigError(
                f"{RECORD_VARIABLE}={self.path}: not a recorded session: {exc}"
            ) from exc
        self._next = 0
        self._lock = threading.Lock()  # the heartbeat and a preflight may sample at once

    @property
    def gpu_count(self) -> int:
        """How many GPUs the recording has."""
        return len(self._recording.gpus)

    def sample(self) -> list[GpuReading]:
        """The next recorded moment (held or cycled past the last, as the file says)."""
        rec = self._recording
        if not rec.samples:
            return [GpuReading(index=i, name=n, util_pct=0.0) for i, n in enumerate(rec.gpus)]
        with self._lock:
            moment = rec.samples[self._next]
            self._next = _advance(self._next, len(rec.samples), rec.after_last)
        return [
            GpuReading(index=i, name=name, **reading.model_dump())
            for i, (name, reading) in enumerate(zip(rec.gpus, moment, strict=True))
        ]

    def close(self) -> None:
        """Nothing to release."""


def _advance(current: int, count: int, after_last: Literal["hold", "cycle"]) -> int:
    if current + 1 < count:
        return current + 1
    return 0 if after_last == "cycle" else current


def open_gpu_source(environ: Mapping[str, str]) -> GpuSource | None:
    """The node's GPU source: a recording, NVML, or None when no driver answers.

    Never raises for a missing library or driver; a recording named in
    ``SPOTD_AGENT_NVML_RECORD`` that cannot be read raises ConfigError.
    """
    record = environ.get(RECORD_VARIABLE, "").strip()
    if record:
        return RecordedSource(record)
    try:
        return NvmlSource()
    except NvmlUnavailable as exc:
        log.info("no GPU sampling: %s", exc)
        return None
