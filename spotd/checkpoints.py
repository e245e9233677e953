"""Where a job's checkpoints live and how spotd tells a complete one from a torn one.

Layout
------
spotd hands every job a checkpoint folder URI in ``SPOTD_CHECKPOINT_URI``. It may be
a plain local path (``/data/ckpt``), a ``file://`` URI or any other fsspec URI
(``s3://bucket/job``, ``gs://...``, ``memory://...``). Inside it, each checkpoint is
one folder named after the training step it captures::

    <uri>/
        step-00000040/
            weights.npy          the job's own files, any names it likes
            state.json
            _COMPLETE            the marker, written LAST
        step-00000050/           no marker: a torn write, ignored
            weights.npy

The step is zero-padded to 8 digits (:func:`checkpoint_name`) so names sort like
numbers; larger steps simply get more digits, and spotd sorts by the parsed number.

A checkpoint is *complete* only once the file :data:`MARKER` exists inside its
folder. A job must write every other file first and the marker last, so a job that
is killed mid-write (the SIGKILL after a preemption notice) leaves a folder without
a marker, which :func:`list_complete` skips. Jobs written in Python can call
:func:`mark_complete`; others just create an empty ``_COMPLETE`` file at the end.

When spotd resumes a job it passes the URI of the latest complete checkpoint
(:func:`latest_complete`) in ``SPOTD_RESUME_FROM``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import known_implementations

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.errors import CheckpointError
from spotd.files import write_atomic

__all__ = [
    "MARKER",
    "CheckpointInfo",
    "check_location",
    "check_writable",
    "checkpoint_name",
    "is_complete",
    "join",
    "latest_complete",
    "list_complete",
    "list_files",
    "mark_complete",
    "read_bytes",
    "write_bytes",
]

MARKER = "_COMPLETE"
"""Name of the file whose presence makes a checkpoint folder complete."""

_STEP_DIR = re.compile(r"step-(\d{8,})")


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint: its folder URI (same scheme as the root) and its step."""

    uri: str
    step: int


def checkpoint_name(step: int) -> str:
    """Return the folder name of the checkpoint for ``step``, e.g. ``step-00000040``."""
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    return f"step-{step:08d}"


def join(uri: str, *parts: str) -> str:
    """Append path segments to a local path or URI with ``/``.

    Works on the string so the scheme (``file://``, ``memory://``, ``s3://``) and
    anything fsspec needs in it are kept as given. Slashes at the edges of each part
    are dropped and empty parts are skipped.
    """
    # Strip trailing slashes, but never eat into "scheme://" itself.
    head = uri
    while head.endswith("/") and not head.endswith("://") and head != "/":
        head = head[:-1]
    out = head
    for part in parts:
        seg = part.strip("/")
        if not seg:
            continue
        out = out + seg if out.endswith("/") else f"{out}/{seg}"
    return out


def check_location(uri: str) -> None:
    """Raise CheckpointError if this daemon cannot open locations like ``uri`` at all:
    an unknown scheme, or one whose fsspec backend (s3fs, gcsfs, adlfs) is not
    installed. It touches no storage, so it says nothing of credentials or network."""
    links = uri.split("::")  # a chain such as simplecache::s3://bucket/run
    for i, link in enumerate(links):
        protocol = fsspec.core.split_protocol(link)[0]
        if protocol is None:  # a bare layer name, or a plain path at the end
            protocol = link if i < len(links) - 1 else "file"
        try:
            fsspec.get_filesystem_class(protocol)
        except (ValueError, ImportError) as exc:
            raise _unopenable(uri, protocol, exc) from exc


def _unopenable(uri: str, protocol: str, exc: Exception) -> CheckpointError:
    """Why ``uri`` cannot be opened, in one line. A missing backend is named by the
    package fsspec's own registry gives for ``protocol`` (``gcsfs`` for ``gs``), the
    top of its implementation's module path, so spotd keeps no list of its own."""
    known = known_implementations.get(protocol)
    if isinstance(exc, ImportError) and known is not None:
        package = str(known["class"]).split(".", 1)[0]
        return CheckpointError(
            f"{uri}: needs {package}, which this daemon lacks; "
            f"pip install {package} beside the daemon"
        )
    return CheckpointError(f"{uri}: this daemon cannot open such locations: {exc}")


