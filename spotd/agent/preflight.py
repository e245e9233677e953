"""The gang preflight: check every node in the job's own environment, then time an
all-reduce across the gang.

Every new gang runs it after its nodes found each other and before the user's
command starts, so that a bad node or a slow network costs minutes, not the
first hours of a run. Each node calls :func:`run_preflight` with its
:class:`PreflightPlan` and the job's runtime (:mod:`spotd.agent.job_python`):

1. node checks, by the agent: the GPUs as offered (count, model, memory, a
   driver that answers) and a checkpoint location that takes a write;
2. ``local_procs`` worker processes (:mod:`spotd.agent.preflight_worker`) run
   with the job's own interpreter, in its environment and image: torch must
   import there and see the node's GPUs; then they join one process group
   across all ranks of the gang with the job's backend, share every node's
   check verdict, and time ``iterations`` all-reduces of ``size_mb`` MB.

It fails closed: a missing interpreter, a missing torch, GPUs torch cannot see,
a process group that does not form, an all-reduce that errors or falls under
the floor are each a failed check with a typed reason
(:class:`~spotd.core.agent_wire.PreflightFailure`), never a skip. Every node
that reaches the gang reaches the same verdict: the bandwidth is the slowest
rank's, and one node's failed check fails the whole gang, naming that node
(``failed_rank``). A node whose workers cannot join (no torch there) fails at
once, naming itself; its peers wait for it until ``timeout_seconds``.

Only a gang of one process skips the all-reduce (no peer); it still checks torch
in the job's interpreter when the job says it uses torch (``[preflight] torch``).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Self

import fsspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from spotd import checkpoints
from spotd.agent.gpu import GpuSource
from spotd.agent.job_python import JobPython, JobRuntime
from spotd.agent.preflight_launch import RankEnv, WorkerOutcome, failed, run_workers
from spotd.agent.preflight_worker import Backend, WorkerResult, WorkerSpec
from spotd.core.agent_wire import (
    GpuReading,
    PreflightCheck,
    PreflightCheckName,
    PreflightFailure,
    PreflightFigures,
)
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

SIMULATED = "simulated market: the offering's GPUs do not exist"
Name = PreflightCheckName
Why = PreflightFailure
_GPU_CHECKS = (Name.GPU_DRIVER, Name.GPU_COUNT, Name.GPU_MODEL, Name.GPU_MEMORY)
_JOB_STEPS = (Name.JOB_PYTHON, Name.TORCH, Name.TORCH_GPUS, Name.PROCESS_GROUP, Name.BANDWIDTH)
"""The checks the job's interpreter makes, in the order its workers make them."""


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
    torch: bool | None = None
    """The job's ``[preflight] torch``: True checks torch even in a gang of one process,
    False never (and measures nothing); None checks it where the gang needs it (2+ ranks)."""

    @model_validator(mode="after")
    def _rank_in_gang(self) -> Self:
        if self.node_rank >= self.nodes:
            raise ValueError(f"node_rank {self.node_rank} is not below nodes {self.nodes}")
        return self

    @property
    def world_size(self) -> int:
        """Ranks in the gang: every node runs ``local_procs``."""
        return self.nodes * self.local_procs

    @property
    def checks_torch(self) -> bool:
        """Whether the job's interpreter runs workers (torch checks, the all-reduce)."""
        return self.torch if self.torch is not None else self.world_size > 1


@dataclass(frozen=True)
class _GangOutcome:
    """What the workers (or their absence) said."""

    checks: tuple[PreflightCheck, ...]
    """The job interpreter's checks, :data:`_JOB_STEPS`, each passed, failed or skipped."""
    busbw_gbps: float | None = None
    failed_nodes: dict[int, PreflightCheck] | None = None
    """Node -> its failed check, as agreed by the gang; None when nothing was exchanged."""
    failure: PreflightCheck | None = None
    """The first failed check of the job's interpreter on this node; None when none failed."""
    slow_node: int | None = None
    """The node whose own links fell under the floor (:func:`slow_node`), when the gang's
    did and its links say which."""


@dataclass(frozen=True)
class _Verdict:
    line: str = ""
    """Why the gang failed, in one line, the same on every node; '' when it passed."""
    rank: int | None = None
    check: PreflightCheck | None = None


def run_preflight(
    plan: PreflightPlan, gpus: GpuSource | None, job: JobRuntime, clock: Clock = WALL
) -> PreflightFigures:
    """Run this node's part of the gang's preflight; every node gets the same verdict.

    ``gpus`` is the node's GPU source (:func:`spotd.agent.gpu.open_gpu_source`),
    None where no driver answers; ``job`` the job's interpreter, environment and
    folders, which the workers run in. Blocks until the gang is done or
    ``plan.timeout_seconds`` of ``clock`` have passed; never raises for a failed check.
    """
    start = clock.monotonic()
    deadline = start + plan.timeout_seconds
    readings, sample_error = _sample(gpus)
    checks = [*_gpu_checks(plan, gpus, readings, sample_error)]
    checks.append(_checkpoint_check(plan, plan.timeout_seconds * PROBE_SHARE))
    backend = plan.backend or _default_backend(plan, readings)
    gang = _run_gang(plan, backend, checks, job, deadline=deadline, clock=clock)
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


