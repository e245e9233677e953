"""The gang preflight: check every node, then time an all-reduce across the gang.

Every new gang runs it after its nodes found each other and before the user's
command starts, so that a bad node or a slow network costs minutes, not the
first hours of a run. Each node calls :func:`run_preflight` with its
:class:`PreflightPlan`:

1. node checks, locally: the GPUs as offered (count, model, memory, a driver
   that answers) and a checkpoint location that takes a write;
2. ``local_procs`` worker processes (:mod:`spotd.agent.preflight_worker`) join
   one process group across all ranks of the gang with the job's backend,
   share every node's check verdict, and time ``iterations`` all-reduces of
   ``size_mb`` MB.

Every node reaches the same verdict: the bandwidth is the slowest rank's, and
one node's failed check fails the whole gang, naming that node. A peer that
never arrives or a worker that hangs ends the preflight at ``timeout_seconds``.

What needs the gang (the bandwidth, the agreement) is skipped where it cannot
run: a gang of one process has no peer; without torch there is no process
group, and then each node's verdict rests on its own checks alone.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import IO, Self

import fsspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spotd import checkpoints
from spotd.agent.gpu import GpuSource
from spotd.agent.preflight_worker import (
    SPEC_VARIABLE,
    Backend,
    WorkerFailure,
    WorkerResult,
    WorkerSpec,
)
from spotd.core.agent_wire import GpuReading, PreflightCheck, PreflightFigures
from spotd.core.clock import WALL
from spotd.core.contracts import Clock

__all__ = [
    "DEFAULT_SIZE_MB",
    "GPU_MEMORY_TOLERANCE",
    "PreflightPlan",
    "gpu_model_matches",
    "run_preflight",
]

DEFAULT_SIZE_MB: dict[Backend, float] = {"gloo": 8.0, "nccl": 256.0}
"""All-reduce buffer per backend: CPU links saturate with little; NVLink needs a big one."""

GPU_MEMORY_TOLERANCE = 0.9
"""A GPU passes with this share of its offered memory: NVML reports less than the
marketed figure (an 80 GB H100 shows 79.6 GiB, a 16 GB T4 15 GiB)."""

WARMUP_ITERATIONS = 3
WORKER_GRACE_SECONDS = 10.0
"""Workers' own torch timeouts run this much past the preflight's, so the
preflight's deadline, not a torch error, ends a hang, with the same words on every node."""
PROBE_SHARE = 0.5
"""The share of the timeout a checkpoint write may take before it counts as failed,
leaving the rest for the gang."""
_POLL_SECONDS = 0.05

SIMULATED = "simulated market: the offering's GPUs do not exist"
CHECK_GPU_DRIVER = "gpu_driver"
CHECK_GPU_COUNT = "gpu_count"
CHECK_GPU_MODEL = "gpu_model"
CHECK_GPU_MEMORY = "gpu_memory"
CHECK_CHECKPOINT = "checkpoint_writable"
CHECK_BANDWIDTH = "allreduce_busbw"
CHECK_GANG = "gang_checks"
_GPU_CHECKS = (CHECK_GPU_DRIVER, CHECK_GPU_COUNT, CHECK_GPU_MODEL, CHECK_GPU_MEMORY)


