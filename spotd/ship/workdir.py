"""What ``spotd submit`` does with a job's ``workdir``: ship it if it is a local folder."""

from __future__ import annotations

from collections.abc import Collection
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


def with_default_workdir(spec: JobSpec, job_folder: Path, *, daemon_dir: Path) -> JobSpec:
    """``spec`` with the job file's folder as its ``workdir`` when it names none, so that
    a relative script in the command is found on the nodes (docs/job-spec.md).

    Not for a spec that carries ``code`` already, nor when the job file lies in the
    daemon's own ``daemon_dir`` (its data_dir): that folder is the daemon's state,
    never a job's code.
    """
    if spec.workdir is not None or spec.code is not None:
        return spec
    folder = job_folder.absolute()
    if folder.resolve().is_relative_to(daemon_dir.resolve()):
        return spec
    return spec.model_copy(update={"workdir": str(folder)})


def ship_workdir(
    spec: JobSpec,
    storage: str,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    leave_out: Collection[Path] = (),
) -> Shipped:
    """``spec`` with its ``workdir`` packed and stored, when that is a folder here,
    without the folders of ``leave_out`` that lie inside it.

    A spec that already carries ``code`` (submitted before, or made by hand),
    that has no ``workdir``, or whose ``workdir`` exists only on the nodes' image
    goes as it is. Raises :class:`~spotd.ship.pack.WorkdirError` when the folder
    is too large or the storage cannot be written.
    """
    if spec.code is not None or spec.workdir is None or not Path(spec.workdir).is_dir():
        return Shipped(spec, uploaded=False)
    packed = pack_folder(Path(spec.workdir), max_bytes=max_bytes, leave_out=leave_out)
    ref, uploaded = upload(packed, storage)
    return Shipped(spec.model_copy(update={"code": ref}), uploaded)
