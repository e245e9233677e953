"""GPU sampling: recorded sessions replayed, NVML absent here, NVML's figures converted."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spotd.agent.gpu import (
    RECORD_VARIABLE,
    UTIL_THRESHOLD_PCT,
    NvmlSource,
    NvmlUnavailable,
    RecordedSource,
    open_gpu_source,
    underused,
)
from spotd.core.agent_wire import GpuReading
from spotd.core.errors import ConfigError

A100 = "NVIDIA A100-SXM4-80GB"


def _reading(util: float, used: float = 10.0) -> dict[str, float]:
    return {"util_pct": util, "mem_used_gb": used, "mem_total_gb": 80.0}


def write_recording(tmp_path: Path, samples: list[list[dict[str, float]]], **extra: Any) -> Path:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"gpus": [A100, A100], "samples": samples, **extra}))
    return path


def _utils(source: RecordedSource) -> list[float]:
    return [r.util_pct for r in source.sample()]


def _nvml_driver_answers() -> bool:
    try:
        NvmlSource().close()
    except NvmlUnavailable:
        return False
    return True


def test_recording_replays_one_moment_per_call_then_holds_the_last(tmp_path: Path) -> None:
    path = write_recording(tmp_path, [[_reading(10), _reading(12)], [_reading(97), _reading(64)]])
    source = RecordedSource(path)
    first = source.sample()
    assert first == [
        GpuReading(index=0, name=A100, util_pct=10, mem_used_gb=10, mem_total_gb=80),
        GpuReading(index=1, name=A100, util_pct=12, mem_used_gb=10, mem_total_gb=80),
    ]
    assert _utils(source) == [97, 64]
    assert _utils(source) == [97, 64]
    assert source.gpu_count == 2
    source.close()


def test_recording_can_cycle(tmp_path: Path) -> None:
    path = write_recording(
        tmp_path, [[_reading(10), _reading(12)], [_reading(97), _reading(64)]], after_last="cycle"
    )
    source = RecordedSource(path)
    assert [_utils(source) for _ in range(3)] == [[10, 12], [97, 64], [10, 12]]


def test_recording_without_samples_reports_idle_gpus(tmp_path: Path) -> None:
    source = RecordedSource(write_recording(tmp_path, []))
    assert source.sample() == [
        GpuReading(index=0, name=A100, util_pct=0),
        GpuReading(index=1, name=A100, util_pct=0),
    ]


@pytest.mark.parametrize(
    "body",
    [
        {"gpus": [A100, A100], "samples": [[_reading(10)]]},  # one reading for two GPUs
        {"gpus": [], "samples": []},
        {"gpus": [A100], "samples": [[{"util_pct": 140}]]},
        {"gpus": [A100], "samples": [], "after_last": "rewind"},
    ],
    ids=["short-moment", "no-gpus", "util-over-100", "unknown-after-last"],
)
def test_malformed_recording_is_a_config_error(tmp_path: Path, body: dict[str, Any]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(body))
    with pytest.raises(ConfigError, match=RECORD_VARIABLE):
        RecordedSource(path)


def test_missing_recording_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.json"):
        open_gpu_source({RECORD_VARIABLE: str(tmp_path / "nope.json")})


def test_open_gpu_source_prefers_the_recording(tmp_path: Path) -> None:
    path = write_recording(tmp_path, [[_reading(50), _reading(90)]])
    source = open_gpu_source({RECORD_VARIABLE: str(path)})
    assert isinstance(source, RecordedSource)
    assert [r.index for r in underused(source.sample())] == [0]


def test_underused_uses_the_domain_threshold() -> None:
    readings = [
        GpuReading(index=0, util_pct=UTIL_THRESHOLD_PCT - 0.1),
        GpuReading(index=1, util_pct=UTIL_THRESHOLD_PCT),
    ]
    assert underused(readings) == readings[:1]
    assert underused(readings, threshold_pct=50) == []


@pytest.mark.skipif(_nvml_driver_answers(), reason="an NVIDIA driver answers on this machine")
def test_no_driver_means_no_source() -> None:
    # This machine has no GPU: with nvidia-ml-py installed nvmlInit fails
    # (library not found); without it the import fails. Either way: None, no raise.
    assert open_gpu_source({}) is None
    with pytest.raises(NvmlUnavailable):
        NvmlSource()


def test_missing_library_means_no_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py"):
        NvmlSource()
    assert open_gpu_source({RECORD_VARIABLE: "  "}) is None


@pytest.mark.skipif(not _nvml_driver_answers(), reason="no NVIDIA driver on this machine")
def test_real_nvml_samples_every_gpu() -> None:
    source = open_gpu_source({})
    assert isinstance(source, NvmlSource)
    try:
        readings = source.sample()
    finally:
        source.close()
    assert readings
    assert all(0 <= r.util_pct <= 100 and r.mem_total_gb > 0 for r in readings)


class _FakeNvml:
    """pynvml's public calls, as a driver with two 80 GiB GPUs would answer them."""

    def __init__(self, count: int = 2, *, init_error: Exception | None = None) -> None:
        self.count = count
        self.init_error = init_error
        self.shut_down = False

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"  # older pynvml releases return bytes

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=90 + handle, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=80 * 2**30, used=20 * 2**30, free=60 * 2**30)

    def nvmlShutdown(self) -> None:
        self.shut_down = True


def test_nvml_figures_become_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source = open_gpu_source({})
    assert isinstance(source, NvmlSource)
    assert source.sample() == [
        GpuReading(
            index=i, name="NVIDIA H100 80GB HBM3", util_pct=90 + i, mem_used_gb=20, mem_total_gb=80
        )
        for i in range(2)
    ]
    source.close()
    assert fake.shut_down


def test_nvml_with_no_gpu_or_failed_init_is_no_source(monkeypatch: pytest.MonkeyPatch) -> None:
    no_gpu = _FakeNvml(count=0)
    monkeypatch.setitem(sys.modules, "pynvml", no_gpu)
    assert open_gpu_source({}) is None
    assert no_gpu.shut_down  # NVML was initialised, so it is shut down again
    monkeypatch.setitem(
        sys.modules, "pynvml", _FakeNvml(init_error=RuntimeError("Driver Not Loaded"))
    )
    assert open_gpu_source({}) is None
