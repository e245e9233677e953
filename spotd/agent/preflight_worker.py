"""One rank of a gang's preflight, run by the job's own Python interpreter.

A standalone script on purpose: it needs the standard library and torch, nothing
else, so it runs in whatever environment the job will train in (a venv its setup
made, a conda env, a container image) whether spotd is installed there or not, and
whatever version of spotd that would be. :func:`spotd.agent.preflight.run_preflight`
writes this very file into the agent's run folder and starts one copy per local
process with the job's interpreter (:mod:`spotd.agent.job_python`), inside the job's
image when it has one. spotd imports it as a module only for its data shapes. Keep it
to the standard library and to syntax Python 3.8 reads (``from __future__ import
annotations`` makes the annotations strings): jobs train on older Pythons than spotd's.

The rank comes from the usual torch variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), the rest of
the work from ``SPOTD_PREFLIGHT_SPEC`` (a :class:`WorkerSpec` as JSON). In order:

1. import torch (failure ``torch-missing`` or ``torch-broken``);
2. where the node has GPUs, torch must see them through CUDA (``no-gpu``);
3. a world of one process stops here: nothing to measure against;
4. join the gang's process group on a TCP store at the master
   (``process-group-failed``);
5. share every node's check verdict and time the all-reduces (``allreduce-failed``);
6. in a gang of three nodes or more, time each node's link: node ``k-1``'s local rank 0
   sends to node ``k``'s, one pair at a time, so that a node under the floor can be
   told from a fabric under it (:func:`slow_node`).

It prints a :class:`WorkerResult` as a JSON line on stdout once torch and the GPUs
passed (without figures) and again at the end (exit 0), or a :class:`WorkerFailure`
with its reason (exit 1): the last line is the one that counts. The reasons are the values of
:class:`spotd.core.agent_wire.PreflightFailure`, spelled out here since this file
imports nothing of spotd (a test keeps them equal).

Every rank of the gang ends with the same figures: the time is the slowest
rank's (all-reduce MAX), the node verdicts are all-reduced with MIN, and the
failing nodes' verdicts are read from the store, where each node's local rank 0
put its own before the all-reduce.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import timedelta
from typing import Any, Literal, Protocol

SPEC_VARIABLE = "SPOTD_PREFLIGHT_SPEC"
EXIT_FAILED = 1
_PINNED_GLOO = "spotd-gloo"
_FAILURE_KEY = "spotd-preflight/node/{}"

Backend = Literal["nccl", "gloo"]

TORCH_MISSING = "torch-missing"
TORCH_BROKEN = "torch-broken"
NO_GPU = "no-gpu"
PROCESS_GROUP_FAILED = "process-group-failed"
ALLREDUCE_FAILED = "allreduce-failed"
BAD_REQUEST = "other"
"""The agent and this worker disagree on the request (no spec, a missing variable)."""
REASONS = (TORCH_MISSING, TORCH_BROKEN, NO_GPU, PROCESS_GROUP_FAILED, ALLREDUCE_FAILED,
           BAD_REQUEST)  # fmt: skip


class Timer(Protocol):
    """What times the all-reduces: the part of spotd's ``Clock`` this file needs (it
    cannot import spotd's)."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never going back."""


