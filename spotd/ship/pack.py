"""Pack a working directory into a reproducible ``.tar.gz``.

What is left out follows git's rules: the patterns of the folder's
``.gitignore`` and ``.spotdignore`` files (at any depth, each relative to its
own folder, matched by ``pathspec``), and ``.git`` itself. The archive is the
same bytes for the same content: entries sorted, times, owners and the gzip
header zeroed, modes reduced to 0644 or 0755. So its SHA-256 names the content,
and the same folder is uploaded once.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import pathspec

from spotd.core.errors import SpotdError

IGNORE_FILES = (".gitignore", ".spotdignore")
ALWAYS_LEFT_OUT = (".git/",)
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
"""The most a working directory may hold (its files' sizes added up)."""


class WorkdirError(SpotdError):
    """The working directory cannot be shipped: missing, too large, unreadable."""


@dataclass(frozen=True, slots=True)
class Packed:
    """A packed working directory: the archive's bytes and what it holds."""

    data: bytes
    sha256: str
    files: int
    content_bytes: int
    """The files' sizes added up (before compression)."""


def pack_folder(
    root: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, leave_out: Collection[Path] = ()
) -> Packed:
    """The archive of ``root``'s files that the ignore files do not leave out, nor
    ``leave_out`` (folders inside ``root`` that are state, not code: the daemon's
    data_dir, the job's own checkpoints).

    Raises :class:`WorkdirError` naming the folder when it is not one, and
    naming the largest entries when the files add up to more than ``max_bytes``.
    """
    if not root.is_dir():
        raise WorkdirError(f"workdir {root} is not a folder on this machine")
    skipped = frozenset(p.resolve() for p in leave_out)
    files = sorted(_kept_files(root, skipped), key=lambda p: p.as_posix())
    total = sum(f.stat().st_size for f in files)
    if total > max_bytes:
        raise WorkdirError(_too_large(root, files, total, max_bytes))
    raw = io.BytesIO()
    # mtime=0 and no file name in the gzip header: the same content, the same bytes.
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz, tarfile.open(
        fileobj=gz, mode="w", format=tarfile.PAX_FORMAT
    ) as tar:
        for path in files:
            _add(tar, root, path)
    data = raw.getvalue()
    return Packed(data, hashlib.sha256(data).hexdigest(), len(files), total)


def _kept_files(root: Path, skipped: frozenset[Path]) -> Iterator[Path]:
    """Regular files and symlinks under ``root`` that no ignore rule leaves out, outside
    the ``skipped`` folders (resolved paths)."""
    specs: dict[Path, pathspec.GitIgnoreSpec] = {}
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        specs[here] = _spec_of(here)
        rel = here.relative_to(root)
        dirs[:] = sorted(d for d in dirs if not _ignored(root, specs, rel / d, is_dir=True)
                         and (here / d).resolve() not in skipped)  # fmt: skip
        # A link to a folder goes in as the link (os.walk does not follow it).
        names += [d for d in dirs if (here / d).is_symlink()]
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
        for name in sorted(names):
            if not _ignored(root, specs, rel / name, is_dir=False):
                yield here / name


def _spec_of(folder: Path) -> pathspec.GitIgnoreSpec:
    lines: list[str] = []
    for name in IGNORE_FILES:
        path = folder / name
        if path.is_file():
            lines += path.read_text(errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _ignored(
    root: Path, specs: dict[Path, pathspec.GitIgnoreSpec], rel: Path, *, is_dir: bool
) -> bool:
    """Whether ``rel`` (relative to ``root``) is left out by an ignore file above it."""
    text = rel.as_posix() + ("/" if is_dir else "")
    if any(text == p or text.startswith(p) for p in ALWAYS_LEFT_OUT):
        return True
    # Each ignore file speaks for its own folder; the deepest one that decides wins.
    verdict = False
    for depth in range(len(rel.parts)):
        folder = root.joinpath(*rel.parts[:depth])
        spec = specs.get(folder)
        if spec is None:
            continue
        sub = Path(*rel.parts[depth:]).as_posix() + ("/" if is_dir else "")
        result = spec.check_file(sub)
        if result.include is not None:
            verdict = bool(result.include)
    return verdict


def _add(tar: tarfile.TarFile, root: Path, path: Path) -> None:
    info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if info.issym():
        info.mode = 0o777
        tar.addfile(info)
        return
    if not info.isfile():
        return  # sockets, fifos, devices: nothing a job's code needs
    executable = path.stat().st_mode & stat.S_IXUSR
    info.mode = 0o755 if executable else 0o644
    with path.open("rb") as handle:
        tar.addfile(info, handle)


def _too_large(root: Path, files: list[Path], total: int, limit: int) -> str:
    sizes: dict[str, int] = {}
    for f in files:
        top = f.relative_to(root).parts[0]
        sizes[top] = sizes.get(top, 0) + f.stat().st_size
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    listed = ", ".join(f"{name} ({_mib(size)})" for name, size in biggest)
    return (
        f"workdir {root} holds {_mib(total)}, over the {_mib(limit)} limit; largest: {listed}. "
        "Leave data and outputs out with a .spotdignore (gitignore syntax) and stage "
        "them in `setup` or read them from storage"
    )


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