_PSEUDO_FILESYSTEMS = frozenset({
    "autofs", "binfmt_misc", "bpf", "cgroup", "cgroup2", "configfs", "debugfs", "devpts",
    "devtmpfs", "efivarfs", "fusectl", "hugetlbfs", "mqueue", "nsfs", "proc", "pstore",
    "rpc_pipefs", "securityfs", "selinuxfs", "sysfs", "tracefs",
})  # fmt: skip
"""Linux filesystems that are the kernel's view of the system, not storage."""

_MOUNTS = Path("/proc/self/mounts")


def check_writable(uri: str, clock: Clock = WALL) -> None:
    """Raise CheckpointError when a local ``uri`` is no place to write checkpoints.

    The folder need not exist yet, but the nearest folder of it that does must be
    one this process may write, on a writable filesystem that is storage (not
    /proc or /sys); and a missing folder right under ``/`` is refused rather than
    created there. Other locations (``s3://``, ``gs://``, chains) are not probed.
    ``clock`` paces the reads of the mount table.
    """
    if "::" in uri or fsspec.core.split_protocol(uri)[0] not in (None, "file", "local"):
        return  # a remote store is not probed: that would need its credentials here
    _, path = _fs(uri)
    try:
        problem = _local_problem(Path(path), clock)
    except OSError as exc:  # a folder on the way the daemon may not even look into
        problem = f"cannot look at it: {exc}"
    if problem is not None:
        raise CheckpointError(f"{uri}: {problem}")


def _local_problem(target: Path, clock: Clock) -> str | None:
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if existing != target and existing == Path(existing.anchor):
        top = Path(existing.anchor, target.relative_to(existing).parts[0])
        return (f"{top} does not exist, and spotd creates no folder at the top of the "
                "filesystem: create it first, or correct the path")  # fmt: skip
    fstype = _filesystem_type(existing, clock)
    if fstype in _PSEUDO_FILESYSTEMS:
        return f"{existing} is on {fstype}, a pseudo filesystem of the kernel, not storage"
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        return f"{existing} is on a read-only filesystem"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by the daemon's user"
    return None


def _filesystem_type(path: Path, clock: Clock) -> str | None:
    """The type of the filesystem ``path`` is on (Linux's mount table); None elsewhere."""
    real = str(path.resolve())
    longest, fstype = -1, None
    for point, kind in _mount_table(int(clock.monotonic())):
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        # The last of the longest: a later mount over the same point hides the earlier.
        if inside and len(point) >= longest:
            longest, fstype = len(point), kind
    return fstype


@lru_cache(maxsize=1)
def _mount_table(second: int) -> tuple[tuple[str, str], ...]:
    """(mount point, filesystem type) of each mount, read again each ``second`` (of
    a clock's monotonic seconds): a burst of submits reads the table once, not once each."""
    try:
        table = _MOUNTS.read_text(encoding="utf-8")
    except OSError:
        return ()
    mounts = []
    for line in table.splitlines():
        fields = line.split(" ", 3)
        if len(fields) < 3:
            continue
        point = fields[1]
        if "\\" in point:  # a space in a mount point is written \040 (tab, newline alike)
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), point)
        mounts.append((point, fields[2]))
    return tuple(mounts)


def _fs(uri: str) -> tuple[Any, str]:
    """Resolve ``uri`` to (fsspec filesystem, path), failing as CheckpointError."""
    try:
        fs, path = fsspec.core.url_to_fs(uri)
    except (ValueError, ImportError) as exc:
        # Unknown scheme, or the scheme's optional backend (s3fs, gcsfs) is missing.
        raise CheckpointError(f"{uri}: cannot open checkpoint location: {exc}") from exc
    return fs, str(path)