class _Wall:
    def monotonic(self) -> float:
        return time.monotonic()


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker of one node is asked to do."""

    backend: str
    """``nccl`` or ``gloo``."""
    nodes: int
    node_rank: int
    size_bytes: int
    iterations: int
    warmup: int
    timeout_seconds: float
    node_addr: str = ""
    """This node's address for gloo to listen on; empty: gloo's own choice (the host name's)."""
    node_failure: str = ""
    """This node's own failed check (opaque here: the agent's JSON), empty when it passed."""
    gpus: int = 0
    """CUDA devices torch must see on this node; 0 where the node runs on CPU."""

    def to_json(self) -> str:
        """The spec as the worker reads it from :data:`SPEC_VARIABLE`."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        """The spec from its JSON; keys this worker does not know are left out."""
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class WorkerResult:
    """One rank's view of the gang; the figures are the same on every rank."""

    rank: int
    world_size: int
    python: str
    """The interpreter that ran the worker (``sys.executable``) and its version."""
    python_version: str
    torch_version: str
    cuda_devices: int
    """CUDA devices torch sees (0 on CPU)."""
    seconds_per_iteration: float | None = None
    """The slowest rank's mean time of one all-reduce; None in a world of one."""
    busbw_gbps: float | None = None
    size_bytes: int = 0
    failed_nodes: dict[int, str] = field(default_factory=dict)
    """Node rank -> that node's failed check, as its agent put it."""
    link_gbps: list[float] = field(default_factory=list)
    """Per node ``k``: GB/s from node ``k-1`` (in a ring of the nodes) into it, one pair at
    a time; empty in a gang of fewer than three nodes."""


@dataclass(frozen=True)
class WorkerFailure:
    """The worker could not finish, and why (one of :data:`REASONS`)."""

    rank: int
    reason: str
    error: str
    python: str = ""
    python_version: str = ""
    torch_version: str = ""


class StepFailed(Exception):
    """A step of the worker failed for ``reason``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def bus_bandwidth_gbps(size_bytes: int, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth as nccl-tests define it, in GB/s (1e9 bytes/s).

    algbw = size / time; busbw = algbw * 2 (n - 1) / n, the share of the data
    every rank must send and receive in a ring, so figures compare across n.
    """
    algbw = size_bytes / seconds
    return algbw * 2 * (world_size - 1) / world_size / 1e9


@dataclass(frozen=True)
class Rank:
    """Where this process stands in the gang, from the torch variables."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Rank:
        """The rank from ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the master's address."""
        return cls(
            rank=int(environ["RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            local_rank=int(environ["LOCAL_RANK"]),
            master_addr=environ["MASTER_ADDR"],
            master_port=int(environ["MASTER_PORT"]),
        )


def one_line(exc: BaseException) -> str:
    """An exception as ``Class: message`` on one line."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def load_torch() -> tuple[Any, Any]:
    """torch and torch.distributed, or :class:`StepFailed` saying why not.

    Behind Any on purpose: torch's inline types make mypy walk the whole torch
    package (about 25 s per fresh run on a 2-core machine) for a dozen calls.
    """
    try:
        torch = importlib.import_module("torch")
        dist = importlib.import_module("torch.distributed")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "torch":
            raise StepFailed(TORCH_MISSING, f"torch is not installed for {sys.executable}") from exc
        raise StepFailed(TORCH_BROKEN, f"import torch failed: {one_line(exc)}") from exc
    except Exception as exc:  # a library torch loads, a CUDA mismatch: any of them
        raise StepFailed(TORCH_BROKEN, f"import torch failed: {one_line(exc)}") from exc
    return torch, dist


def check_gpus(torch: Any, spec: WorkerSpec) -> int:
    """The CUDA devices torch sees; :class:`StepFailed` if fewer than ``spec.gpus``."""
    try:
        seen = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception as exc:  # a driver torch cannot talk to
        raise StepFailed(NO_GPU, f"torch cannot reach CUDA: {one_line(exc)}") from exc
    if seen < spec.gpus:
        build = getattr(torch.version, "cuda", None) or "no CUDA (a CPU-only build)"
        raise StepFailed(
            NO_GPU,
            f"torch {torch.__version__} sees {seen} CUDA device(s) of the node's {spec.gpus} "
            f"(torch built for {build})",
        )
    return seen


def _register_pinned_gloo(dist: Any, address: str) -> str:
    """A gloo backend that listens on ``address``; the stock one if that cannot be had.

    Stock gloo listens on what the host name resolves to, which on a VM with
    several interfaces (or nodes sharing a host in tests) need not be the
    address the gang knows the node by. The options that pin it are not public
    torch API: any torch that lacks them gets plain gloo.
    """
    gloo = getattr(dist, "ProcessGroupGloo", None)
    options_class = getattr(gloo, "_Options", None)
    if not address or gloo is None or options_class is None:
        return "gloo"

    def create(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
        try:
            options = options_class()
            options._timeout = timeout
            options._devices = [gloo.create_device(hostname=address)]
        except (AttributeError, TypeError, RuntimeError):
            # Options of another shape, or an address gloo cannot bind: its own choice.
            return gloo(store, rank, size, timeout)
        return gloo(store, rank, size, options)

    try:
        dist.Backend.register_backend(_PINNED_GLOO, create, devices=["cpu"])
    except Exception:  # an older signature: fall back rather than fail the gang
        return "gloo"
    return _PINNED_GLOO


@dataclass(frozen=True)
class Session:
    """One rank's handles on torch, its store and its device (torch kept behind Any), and
    the clock that times its all-reduces."""

    torch: Any
    dist: Any
    store: Any
    device: Any
    spec: WorkerSpec
    rank: Rank
    clock: Timer

    def synchronize(self) -> None:
        """Wait for queued CUDA work: collectives there are asynchronous."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def share_verdicts(self) -> dict[int, str]:
        """Node rank -> its failed check, for every node whose own checks failed."""
        spec = self.spec
        flags = self.torch.ones(spec.nodes, dtype=self.torch.int32, device=self.device)
        if self.rank.local_rank == 0 and spec.node_failure:
            flags[spec.node_rank] = 0
        # A collective returns only once every rank took part, so every node's
        # local rank 0 has already put its verdict in the store (join does that
        # before joining the group).
        self.dist.all_reduce(flags, op=self.dist.ReduceOp.MIN)
        failed = [i for i, ok in enumerate(flags.tolist()) if ok == 0]
        return {i: bytes(self.store.get(_FAILURE_KEY.format(i))).decode() for i in failed}

    def warm_up(self, buffer: Any) -> None:
        """Run the untimed all-reduces: the first ones set up connections and buffers."""
        for _ in range(self.spec.warmup):
            self.dist.all_reduce(buffer)
        self.synchronize()

    def time_links(self, buffer: Any) -> list[float]:
        """Per node ``k``: mean seconds of one send of ``buffer`` from node ``k-1``'s local
        rank 0 to node ``k``'s, timed at the receiver, one pair at a time (a ring measured
        at once would be paced by its slowest link everywhere)."""
        torch, dist, spec = self.torch, self.dist, self.spec
        per_node = self.rank.world_size // spec.nodes
        seconds = torch.zeros(spec.nodes, dtype=torch.float64, device=self.device)
        if self.rank.local_rank == 0:
            incoming = torch.empty_like(buffer)
            for k in range(spec.nodes):
                sender = (k - 1) % spec.nodes
                if spec.node_rank == sender:
                    for _ in range(spec.iterations + 1):
                        dist.send(buffer, dst=k * per_node)
                elif spec.node_rank == k:
                    dist.recv(incoming, src=sender * per_node)  # the pair's warm-up: in step
                    start = self.clock.monotonic()
                    for _ in range(spec.iterations):
                        dist.recv(incoming, src=sender * per_node)
                    self.synchronize()
                    seconds[k] = (self.clock.monotonic() - start) / spec.iterations
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        return [float(v) for v in seconds.tolist()]

    def time_all_reduce(self, buffer: Any) -> float:
        """The slowest rank's mean seconds per all-reduce of ``buffer``."""
        start = self.clock.monotonic()
        for _ in range(self.spec.iterations):
            self.dist.all_reduce(buffer)
        self.synchronize()
        elapsed = self.clock.monotonic() - start
        mine = self.torch.tensor([elapsed], dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(mine, op=self.dist.ReduceOp.MAX)
        return float(mine.item()) / self.spec.iterations


def _device(torch: Any, spec: WorkerSpec, rank: Rank) -> Any:
    if spec.backend != "nccl":
        return torch.device("cpu")
    device = torch.device("cuda", rank.local_rank)
    torch.cuda.set_device(device)
    return device


def join(torch: Any, dist: Any, spec: WorkerSpec, rank: Rank, clock: Timer) -> Session:
    """Open the store, publish this node's verdict, join the process group."""
    timeout = timedelta(seconds=spec.timeout_seconds)
    try:
        store = dist.TCPStore(
            rank.master_addr,
            rank.master_port,
            rank.world_size,
            is_master=rank.rank == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
        if rank.local_rank == 0:
            store.set(_FAILURE_KEY.format(spec.node_rank), spec.node_failure)
        device = _device(torch, spec, rank)
        backend = _register_pinned_gloo(dist, spec.node_addr) if spec.backend == "gloo" else "nccl"
        dist.init_process_group(
            backend, store=store, rank=rank.rank, world_size=rank.world_size, timeout=timeout
        )
    except Exception as exc:
        raise StepFailed(PROCESS_GROUP_FAILED, one_line(exc)) from exc
    return Session(
        torch=torch, dist=dist, store=store, device=device, spec=spec, rank=rank, clock=clock
    )


LINK_NODES = 3
"""The fewest nodes whose links are timed one by one: with two, the one link is both
nodes', and says nothing of which is slow."""


def measure(session: Session) -> tuple[float, dict[int, str], list[float]]:
    """The slowest rank's seconds per all-reduce, the failed nodes' verdicts, and each
    node's link seconds (empty under :data:`LINK_NODES` nodes)."""
    spec, torch = session.spec, session.torch
    try:
        # Zeros: the sums stay zero, so no overflow to inf however many iterations.
        buffer = torch.zeros(spec.size_bytes // 4, dtype=torch.float32, device=session.device)
        session.warm_up(buffer)
        # The verdict all-reduce doubles as the barrier before the timed loop.
        failed = session.share_verdicts()
        seconds = session.time_all_reduce(buffer)
        links = session.time_links(buffer) if spec.nodes >= LINK_NODES else []
    except Exception as exc:
        raise StepFailed(ALLREDUCE_FAILED, one_line(exc)) from exc
    finally:
        session.dist.destroy_process_group()
    return seconds, failed, links


def run_worker(
    spec: WorkerSpec, rank: Rank, clock: Timer, ready: Callable[[WorkerResult], None] | None = None
) -> WorkerResult:
    """Check torch and the GPUs, join the gang, share the verdicts, measure (timed by
    ``clock``); raises :class:`StepFailed` on any failure.

    ``ready`` hears the local checks' result before the worker joins the gang, so that
    the agent knows torch and the GPUs were fine even if a peer then never arrives.
    """
    torch, dist = load_torch()
    seen = check_gpus(torch, spec)
    result = WorkerResult(
        rank=rank.rank,
        world_size=rank.world_size,
        python=sys.executable,
        python_version=platform.python_version(),
        torch_version=str(torch.__version__),
        cuda_devices=seen,
    )
    if rank.world_size == 1:
        return result  # no peer: torch and its GPUs were all there was to check
    if ready is not None:
        ready(result)
    seconds, failed, links = measure(join(torch, dist, spec, rank, clock))
    size = spec.size_bytes // 4 * 4
    return replace(
        result,
        seconds_per_iteration=seconds,
        busbw_gbps=bus_bandwidth_gbps(size, seconds, rank.world_size),
        size_bytes=size,
        failed_nodes=failed,
        link_gbps=[size / t / 1e9 if t > 0 else 0.0 for t in links],
    )


def _failure(rank: int, reason: str, message: str) -> WorkerFailure:
    torch = sys.modules.get("torch")
    return WorkerFailure(
        rank=rank,
        reason=reason,
        error=message,
        python=sys.executable,
        python_version=platform.python_version(),
        torch_version=str(getattr(torch, "__version__", "")),
    )


def main(environ: Mapping[str, str] | None = None, clock: Timer | None = None) -> int:
    """Run one rank from the environment; print its result line; 0 on success."""
    env = os.environ if environ is None else environ
    rank_text = env.get("RANK", "-1")
    rank_id = int(rank_text) if rank_text.lstrip("-").isdigit() else -1
    try:
        spec = WorkerSpec.from_json(env[SPEC_VARIABLE])
        rank = Rank.from_env(env)
    except (KeyError, ValueError, TypeError) as exc:
        failure = _failure(rank_id, BAD_REQUEST, f"no preflight request: {one_line(exc)}")
        print(json.dumps(asdict(failure)), flush=True)
        return EXIT_FAILED
    try:
        result = run_worker(spec, rank, clock or _Wall(), ready=_print)
    except StepFailed as exc:
        print(json.dumps(asdict(_failure(rank.rank, exc.reason, str(exc)))), flush=True)
        return EXIT_FAILED
    _print(result)
    return 0


def _print(result: WorkerResult) -> None:
    print(json.dumps(asdict(result)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
