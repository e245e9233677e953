"""One rank of a gang's preflight: ``python -m spotd.agent.preflight_worker``.

:func:`spotd.agent.preflight.run_preflight` starts one of these per local
process. The rank comes from the usual torch variables (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), the rest of
the work from ``SPOTD_PREFLIGHT_SPEC`` (a :class:`WorkerSpec` as JSON).

The worker joins the gang's process group on a TCP store at the master, shares
its node's check verdict, times all-reduces, and prints one :class:`WorkerResult`
as a JSON line on stdout (exit 0), or a :class:`WorkerFailure` (exit 1).

Every rank of the gang ends with the same figures: the time is the slowest
rank's (all-reduce MAX), the node verdicts are all-reduced with MIN, and the
failing nodes' reasons are read from the store, where each node's local rank 0
put its own before the all-reduce.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spotd.core.clock import WALL

if TYPE_CHECKING:
    from spotd.core.contracts import Clock

SPEC_VARIABLE = "SPOTD_PREFLIGHT_SPEC"
EXIT_FAILED = 1
_PINNED_GLOO = "spotd-gloo"
_FAILURE_KEY = "spotd-preflight/node/{}"

Backend = Literal["nccl", "gloo"]


class WorkerSpec(BaseModel):
    """What every worker of one node is asked to do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Backend
    nodes: int = Field(ge=1)
    node_rank: int = Field(ge=0)
    node_addr: str = ""
    """This node's address for gloo to listen on; empty: gloo's own choice (the host name's)."""
    size_bytes: int = Field(ge=4)
    iterations: int = Field(ge=1)
    warmup: int = Field(ge=0)
    timeout_seconds: float = Field(gt=0)
    node_failure: str = ""
    """Why this node's own checks failed, one line; empty when they passed."""


class WorkerResult(BaseModel):
    """One rank's view of the gang; the same on every rank."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    rank: int
    world_size: int
    seconds_per_iteration: float
    """The slowest rank's mean time of one all-reduce."""
    busbw_gbps: float
    size_bytes: int
    failed_nodes: dict[int, str] = Field(default_factory=dict)
    """Node rank -> why its own checks failed."""


class WorkerFailure(BaseModel):
    """The worker could not finish (no peer, a backend error)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    rank: int
    error: str


def bus_bandwidth_gbps(size_bytes: int, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth as nccl-tests define it, in GB/s (1e9 bytes/s).

    algbw = size / time; busbw = algbw * 2 (n - 1) / n, the share of the data
    every rank must send and receive in a ring, so figures compare across n.
    """
    algbw = size_bytes / seconds
    return algbw * 2 * (world_size - 1) / world_size / 1e9


class _Rank(BaseModel):
    model_config = ConfigDict(frozen=True)

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> _Rank:
        return cls(
            rank=int(environ["RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            local_rank=int(environ["LOCAL_RANK"]),
            master_addr=environ["MASTER_ADDR"],
            master_port=int(environ["MASTER_PORT"]),
        )


def _load_torch() -> tuple[Any, Any]:
    # Behind Any on purpose: torch's inline types make mypy walk the whole torch
    # package (about 25 s per fresh run on a 2-core machine) for a dozen calls.
    torch = importlib.import_module("torch")
    dist = importlib.import_module("torch.distributed")
    return torch, dist


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
class _Session:
    """One rank's handles on torch, its store and its device (torch kept behind Any), and
    the clock that times its all-reduces."""

    torch: Any
    dist: Any
    store: Any
    device: Any
    spec: WorkerSpec
    rank: _Rank
    clock: Clock

    def synchronize(self) -> None:
        """Wait for queued CUDA work: collectives there are asynchronous."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def share_verdicts(self) -> dict[int, str]:
        """Node rank -> failure reason, for every node whose own checks failed."""
        spec = self.spec
        flags = self.torch.ones(spec.nodes, dtype=self.torch.int32, device=self.device)
        if self.rank.local_rank == 0 and spec.node_failure:
            flags[spec.node_rank] = 0
        # A collective returns only once every rank took part, so every node's
        # local rank 0 has already put its reason in the store (run_worker does
        # that before joining the group).
        self.dist.all_reduce(flags, op=self.dist.ReduceOp.MIN)
        failed = [i for i, ok in enumerate(flags.tolist()) if ok == 0]
        return {i: bytes(self.store.get(_FAILURE_KEY.format(i))).decode() for i in failed}

    def warm_up(self, buffer: Any) -> None:
        """Run the untimed all-reduces: the first ones set up connections and buffers."""
        for _ in range(self.spec.warmup):
            self.dist.all_reduce(buffer)
        self.synchronize()

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


def _device(torch: Any, spec: WorkerSpec, rank: _Rank) -> Any:
    if spec.backend != "nccl":
        return torch.device("cpu")
    device = torch.device("cuda", rank.local_rank)
    torch.cuda.set_device(device)
    return device


def _join(spec: WorkerSpec, rank: _Rank, clock: Clock) -> _Session:
    """Open the store, publish this node's verdict, join the process group."""
    torch, dist = _load_torch()
    timeout = timedelta(seconds=spec.timeout_seconds)
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
    return _Session(
        torch=torch, dist=dist, store=store, device=device, spec=spec, rank=rank, clock=clock
    )


def run_worker(spec: WorkerSpec, rank: _Rank, clock: Clock = WALL) -> WorkerResult:
    """Join the gang, share the node verdicts, measure (timed by ``clock``); raises on any
    failure."""
    session = _join(spec, rank, clock)
    try:
        # Zeros: the sums stay zero, so no overflow to inf however many iterations.
        buffer = session.torch.zeros(
            spec.size_bytes // 4, dtype=session.torch.float32, device=session.device
        )
        session.warm_up(buffer)
        # The verdict all-reduce doubles as the barrier before the timed loop.
        failed = session.share_verdicts()
        seconds = session.time_all_reduce(buffer)
    finally:
        session.dist.destroy_process_group()
    size = spec.size_bytes // 4 * 4
    return WorkerResult(
        rank=rank.rank,
        world_size=rank.world_size,
        seconds_per_iteration=seconds,
        busbw_gbps=bus_bandwidth_gbps(size, seconds, rank.world_size),
        size_bytes=size,
        failed_nodes=failed,
    )


def main(environ: Mapping[str, str] | None = None) -> int:
    """Run one rank from the environment; print its result line; 0 on success."""
    env = os.environ if environ is None else environ
    rank_id = int(env.get("RANK", "-1"))
    try:
        spec = WorkerSpec.model_validate_json(env[SPEC_VARIABLE])
        result = run_worker(spec, _Rank.from_env(env), WALL)
    except Exception as exc:
        message = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
        print(WorkerFailure(rank=rank_id, error=message).model_dump_json(), flush=True)
        return EXIT_FAILED
    print(result.model_dump_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
