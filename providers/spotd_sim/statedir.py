"""The simulator's state directory: file names, atomic JSON files and VM locks.

Layout (all under one directory shared by the three sim providers)::

    clock.json              the SimClock epoch pair and speed
    launches.log            "<client_token> <instance_id>" per VM process spawned
    tokens/<hash>.json      instance ids reserved for one (provider, client token)
    <id>.spec.json          what to run: pool, market, tags, command, env, price...
    <id>.state.json         what the VM reports: pid, state, exit code, sim times
    <id>.lock               flock held by the VM process for its whole life
    <id>.terminate          terminate request (exists = requested)
    <id>.log                the job's stdout and stderr
    <id>.vm.log             the VM process's own output

Every JSON file is written to a temporary file and renamed into place, so a
reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

LOCK_FD_ENV = "SPOTD_SIM_VM_LOCK_FD"
"""Set for a VM process: the fd of its instance lock, already taken for it."""


def write_json_atomic(path: Path, data: object) -> None:
    """Replace ``path`` with ``data`` as JSON in one rename."""
    tmp = _tmp_path(path)
    _write_synced(tmp, data)
    tmp.replace(path)


def publish_json_once(path: Path, data: object) -> object:
    """Create ``path`` with ``data`` unless it exists; return what it holds.

    Racing creators agree on one content: the hard link only succeeds for
    the first of them.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(path)
    _write_synced(tmp, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return read_json(path)


def read_json(path: Path) -> object:
    """The JSON content of ``path`` (raises OSError or ValueError)."""
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def read_json_or_none(path: Path) -> dict[str, object] | None:
    """The JSON object in ``path``, or None when it is missing."""
    try:
        data = read_json(path)
    except FileNotFoundError:
        return None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def append_line(path: Path, line: str) -> None:
    """Append one line; O_APPEND keeps concurrent writers' lines whole."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _write_synced(path: Path, data: object) -> None:
    with path.open("w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


class StateDir:
    """Paths of the files in one simulator state directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def ensure(self) -> None:
        """Create the directory tree."""
        (self.root / "tokens").mkdir(parents=True, exist_ok=True)

    @property
    def launches_log(self) -> Path:
        return self.root / "launches.log"

    @property
    def launch_lock(self) -> Path:
        return self.root / "launch.lock"

    def token(self, provider: str, client_token: str) -> Path:
        # Tokens are caller text: hash them into a safe, fixed-length name.
        digest = hashlib.sha256(f"{provider}\0{client_token}".encode()).hexdigest()[:32]
        return self.root / "tokens" / f"{digest}.json"

    def spec(self, instance_id: str) -> Path:
        return self.root / f"{instance_id}.spec.json"

    def state(self, instance_id: str) -> Path:
        return self.root / f"{instance_id}.state.json"

    def lock(self, instance_id: str) -> Path:
        return self.root / f"{instance_id}.lock"

    def terminate_request(self, instance_id: str) -> Path:
        return self.root / f"{instance_id}.terminate"

    def reclaim_request(self, instance_id: str) -> Path:
        return self.root / f"{instance_id}.reclaim"

    def stall_request(self, instance_id: str) -> Path:
        return self.root / f"{instance_id}.stall"

    def run_dir(self, instance_id: str) -> Path:
        """The agent's folder on the node: hostfile, notice and progress files."""
        return self.root / "run" / instance_id

    @property
    def address_counter(self) -> Path:
        return self.root / "addresses.next"

    def job_log(self, instance_id: str) -> Path:
        return self.root / f"{instance_id}.log"

    def vm_log(self, instance_id: str) -> Path:
        return self.root / f"{instance_id}.vm.log"

    def spec_files(self) -> list[Path]:
        return sorted(self.root.glob("*.spec.json"))


def open_lock(path: Path) -> int:
    """A file descriptor on the lock file ``path`` (created if missing)."""
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def try_lock(fd: int) -> bool:
    """Take the exclusive flock on ``fd`` without waiting; False if held elsewhere."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def lock_is_held(path: Path) -> bool:
    """Whether some process holds the flock on ``path`` (a live VM does)."""
    if not path.exists():
        return False
    fd = open_lock(path)
    try:
        return not try_lock(fd)
    finally:
        # Closing drops the lock if we just took it.
        os.close(fd)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the exclusive flock on ``path`` for the ``with`` block (blocking)."""
    fd = open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