def list_complete(uri: str) -> list[CheckpointInfo]:
    """List the complete checkpoints under the checkpoint folder ``uri``, oldest first.

    Folders that are not named ``step-<digits>`` or that lack the :data:`MARKER` are
    skipped. A root that does not exist yet yields ``[]`` (the job has not written
    anything). Any other failure, including a root that is a file, raises
    :class:`~spotd.core.errors.CheckpointError` naming ``uri``.
    """
    fs, root = _fs(uri)
    try:
        if fs.isfile(root):
            raise CheckpointError(f"{uri}: checkpoint location is a file, not a folder")
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CheckpointError(f"{uri}: cannot list checkpoints: {exc}") from exc

    found: list[CheckpointInfo] = []
    for entry in entries:
        if entry.get("type") != "directory":
            continue
        name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
        match = _STEP_DIR.fullmatch(name)
        if match is None:
            continue
        folder = join(uri, name)
        if _marker_exists(fs, join(root, name), folder):
            found.append(CheckpointInfo(uri=folder, step=int(match.group(1))))
    found.sort(key=lambda info: info.step)
    return found


def list_files(folder_uri: str) -> list[str]:
    """The URIs of the files directly inside ``folder_uri``, sorted; ``[]`` when it does
    not exist. Any other failure raises :class:`~spotd.core.errors.CheckpointError`."""
    fs, folder = _fs(folder_uri)
    try:
        entries = fs.ls(folder, detail=True)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CheckpointError(f"{folder_uri}: cannot list: {exc}") from exc
    names = (str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries
             if e.get("type") == "file")  # fmt: skip
    return [join(folder_uri, name) for name in sorted(names)]


def _marker_exists(fs: Any, folder_path: str, folder_uri: str) -> bool:
    try:
        return bool(fs.isfile(join(folder_path, MARKER)))
    except FileNotFoundError:
        # The folder was deleted (retention) between the listing and this check.
        return False
    except OSError as exc:
        raise CheckpointError(f"{folder_uri}: cannot check for {MARKER}: {exc}") from exc


def latest_complete(uri: str) -> CheckpointInfo | None:
    """Return the complete checkpoint with the highest step under ``uri``, or None."""
    complete = list_complete(uri)
    return complete[-1] if complete else None


def is_complete(folder_uri: str) -> bool:
    """Tell whether the checkpoint folder ``folder_uri`` holds its :data:`MARKER`."""
    fs, path = _fs(folder_uri)
    return _marker_exists(fs, path, folder_uri)


def mark_complete(folder_uri: str) -> None:
    """Write the :data:`MARKER` into ``folder_uri``; call it after every other file.

    On a local filesystem the marker appears atomically (temp file, fsync, rename).
    """
    write_bytes(join(folder_uri, MARKER), b"")


def write_bytes(file_uri: str, data: bytes) -> None:
    """Write ``data`` to ``file_uri`` so that readers never see a partial file.

    Local files are written to a temporary name in the same folder, fsynced and
    renamed over the target. Other filesystems get one ``pipe_file`` call: object
    stores publish an object only once its upload is finished, so the file is
    whole or absent there too. Parent folders are created as needed.
    """
    fs, path = _fs(file_uri)
    try:
        if isinstance(fs, LocalFileSystem):
            write_atomic(Path(path), data)
        else:
            parent = path.rsplit("/", 1)[0]
            if parent:
                fs.makedirs(parent, exist_ok=True)
            fs.pipe_file(path, data)
    except OSError as exc:
        raise CheckpointError(f"{file_uri}: cannot write: {exc}") from exc


def read_bytes(file_uri: str) -> bytes:
    """Read the whole file at ``file_uri``; failures raise CheckpointError."""
    fs, path = _fs(file_uri)
    try:
        return bytes(fs.cat_file(path))
    except OSError as exc:
        raise CheckpointError(f"{file_uri}: cannot read: {exc}") from exc