def _ok(name: Name, detail: str) -> PreflightCheck:
    return PreflightCheck(name=name, ok=True, detail=detail)


def _skipped(name: Name, why: str) -> PreflightCheck:
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
        return [failed(Name.GPU_DRIVER, Why.NO_DRIVER, why), *rest]
    return [
        _ok(Name.GPU_DRIVER, f"NVML sees {len(readings)} GPUs"),
        _count_check(plan, readings),
        _model_check(plan, readings),
        _memory_check(plan, readings),
    ]


def _count_check(plan: PreflightPlan, readings: list[GpuReading]) -> PreflightCheck:
    detail = f"expected {plan.expect_gpus} GPUs, found {len(readings)}"
    if len(readings) == plan.expect_gpus:
        return _ok(Name.GPU_COUNT, detail)
    return failed(Name.GPU_COUNT, Why.GPU_COUNT, detail)


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
        return _skipped(Name.GPU_MODEL, "no model offered")
    wrong = sorted(
        {r.name for r in readings if not gpu_model_matches(plan.expect_gpu_model, r.name)}
    )
    if wrong:
        found = ", ".join(wrong)
        return failed(Name.GPU_MODEL, Why.GPU_MODEL,
                      f"expected {plan.expect_gpu_model} GPUs, found {found}")  # fmt: skip
    return _ok(Name.GPU_MODEL, f"{plan.expect_gpu_model}: {readings[0].name}" if readings else "")


def _memory_check(plan: PreflightPlan, readings: list[GpuReading]) -> PreflightCheck:
    want = plan.expect_gpu_memory_gb
    if want <= 0:
        return _skipped(Name.GPU_MEMORY, "no GPU memory offered")
    short = [r for r in readings if r.mem_total_gb < want * GPU_MEMORY_TOLERANCE]
    if short:
        gpu = short[0]
        return failed(Name.GPU_MEMORY, Why.GPU_MEMORY,
                      f"expected {want:g} GB per GPU, GPU {gpu.index} has "
                      f"{gpu.mem_total_gb:.1f} GB")  # fmt: skip
    least = min((r.mem_total_gb for r in readings), default=0.0)
    return _ok(Name.GPU_MEMORY, f"expected {want:g} GB per GPU, the least has {least:.1f} GB")


def _checkpoint_check(plan: PreflightPlan, budget: float) -> PreflightCheck:
    """Write and remove a probe file in the checkpoint location, within ``budget`` s."""
    if not plan.checkpoint_uri:
        return _skipped(Name.CHECKPOINT, "no checkpoint location given")
    probe = checkpoints.join(
        plan.checkpoint_uri, f".spotd-preflight-{plan.node_rank}-{uuid.uuid4().hex}"
    )
    # A thread, so that an object store that never answers costs the budget, not the gang.
    error = _within(budget, lambda: _write_and_remove(probe))
    if error:
        return failed(Name.CHECKPOINT, Why.CHECKPOINT_UNWRITABLE,
                      f"checkpoint location not writable: {error}")  # fmt: skip
    return _ok(Name.CHECKPOINT, f"wrote and removed a probe in {plan.checkpoint_uri}")


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


def _first_failed(checks: Sequence[PreflightCheck]) -> PreflightCheck | None:
    return next((c for c in checks if not c.ok), None)


def _failure_line(checks: Sequence[PreflightCheck]) -> str:
    """This node's failed checks, in one line; empty when none failed."""
    return "; ".join(c.detail or c.name for c in checks if not c.ok)


# ---- the job's interpreter and the gang -----------------------------------------


def _run_gang(
    plan: PreflightPlan,
    backend: Backend,
    node_checks: list[PreflightCheck],
    job: JobRuntime,
    *,
    deadline: float,
    clock: Clock,
) -> _GangOutcome:
    if not plan.checks_torch:
        why = (
            "the job does not use torch ([preflight] torch = false)"
            if plan.torch is False
            else "a gang of one process: no peer to measure against "
            "(torch is checked here with [preflight] torch = true)"
        )
        return _GangOutcome(checks=tuple(_skipped(name, why) for name in _JOB_STEPS))
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
        node_failure=_shared(node_checks),
        gpus=plan.local_procs if backend == "nccl" else 0,
    )
    ranks = RankEnv(node_rank=plan.node_rank, local_procs=plan.local_procs,
                    world_size=plan.world_size, master_addr=plan.master_addr,
                    port=plan.port)  # fmt: skip
    outcome = run_workers(ranks, spec, job, timeout_seconds=plan.timeout_seconds,
                          deadline=deadline, clock=clock)  # fmt: skip
    return _outcome(plan, spec, job, outcome)