class PreflightPlan(BaseModel):
    """What one node of a gang checks and measures in the preflight."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node_rank: int = Field(ge=0)
    nodes: int = Field(ge=1)
    master_addr: str = Field(min_length=1)
    """Node 0's address: its rank 0 serves the preflight's TCP store there."""
    port: int = Field(ge=1, le=65535)
    """The TCP store's port on the master (the roster's ``preflight_port``)."""
    node_addr: str = ""
    """This node's own address; gloo listens there. Empty: gloo's choice (the host
    name's address). NCCL picks its interface itself (``NCCL_SOCKET_IFNAME``)."""
    local_procs: int = Field(default=1, ge=1)
    """Processes on this node: its GPU count on GPU nodes, 1 on CPU. The same on every node."""
    backend: Backend | None = None
    """None: NCCL when this node sees GPUs (and is not simulated), else gloo."""
    min_busbw_gbps: float | None = Field(default=None, ge=0)
    timeout_seconds: float = Field(default=300.0, gt=0)
    size_mb: float | None = Field(default=None, gt=0)
    """All-reduce buffer in MB (1e6 bytes); None: :data:`DEFAULT_SIZE_MB` of the backend."""
    iterations: int = Field(default=20, ge=1)
    expect_gpus: int = Field(default=0, ge=0)
    """GPUs the offering promises per node; 0 for a CPU offering (GPU checks skipped)."""
    expect_gpu_model: str = ""
    """The offering's model, e.g. ``A100``; empty: not checked."""
    expect_gpu_memory_gb: float = Field(default=0.0, ge=0)
    """GiB per GPU as offered; 0: not checked."""
    checkpoint_uri: str = ""
    """The job's checkpoint folder (any fsspec URI); empty: not checked."""
    simulated: bool = False
    """On the simulated market: GPU checks are reported skipped, not passed."""

    @model_validator(mode="after")
    def _rank_in_gang(self) -> Self:
        if self.node_rank >= self.nodes:
            raise ValueError(f"node_rank {self.node_rank} is not below nodes {self.nodes}")
        return self

    @property
    def world_size(self) -> int:
        """Ranks in the gang: every node runs ``local_procs``."""
        return self.nodes * self.local_procs


@dataclass(frozen=True)
class _GangOutcome:
    """What the workers (or their absence) said."""

    bandwidth: PreflightCheck
    busbw_gbps: float | None = None
    failed_nodes: dict[int, str] | None = None
    """Node -> reason, as agreed by the gang; None when nothing was exchanged."""
    error: str = ""
    """Why the gang part failed (timeout, a worker's error); empty when it ran."""


@dataclass
class _Worker:
    proc: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]
    local_rank: int
    result: WorkerResult | WorkerFailure | None = field(default=None)


def run_preflight(
    plan: PreflightPlan, gpus: GpuSource | None, clock: Clock = WALL
) -> PreflightFigures:
    """Run this node's part of the gang's preflight; every node gets the same verdict.

    ``gpus`` is the node's GPU source (:func:`spotd.agent.gpu.open_gpu_source`),
    None where no driver answers. Blocks until the gang is done or
    ``plan.timeout_seconds`` of ``clock`` have passed; never raises for a failed check.
    """
    start = clock.monotonic()
    deadline = start + plan.timeout_seconds
    readings, sample_error = _sample(gpus)
    checks = [*_gpu_checks(plan, gpus, readings, sample_error)]
    checks.append(_checkpoint_check(plan, plan.timeout_seconds * PROBE_SHARE))
    backend = plan.backend or _default_backend(plan, readings)
    gang = _run_gang(plan, backend, _failure_line(checks), deadline, clock)
    return _figures(plan, backend, checks, gang, clock.monotonic() - start)


# ---- node checks ----------------------------------------------------------------


def _sample(gpus: GpuSource | None) -> tuple[list[GpuReading], str]:
    if gpus is None:
        return [], ""
    try:
        return gpus.sample(), ""
    except Exception as exc:  # NVML errors come in one class per return code
        return [], f"{type(exc).__name__}: {exc}"


def _default_backend(plan: PreflightPlan, readings: list[GpuReading]) -> Backend:
    return "nccl" if readings and not plan.simulated else "gloo"


def _ok(name: str, detail: str) -> PreflightCheck:
    return PreflightCheck(name=name, ok=True, detail=detail)


def _failed(name: str, detail: str) -> PreflightCheck:
    return PreflightCheck(name=name, ok=False, detail=detail)


def _skipped(name: str, why: str) -> PreflightCheck:
    return PreflightCheck(name=name, ok=True, skipped=True, detail=why)


def _gpu_checks(
    plan: PreflightPlan, gpus: GpuSource | None, readings: list[GpuReading], error: str
) -> list[PreflightCheck]:
    if plan.simulated:
        return [_skipped(name, SIMULATED) for name in _GPU_CHECKS]
    if plan.expect_gpus == 0:
        return [_skipped(name, "the offering has no GPUs") for name in _GPU_CHECKS]
    if gpus is None or error:
        why = f"NVML failed: {error}" if error else "no NVIDIA driver answers (NVML)"
        rest = [_skipped(name, "no GPU readings") for name in _GPU_CHECKS[1:]]
        return [_failed(CHECK_GPU_DRIVER, why), *rest]
    return [
        _ok(CHECK_GPU_DRIVER, f"NVML sees {len(readings)} GPUs"),
        _count_check(plan, readings),
        _model_check(plan, readings),
        _memory_check(plan, readings),
    ]


