"""Process-group helpers: signal a job's group, tell a reused pid from ours."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), None when unknown or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may hold spaces: split after the last ')'.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def signal_group(pgid: int, sig: signal.Signals, expected_start: int | None = None) -> None:
    """Send ``sig`` to process group ``pgid``; quiet when it is already gone.

    With ``expected_start``, a live leader with another start time means the
    pid was reused: our group cannot exist then, so nothing is sent.
    """
    if expected_start is not None:
        actual = start_ticks(pgid)
        if actual is not None and actual != expected_start:
            return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux; False elsewhere).

    A launcher may start its workers in sessions of their own (torchrun does):
    they escape a signal to the job's group or session, but as orphans they
    are re-parented here, so :func:`kill_descendants` still finds them.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def kill_descendants(pid: int) -> None:
    """SIGKILL every process below ``pid`` in the process tree."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[-1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    below, todo = [], list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        below.append(child)
        todo.extend(children.get(child, ()))
    for child in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent dies.

    Linux only (None elsewhere). It covers a VM process killed with SIGKILL:
    like a real VM going away, its job must not live on.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        # The parent may have died before prctl took effect.
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec
