"""``torch.distributed.checkpoint`` (DCP) glue: storage, model state, save and load.

A spotd checkpoint folder ``<uri>/step-XXXXXXXX/`` holds one DCP checkpoint: a
``.metadata`` file from rank 0 and the ranks' ``*.distcp`` shard files, then the
spotd ``_COMPLETE`` marker (written by :class:`spotd.train.Run`, never here).

Local folders (a plain path or ``file://``) use DCP's ``FileSystemWriter``, which
fsyncs every file; any other fsspec URI uses DCP's fsspec writer. Loading goes
through DCP's planner against the *current* world's state dict, which is what
reshards a checkpoint written by a different number of ranks.

torch is imported inside the functions, so this module imports without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from spotd import checkpoints as ck

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed import ProcessGroup
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    from torch.distributed.checkpoint.storage import StorageReader, StorageWriter
    from torch.optim import Optimizer

__all__ = [
    "STATE_KEY",
    "ModelState",
    "WriterFactory",
    "async_supported",
    "load",
    "local_path",
    "make_reader",
    "make_writer",
    "remove_folder",
    "save",
    "start_async_save",
]

STATE_KEY = "_spotd"
"""Key under which a checkpoint keeps spotd's own state (the step)."""

WriterFactory = Callable[[str], "StorageWriter"]
"""Builds the DCP storage writer for one checkpoint folder URI."""


class ModelState:
    """A model and its optimizers as one DCP ``Stateful``.

    ``state_dict`` / ``load_state_dict`` go through
    ``torch.distributed.checkpoint.state_dict.get_state_dict`` / ``set_state_dict``,
    which strip DDP's ``module.`` prefix and handle FSDP/DTensor shards, so a
    checkpoint written under DDP on N ranks loads into a plain or differently
    sharded model on M ranks.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizers: Optimizer | Iterable[Optimizer] = (),
        *,
        options: StateDictOptions | None = None,
    ) -> None:
        from torch.optim import Optimizer

        self.model = model
        self.optimizers: list[Optimizer] = (
            [optimizers] if isinstance(optimizers, Optimizer) else list(optimizers)
        )
        self.options = options

    def state_dict(self) -> dict[str, Any]:
        """``{"model": ..., "optim": ...}`` in DCP's fully qualified names."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizers, options=self.options)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Put a loaded ``{"model": ..., "optim": ...}`` back into the model and optimizers."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(
            self.model,
            self.optimizers,
            model_state_dict=dict(state_dict["model"]),
            optim_state_dict=dict(state_dict.get("optim") or {}),
            options=self.options,
        )


def local_path(uri: str) -> str | None:
    """The local filesystem path behind ``uri``, or None for a remote location."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    fs, path = fsspec.core.url_to_fs(uri)
    return str(path) if isinstance(fs, LocalFileSystem) else None


def make_writer(folder_uri: str) -> StorageWriter:
    """A DCP storage writer for one checkpoint folder (fsynced when local)."""
    path = local_path(folder_uri)
    if path is not None:
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        return FileSystemWriter(path, sync_files=True)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(folder_uri, sync_files=True)


def make_reader(folder_uri: str) -> StorageReader:
    """A DCP storage reader for one checkpoint folder."""
    path = local_path(folder_uri)
    if path is not None:
        from torch.distributed.checkpoint.filesystem import FileSystemReader

        return FileSystemReader(path)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(folder_uri)


def remove_folder(folder_uri: str) -> None:
    """Delete a checkpoint folder and everything in it; a missing one is fine.

    The marker goes first, so a reader racing with the removal never sees a
    "complete" folder with files missing.
    """
    import fsspec

    fs, path = fsspec.core.url_to_fs(folder_uri)
    marker = ck.join(str(path), ck.MARKER)
    if fs.exists(marker):
        fs.rm(marker)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def _single_process() -> bool:
    """Whether no process group is up: DCP then reads and writes this rank alone (and
    says so, unasked, in a warning each time unless told)."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized())


def async_supported() -> bool:
    """Whether this torch has ``torch.distributed.checkpoint.async_save``."""
    from torch.distributed.checkpoint import state_dict_saver

    return hasattr(state_dict_saver, "async_save")


def save(state: dict[str, Any], writer: StorageWriter, group: ProcessGroup | None) -> None:
    """Write ``state`` synchronously; every rank returns once the checkpoint is written."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    dcp_save(state, storage_writer=writer, process_group=group, no_dist=_single_process())


def start_async_save(
    state: dict[str, Any], writer: StorageWriter, group: ProcessGroup | None
) -> Future[Any]:
    """Stage ``state`` to CPU memory and write it on a background thread.

    Returns once the tensors are copied, so training may change them right away; the
    future resolves when this rank's files and (on rank 0) the metadata are written.
    """
    from torch.distributed.checkpoint.state_dict_saver import async_save

    result = async_save(
        state, storage_writer=writer, process_group=group, no_dist=_single_process()
    )
    if isinstance(result, Future):
        return result
    # With an asynchronous stager torch answers with separate staging/upload futures.
    upload: Future[Any] = result.upload_completion
    return upload


def load(state: dict[str, Any], reader: StorageReader, group: ProcessGroup | None) -> None:
    """Load a checkpoint into ``state`` in place, resharding to the current world."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    dcp_load(state, storage_reader=reader, process_group=group, no_dist=_single_process())