def _shared(node_checks: list[PreflightCheck]) -> str:
    """This node's verdict for its peers: its first failed check, with every failure's
    words as the detail; empty when all passed."""
    own = _first_failed(node_checks)
    if own is None:
        return ""
    return own.model_copy(update={"detail": _failure_line(node_checks)}).model_dump_json()


def _outcome(
    plan: PreflightPlan, spec: WorkerSpec, job: JobRuntime, outcome: WorkerOutcome
) -> _GangOutcome:
    result, failure = outcome.result, outcome.failure
    passed = _passed_steps(plan, spec, job, result)
    if failure is not None or result is None:
        failure = failure or failed(Name.JOB_PYTHON, Why.PYTHON_UNUSABLE, "no worker result")
        python = None
        if outcome.python:
            python = _ok(Name.JOB_PYTHON, f"{outcome.python} ({_source(job)})")
        return _GangOutcome(checks=_up_to(failure, passed, python), failure=failure)
    bandwidth = _bandwidth_check(plan, spec, result)
    checks = (*passed, bandwidth)
    if result.world_size == 1:
        return _GangOutcome(checks=checks)
    failed_nodes = {n: _node_check(text) for n, text in result.failed_nodes.items()}
    slow = None
    if not bandwidth.ok and plan.min_busbw_gbps is not None:
        slow = slow_node(result.link_gbps, plan.min_busbw_gbps)
    if slow is not None:
        bandwidth = _link_check(result.link_gbps, slow)
        checks = (*passed, bandwidth)
    return _GangOutcome(checks=checks, busbw_gbps=result.busbw_gbps, failed_nodes=failed_nodes,
                        failure=None if bandwidth.ok else bandwidth, slow_node=slow)  # fmt: skip


def slow_node(links: Sequence[float], floor: float) -> int | None:
    """The node both of whose links are under ``floor`` GB/s while some link is not; None
    when no node or several are. ``links[k]`` is the link from node ``k-1`` into node
    ``k`` (a ring), so node ``k``'s links are ``links[k]`` and ``links[k+1]``. Every link
    under the floor is the fabric's or the pool's, not one node's."""
    n = len(links)
    if n < 3:
        return None
    slow = [rate < floor for rate in links]
    if all(slow):
        return None
    suspects = [k for k in range(n) if slow[k] and slow[(k + 1) % n]]
    return suspects[0] if len(suspects) == 1 else None


def _link_check(links: Sequence[float], node: int) -> PreflightCheck:
    n = len(links)
    into, out = links[node], links[(node + 1) % n]
    return failed(Name.NODE_LINK, Why.BELOW_FLOOR,
                  f"its links carry {_gbps(into)} GB/s in from node {(node - 1) % n} and "
                  f"{_gbps(out)} GB/s out to node {(node + 1) % n}")  # fmt: skip


def _up_to(
    failure: PreflightCheck, passed: list[PreflightCheck], python: PreflightCheck | None
) -> tuple[PreflightCheck, ...]:
    """The job's steps when ``failure`` ended them: the ones before it passed (the worker
    makes them in order), the ones after never ran. A timeout may have come at any step:
    only those the worker said it passed count as passed. ``python``: the interpreter,
    where the worker said which it is."""
    at = _JOB_STEPS.index(failure.name) if failure.name in _JOB_STEPS else 0
    known = {c.name: c for c in (*([python] if python else []), *passed)}
    unknown = "no answer from the worker" if failure.reason is Why.TIMED_OUT else ""
    before = [
        known.get(n) or (_skipped(n, unknown) if unknown else _ok(n, "passed"))
        for n in _JOB_STEPS[:at]
    ]
    after = [_skipped(n, "not reached") for n in _JOB_STEPS[at + 1 :]]
    return (*before, failure, *after)


def _passed_steps(
    plan: PreflightPlan, spec: WorkerSpec, job: JobRuntime, result: WorkerResult | None
) -> list[PreflightCheck]:
    """The checks local rank 0 passed before the gang: the interpreter, torch, its GPUs,
    and the process group when it went on to measure. Empty without its word."""
    if result is None:
        return []
    python = f"python {result.python_version} at {result.python}"
    steps = [
        _ok(Name.JOB_PYTHON, f"{python} ({_source(job)})"),
        _ok(Name.TORCH, f"torch {result.torch_version}"),
        _ok(Name.TORCH_GPUS, f"torch sees {result.cuda_devices} CUDA device(s)")
        if spec.gpus
        else _skipped(Name.TORCH_GPUS, "no GPUs for the job on this node"),
    ]
    if plan.world_size == 1:
        return [*steps, _skipped(Name.PROCESS_GROUP, "a gang of one process: no peer")]
    if result.busbw_gbps is None:
        return steps  # it had not formed the group yet
    joined = f"{result.world_size} ranks joined ({spec.backend})"
    return [*steps, _ok(Name.PROCESS_GROUP, joined)]


