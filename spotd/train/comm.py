"""The few collectives :class:`spotd.train.Run` needs, or their one-process stand-ins.

Two process groups are used, for a reason:

* the **default group** carries the per-step agreement (stop? save? is the
  background save done everywhere?). It runs on the training thread, interleaved
  with DDP's own collectives in the same program order on every rank, so it cannot
  cross them. Its tensor lives on the device the backend needs (CPU for gloo, the
  current accelerator for nccl and the like).
* a dedicated **gloo group** carries the checkpoint traffic. ``async_save`` runs
  DCP's collectives on a background thread; on the default group they could
  interleave with the training thread's collectives in a different order on
  different ranks and deadlock. gloo is also what ``async_save`` demands (a CPU
  backend).

Without torch, or without an initialized process group, everything is local: the
rank is 0, the world is 1 and a reduction returns its input.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spotd.core.errors import SpotdError

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

__all__ = ["Comm", "ProcessGroupError"]


class ProcessGroupError(SpotdError):
    """torch.distributed made no process group this rank is in, where it had to."""


def _initialized() -> bool:
    """Whether torch is importable and its default process group is set up."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized())


def _collective_device(backend: str) -> torch.device:
    """The device a tensor must live on for a collective on ``backend``."""
    import torch

    name = backend.lower()
    if name in ("gloo", "mpi") or "cpu:" in name:
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


class Comm:
    """Rank, world size and the agreement collectives of one training job.

    Build it on every rank at the same point of the program, after
    ``torch.distributed.init_process_group``: creating the checkpoint group is itself
    a collective.
    """

    def __init__(self) -> None:
        self.rank = 0
        self.world_size = 1
        self._device: torch.device | None = None
        self.ckpt_group: ProcessGroup | None = None
        if not _initialized():
            _refuse_uninitialized_world()
            return
        import torch.distributed as dist

        self.rank = int(dist.get_rank())
        self.world_size = int(dist.get_world_size())
        self._device = _collective_device(str(dist.get_backend()))
        self.ckpt_group = _new_gloo_group()

    @property
    def distributed(self) -> bool:
        """Whether a process group is in use (possibly of one rank)."""
        return self._device is not None

    @property
    def is_main(self) -> bool:
        """Whether this is global rank 0, the one that writes markers and progress."""
        return self.rank == 0

    def max(self, values: Sequence[float]) -> list[float]:
        """Element-wise maximum of ``values`` over all ranks (default group)."""
        if self._device is None or self.world_size == 1:
            return [float(v) for v in values]
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(list(values), dtype=torch.float64, device=self._device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return [float(v) for v in tensor.cpu().tolist()]

    def barrier(self) -> None:
        """Wait until every rank gets here (a tiny MAX reduction: works on any backend)."""
        self.max([0.0])

    def close(self) -> None:
        """Destroy the checkpoint group once no save uses it any more. Not collective.

        Its gloo worker threads are joined here, with the GIL released, rather than at
        interpreter exit: a worker that still holds the tensors of the last collective
        must take the GIL to free them, and one that tries while Python is finalizing
        aborts the whole process (``terminate called without an active exception``),
        turning a finished run into a failed one.
        """
        group, self.ckpt_group = self.ckpt_group, None
        if group is None or not _initialized():
            return
        import torch.distributed as dist

        dist.destroy_process_group(group)

    def broadcast(self, value: str | None) -> str | None:
        """Rank 0's ``value`` on every rank (over the gloo group, so no device is needed)."""
        if self._device is None or self.world_size == 1:
            return value
        import torch.distributed as dist

        box: list[object] = [value]
        dist.broadcast_object_list(box, src=0, group=self.ckpt_group)
        result = box[0]
        return result if isinstance(result, str) else None


def _refuse_uninitialized_world() -> None:
    """Fail loudly when torchrun started several ranks but nobody set up a group.

    Without a group each rank would write its own "complete" checkpoint into the same
    folder, and nothing would agree on when to stop.
    """
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or "1")
    except ValueError:
        world = 1
    if world > 1:
        raise RuntimeError(
            f"WORLD_SIZE={world} but torch.distributed is not initialized: call "
            "torch.distributed.init_process_group() before creating spotd.train.Run"
        )


def _new_gloo_group() -> ProcessGroup | None:
    """A gloo group over all ranks for checkpoint traffic, or None if gloo is missing."""
    import torch.distributed as dist

    if not dist.is_gloo_available():
        return None
    group = dist.new_group(backend="gloo")
    # new_group answers GroupMember.NON_GROUP_MEMBER (-100) on a rank outside the new
    # group (torch 2.14 says so in its type). Every rank is inside a group of all of
    # them, so that answer means torch and this rank disagree on the world: stop here
    # rather than hand DCP a number where a group belongs.
    if not isinstance(group, dist.ProcessGroup):
        raise ProcessGroupError(
            f"torch.distributed.new_group over all ranks left rank {dist.get_rank()} "
            f"out of the checkpoint group (it answered {group!r})"
        )
    return group