def _count_check(plan: PreflightPlan, readings: list[GpuReading]) -> PreflightCheck:
    detail = f"expected {plan.expect_gpus} GPUs, found {len(readings)}"
    if len(readings) == plan.expect_gpus:
        return _ok(CHECK_GPU_COUNT, detail)
    return _failed(CHECK_GPU_COUNT, detail)


def gpu_model_matches(expected: str, name: str) -> bool:
    """Whether NVML's device ``name`` is of the offered model ``expected``.

    Compares words, case-blind: ``A100`` matches ``NVIDIA A100-SXM4-80GB`` and
    ``H100-NVL`` matches ``NVIDIA H100 NVL``, but ``A10`` does not match ``NVIDIA A100``.
    """
    want, have = _words(expected), _words(name)
    if not want:
        return True
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[^0-9A-Z]+", text.upper()) if w]


def _model_check(plan: PreflightPlan, readings: list[GpuReading]) -> PreflightCheck:
    if not plan.expect_gpu_model:
        return _skipped(CHECK_GPU_MODEL, "no model offered")
    wrong = sorted(
        {r.name for r in readings if not gpu_model_matches(plan.expect_gpu_model, r.name)}
    )
    if wrong:
        return _failed(
            CHECK_GPU_MODEL, f"expected {plan.expect_gpu_model} GPUs, found {', '.join(wrong)}"
        )
    return _ok(CHECK_GPU_MODEL, f"{plan.expect_gpu_model}: {readings[0].name}" if readings else "")


def _memory_check(plan: PreflightPlan, readings: list[GpuReading]) -> PreflightCheck:
    want = plan.expect_gpu_memory_gb
    if want <= 0:
        return _skipped(CHECK_GPU_MEMORY, "no GPU memory offered")
    short = [r for r in readings if r.mem_total_gb < want * GPU_MEMORY_TOLERANCE]
    if short:
        gpu = short[0]
        return _failed(
            CHECK_GPU_MEMORY,
            f"expected {want:g} GB per GPU, GPU {gpu.index} has {gpu.mem_total_gb:.1f} GB",
        )
    least = min((r.mem_total_gb for r in readings), default=0.0)
    return _ok(CHECK_GPU_MEMORY, f"expected {want:g} GB per GPU, the least has {least:.1f} GB")


def _checkpoint_check(plan: PreflightPlan, budget: float) -> PreflightCheck:
    """Write and remove a probe file in the checkpoint location, within ``budget`` s."""
    if not plan.checkpoint_uri:
        return _skipped(CHECK_CHECKPOINT, "no checkpoint location given")
    probe = checkpoints.join(
        plan.checkpoint_uri, f".spotd-preflight-{plan.node_rank}-{uuid.uuid4().hex}"
    )
    # A thread, so that an object store that never answers costs the budget, not the gang.
    error = _within(budget, lambda: _write_and_remove(probe))
    if error:
        return _failed(CHECK_CHECKPOINT, f"checkpoint location not writable: {error}")
    return _ok(CHECK_CHECKPOINT, f"wrote and removed a probe in {plan.checkpoint_uri}")


def _write_and_remove(probe: str) -> None:
    checkpoints.write_bytes(probe, b"spotd preflight probe\n")
    fs, path = fsspec.core.url_to_fs(probe)
    fs.rm(path)


def _within(budget: float, action: Callable[[], None]) -> str:
    """Run ``action`` in a daemon thread; its error in one line, or a timeout, or ''."""
    errors: list[str] = []

    def run() -> None:
        try:
            action()
        except Exception as exc:  # any backend's failure (OSError, a cloud SDK's) counts
            errors.append(" ".join(str(exc).split()) or type(exc).__name__)

    thread = threading.Thread(target=run, name="spotd-preflight-probe", daemon=True)
    thread.start()
    thread.join(budget)
    if thread.is_alive():
        return f"no answer within {budget:g} s"
    return errors[0] if errors else ""