def _source(job: JobRuntime) -> str:
    """How the job's interpreter was chosen, for people."""
    return job.python.source if isinstance(job.python, JobPython) else "none found"


def _bandwidth_check(plan: PreflightPlan, spec: WorkerSpec, result: WorkerResult) -> PreflightCheck:
    busbw = result.busbw_gbps
    if result.world_size == 1 or busbw is None:
        return _skipped(Name.BANDWIDTH, "a gang of one process: no peer to measure against")
    detail = (
        f"{_gbps(busbw)} GB/s over {result.world_size} ranks "
        f"({spec.backend}, {result.size_bytes / 1e6:g} MB x {spec.iterations})"
    )
    threshold = plan.min_busbw_gbps
    if threshold is not None and busbw < threshold:
        return failed(Name.BANDWIDTH, Why.BELOW_FLOOR, f"{detail}, below {_gbps(threshold)} GB/s")
    return _ok(Name.BANDWIDTH, detail)


def _node_check(text: str) -> PreflightCheck:
    """A peer's failed check as its agent shared it (an older one shared a line)."""
    try:
        return PreflightCheck.model_validate_json(text)
    except ValidationError:
        return failed(Name.OTHER, Why.OTHER, text)


# ---- the verdict ----------------------------------------------------------------


def _gbps(value: float) -> str:
    """A bandwidth as people write it: ``0.73``, ``12.3``, ``1000``, ``1000000``."""
    return f"{value:.0f}" if value >= 1000 else f"{value:.3g}"


def _verdict(plan: PreflightPlan, checks: list[PreflightCheck], gang: _GangOutcome) -> _Verdict:
    """Why the gang failed, the node it names and the check it rests on; passed when
    no check failed. Failed checks come first by the gang's agreement, then this node's
    own, then its workers', then the gang's as a whole (timeout, bandwidth)."""
    me = plan.node_rank
    if gang.failed_nodes:
        first = min(gang.failed_nodes)
        check = gang.failed_nodes[first]
        return _Verdict(f"node {first}: {check.detail or check.name}", first, check)
    own = _first_failed(checks)
    if gang.failed_nodes is None and own is not None:
        return _Verdict(f"node {me}: {_failure_line(checks)}", me, own)
    failure = gang.failure
    if failure is not None and failure.reason is Why.TIMED_OUT:
        return _Verdict(failure.detail, None, failure)
    if failure is not None and failure.reason is Why.BELOW_FLOOR:
        busbw, floor = gang.busbw_gbps or 0.0, plan.min_busbw_gbps or 0.0
        line = f"bus bandwidth {_gbps(busbw)} GB/s below {_gbps(floor)} GB/s"
        if gang.slow_node is not None:
            line = f"node {gang.slow_node}: {failure.detail}; {line}"
        return _Verdict(line, gang.slow_node, failure)
    if failure is not None:
        return _Verdict(f"node {me}: {failure.detail or failure.name}", me, failure)
    # Not reached by the checks above; kept so that no failed check can pass.
    left = _first_failed([*checks, *gang.checks])
    return _Verdict() if left is None else _Verdict(f"node {me}: {left.detail}", me, left)


def _gang_check(gang: _GangOutcome) -> list[PreflightCheck]:
    if gang.failed_nodes is None:
        return []
    if not gang.failed_nodes:
        return [_ok(Name.GANG, "every node passed its checks")]
    lines = "; ".join(f"node {n}: {c.detail}" for n, c in sorted(gang.failed_nodes.items()))
    return [failed(Name.GANG, Why.PEER_FAILED, lines)]


def _figures(
    plan: PreflightPlan,
    backend: Backend,
    checks: list[PreflightCheck],
    gang: _GangOutcome,
    seconds: float,
) -> PreflightFigures:
    verdict = _verdict(plan, checks, gang)
    check = verdict.check
    return PreflightFigures(
        passed=check is None,
        busbw_gbps=gang.busbw_gbps,
        min_busbw_gbps=plan.min_busbw_gbps,
        backend=backend,
        world_size=plan.world_size,
        seconds=seconds,
        checks=(*checks, *gang.checks, *_gang_check(gang)),
        reason=verdict.line,
        failed_rank=verdict.rank,
        failed_check=check.name if check is not None else None,
        failed_reason=check.reason if check is not None else None,
    )
