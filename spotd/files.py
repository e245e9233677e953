"""Writing a file so that a reader sees the old content or the whole new one, never half."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path


def write_atomic(target: Path, data: bytes) -> None:
    """Replace ``target`` with ``data``: temp file, fsync, rename, fsync of the folder.

    The temp name is unique per writer, so two writers racing on one folder
    never share a temp file. Without the fsync a host crash could leave a
    renamed but empty file (a checkpoint marker before its weights, say).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def fsync_dir(folder: Path) -> None:
    """Persist a rename in ``folder``; best effort, as some filesystems refuse it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