def _failure_line(checks: list[PreflightCheck]) -> str:
    """This node's failed checks, in one line; empty when none failed."""
    return "; ".join(c.detail or c.name for c in checks if not c.ok)


# ---- the gang -------------------------------------------------------------------


def _torch_available() -> bool:
    # find_spec, not import: the parent needs no torch, only its workers do.
    return importlib.util.find_spec("torch") is not None


def _run_gang(
    plan: PreflightPlan, backend: Backend, node_failure: str, deadline: float, clock: Clock
) -> _GangOutcome:
    if plan.world_size == 1:
        why = "a gang of one process: no peer to measure against"
        return _GangOutcome(bandwidth=_skipped(CHECK_BANDWIDTH, why))
    if not _torch_available():
        return _GangOutcome(bandwidth=_skipped(CHECK_BANDWIDTH, "torch not installed"))
    size_mb = plan.size_mb if plan.size_mb is not None else DEFAULT_SIZE_MB[backend]
    spec = WorkerSpec(
        backend=backend,
        nodes=plan.nodes,
        node_rank=plan.node_rank,
        node_addr=plan.node_addr,
        size_bytes=max(4, int(size_mb * 1e6)),
        iterations=plan.iterations,
        warmup=WARMUP_ITERATIONS,
        timeout_seconds=max(deadline - clock.monotonic(), 0.0) + WORKER_GRACE_SECONDS,
        node_failure=node_failure,
    )
    return _launch(plan, spec, deadline, clock)


def _launch(
    plan: PreflightPlan, spec: WorkerSpec, deadline: float, clock: Clock
) -> _GangOutcome:
    workers: list[_Worker] = []
    try:
        for local_rank in range(plan.local_procs):
            workers.append(_start_worker(plan, spec, local_rank))
        state = _wait(workers, deadline, clock)
    except OSError as exc:
        state = f"cannot start a preflight worker: {exc}"
    finally:
        _kill(workers)
    if state == "done":
        return _outcome(plan, spec, workers)
    if state == "timeout":
        # The same words on every node: which peer hung is not known here.
        error = f"preflight timed out after {plan.timeout_seconds:g} s"
    else:
        error = f"node {plan.node_rank}: {state}"
    return _GangOutcome(bandwidth=_failed(CHECK_BANDWIDTH, error), error=error)


def _start_worker(plan: PreflightPlan, spec: WorkerSpec, local_rank: int) -> _Worker:
    env = {
        **os.environ,
        "RANK": str(plan.node_rank * plan.local_procs + local_rank),
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(plan.local_procs),
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": str(plan.port),
        SPEC_VARIABLE: spec.model_dump_json(),
    }
    # Files, not pipes: a worker blocked on a full pipe would stall its peers' collectives.
    stdout = tempfile.TemporaryFile()  # noqa: SIM115 (closed in _kill)
    stderr = tempfile.TemporaryFile()  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spotd.agent.preflight_worker"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            process_group=0,  # its own group, so a kill reaches anything it started
        )
    except OSError:
        stdout.close()
        stderr.close()
        raise
    return _Worker(proc=proc, stdout=stdout, stderr=stderr, local_rank=local_rank)


def _wait(workers: list[_Worker], deadline: float, clock: Clock) -> str:
    """``done`` when all exited 0, ``timeout`` at the deadline, else why one failed.

    Polls them all, so one worker's early failure ends the wait at once instead of
    leaving its local peers to hang on it until the deadline.
    """
    while True:
        codes = [w.proc.poll() for w in workers]
        for worker, code in zip(workers, codes, strict=True):
            if code not in (None, 0):
                return _worker_error(worker, code)
        if all(code == 0 for code in codes):
            return "done"
        if clock.monotonic() >= deadline:
            return "timeout"
        time.sleep(_POLL_SECONDS)


def _kill(workers: list[_Worker]) -> None:
    """Kill every worker's process group (a no-op for those that exited), close files."""
    for worker in workers:
        if worker.proc.poll() is None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()
        worker.result = _parse(worker.stdout)
        worker.stdout.close()
        if worker.result is None:
            worker.result = WorkerFailure(rank=-1, error=_last_line(worker.stderr))
        worker.stderr.close()


