"""What ``spotd submit`` does with a job's ``workdir``: ship it if it is a local folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spotd.core.spec import JobSpec
from spotd.ship.pack import DEFAULT_MAX_BYTES, pack_folder
from spotd.ship.store import upload


@dataclass(frozen=True, slots=True)
class Shipped:
    """The spec as submitted, and what shipping did."""

    spec: JobSpec
    uploaded: bool
    """Whether bytes were written (False: that content was stored already, or nothing shipped)."""


def ship_workdir(spec: JobSpec, storage: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Shipped:
    """``spec`` with its ``workdir`` packed and stored, when that is a folder here.

    A spec that already carries ``code`` (submitted before, or made by hand),
    that has no ``workdir``, or whose ``workdir`` exists only on the nodes' image
    goes as it is. Raises :class:`~spotd.ship.pack.WorkdirError` when the folder
    is too large or the storage cannot be written.
    """
    if spec.code is not None or spec.workdir is None or not Path(spec.workdir).is_dir():
        return Shipped(spec, uploaded=False)
    packed = pack_folder(Path(spec.workdir), max_bytes=max_bytes)
    ref, uploaded = upload(packed, storage)
    return Shipped(spec.model_copy(update={"code": ref}), uploaded)
