"""Working-directory archives in storage, by content: upload once, fetch and unpack anywhere.

Storage is any fsspec location. Its archives are named by their SHA-256
(``<storage>/<sha256>.tar.gz``), so a second upload of the same content finds
it there and writes nothing, and a fetch checks the bytes against the name
before it unpacks them (with tarfile's ``data`` filter: no absolute paths, no
``..``, no links out of the folder, no devices).
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import shutil
import tarfile
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import fsspec

from spotd.core.spec import CodeRef, JobSpec
from spotd.ship.pack import Packed, WorkdirError

MARKER = ".spotd-code"
"""File in an unpacked folder holding the SHA-256 it was unpacked from."""
FOLDER = "spotd-code"
"""Where in a remote checkpoint location's bucket the archives go, when no storage is set."""


def archive_uri(storage: str, sha256: str) -> str:
    """Where the archive of this content lives in ``storage``."""
    return f"{storage.rstrip('/')}/{sha256}.tar.gz"


def storage_for(spec: JobSpec, configured: str | None, data_dir: Path) -> str:
    """Where ``spec``'s working directory is stored.

    The daemon's ``[storage] uri`` when set; else beside the job's checkpoints when
    those are remote (``<scheme>://<bucket>/spotd-code``: the nodes can read there
    already); else the daemon's ``data_dir``, which only nodes on this machine (the
    simulated market) can read.
    """
    if configured:
        return configured
    uri = spec.checkpoint.uri or ""
    last = uri.split("::")[-1]
    parts = urlsplit(last)
    if parts.scheme and parts.scheme != "file" and parts.netloc:
        return f"{uri[: len(uri) - len(last)]}{parts.scheme}://{parts.netloc}/{FOLDER}"
    return str(data_dir / "code")


def upload(packed: Packed, storage: str) -> tuple[CodeRef, bool]:
    """Store ``packed`` under its digest; the reference, and whether bytes were written."""
    uri = archive_uri(storage, packed.sha256)
    ref = CodeRef(uri=uri, sha256=packed.sha256, size_bytes=len(packed.data), files=packed.files)
    try:
        fs, path = fsspec.core.url_to_fs(uri)
        if fs.exists(path) and fs.size(path) == len(packed.data):
            return ref, False
        fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fs.pipe_file(path, packed.data)
    except (OSError, ValueError, ImportError) as exc:
        raise WorkdirError(f"cannot store the workdir at {uri}: {exc}") from exc
    return ref, True


def fetch(ref: CodeRef, dest: Path) -> Path:
    """Unpack ``ref`` into ``dest`` (made or replaced), unless it already holds it.

    Raises :class:`WorkdirError` when the archive cannot be read or its bytes do
    not match its digest.
    """
    if (dest / MARKER).is_file() and (dest / MARKER).read_text().strip() == ref.sha256:
        return dest
    try:
        with fsspec.open(ref.uri, "rb") as handle:
            data = handle.read()
    except (OSError, ValueError, ImportError) as exc:
        raise WorkdirError(f"cannot read the workdir archive {ref.uri}: {exc}") from exc
    found = hashlib.sha256(data).hexdigest()
    if found != ref.sha256:
        raise WorkdirError(f"workdir archive {ref.uri} is not what was shipped: "
                           f"its SHA-256 is {found}, not {ref.sha256}")  # fmt: skip
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(staging, filter="data")
        (staging / MARKER).write_text(ref.sha256 + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    except (OSError, tarfile.TarError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise WorkdirError(f"cannot unpack {ref.uri} into {dest}: {exc}") from exc
    return dest