def _parse(stdout: IO[bytes]) -> WorkerResult | WorkerFailure | None:
    """The worker's result line: the last line of its stdout that parses as one."""
    stdout.seek(0)
    for line in reversed(stdout.read().decode(errors="replace").splitlines()):
        for model in (WorkerResult, WorkerFailure):
            with suppress(ValidationError):
                return model.model_validate_json(line)
    return None


def _last_line(stream: IO[bytes]) -> str:
    stream.seek(0)
    lines = [ln.strip() for ln in stream.read().decode(errors="replace").splitlines()]
    return next((ln for ln in reversed(lines) if ln), "no output")


def _worker_error(worker: _Worker, code: int) -> str:
    # The result is parsed in _kill; here the worker has exited, so its files are complete.
    parsed = _parse(worker.stdout)
    detail = parsed.error if isinstance(parsed, WorkerFailure) else _last_line(worker.stderr)
    return f"preflight worker {worker.local_rank} exited with {code}: {detail}"


def _outcome(plan: PreflightPlan, spec: WorkerSpec, workers: list[_Worker]) -> _GangOutcome:
    first = workers[0].result  # only local rank 0's figures are needed: all ranks agree
    if not isinstance(first, WorkerResult):
        error = f"node {plan.node_rank}: preflight worker 0 printed no result"
        return _GangOutcome(bandwidth=_failed(CHECK_BANDWIDTH, error), error=error)
    detail = (
        f"{_gbps(first.busbw_gbps)} GB/s over {first.world_size} ranks "
        f"({spec.backend}, {first.size_bytes / 1e6:g} MB x {spec.iterations})"
    )
    threshold = plan.min_busbw_gbps
    if threshold is not None and first.busbw_gbps < threshold:
        check = _failed(CHECK_BANDWIDTH, f"{detail}, below {_gbps(threshold)} GB/s")
    else:
        check = _ok(CHECK_BANDWIDTH, detail)
    return _GangOutcome(
        bandwidth=check, busbw_gbps=first.busbw_gbps, failed_nodes=dict(first.failed_nodes)
    )


# ---- the verdict ----------------------------------------------------------------


def _gbps(value: float) -> str:
    """A bandwidth as people write it: ``0.73``, ``12.3``, ``1000``, ``1000000``."""
    return f"{value:.0f}" if value >= 1000 else f"{value:.3g}"


def _reason(plan: PreflightPlan, checks: list[PreflightCheck], gang: _GangOutcome) -> str:
    """Why the gang failed, in one line, the same on every node; '' when it passed."""
    if gang.error:
        return gang.error
    if gang.failed_nodes:
        first = min(gang.failed_nodes)
        return f"node {first}: {gang.failed_nodes[first]}"
    own = _failure_line(checks)
    if gang.failed_nodes is None and own:
        return f"node {plan.node_rank}: {own}"
    threshold, busbw = plan.min_busbw_gbps, gang.busbw_gbps
    if threshold is not None and busbw is not None and busbw < threshold:
        return f"bus bandwidth {_gbps(busbw)} GB/s below {_gbps(threshold)} GB/s"
    # Not reached by the checks above; kept so that no failed check can pass.
    failed = next((c for c in (*checks, gang.bandwidth) if not c.ok), None)
    return "" if failed is None else f"node {plan.node_rank}: {failed.detail or failed.name}"


def _gang_check(gang: _GangOutcome) -> list[PreflightCheck]:
    if gang.failed_nodes is None:
        return []
    if not gang.failed_nodes:
        return [_ok(CHECK_GANG, "every node passed its checks")]
    lines = "; ".join(f"node {n}: {why}" for n, why in sorted(gang.failed_nodes.items()))
    return [_failed(CHECK_GANG, lines)]


def _figures(
    plan: PreflightPlan,
    backend: Backend,
    checks: list[PreflightCheck],
    gang: _GangOutcome,
    seconds: float,
) -> PreflightFigures:
    reason = _reason(plan, checks, gang)
    return PreflightFigures(
        passed=not reason,
        busbw_gbps=gang.busbw_gbps,
        min_busbw_gbps=plan.min_busbw_gbps,
        backend=backend,
        world_size=plan.world_size,
        seconds=seconds,
        checks=(*checks, gang.bandwidth, *_gang_check(gang)),
        reason=reason,
    )
