"""Secrets out of a process's environment once it has read them.

Taking a variable out of ``os.environ`` (``unsetenv``) is not enough on Linux:
``/proc/PID/environ`` shows the environment a process was started with, as it
lies in the process's memory, to every process of the same user and to root.
A job on the simulated market runs on the daemon's host, often as its user,
and a job on any node runs beside its agent: either could read what its
elders were started with.

So :func:`forget` overwrites a variable's value where the kernel shows it (zero
bytes, the name kept) and then unsets it; :func:`hide` overwrites it there
but keeps the value for the process itself, through a copy that the kernel does
not show, for libraries that read it later (a cloud SDK reads its keys when it
makes a client). Children started after either inherit the value only with
:func:`hide`, and only where they are given the process's environment.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Iterable

__all__ = ["forget", "hide"]

log = logging.getLogger(__name__)


def forget(names: Iterable[str]) -> list[str]:
    """Overwrite and unset the variables ``names``; return those that were set."""
    wanted = {n for n in names if n in os.environ}
    _blank(wanted)
    for name in wanted:
        del os.environ[name]
    return sorted(wanted)


def hide(names: Iterable[str]) -> list[str]:
    """Overwrite the variables ``names`` where ``/proc`` shows them, keeping their values
    in the process's own environment; return those that were set."""
    values = {n: os.environ[n] for n in names if n in os.environ}
    _blank(set(values))
    for name, value in values.items():
        # Through putenv: a new copy of the variable, outside the block /proc reads.
        os.environ[name] = value
    return sorted(values)


def _blank(names: set[str]) -> None:
    """Zero the values of ``names`` in the C environment, where the kernel shows them."""
    if not names or sys.platform != "linux":
        return
    try:
        entries = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError) as exc:
        log.warning("cannot reach the process environment to clear secrets: %s", exc)
        return
    wanted = {os.fsencode(n) for n in names}
    index = 0
    while (address := entries[index]) is not None:
        entry = ctypes.string_at(address)
        name, sep, value = entry.partition(b"=")
        if sep and name in wanted:
            ctypes.memset(address + len(name) + 1, 0, len(value))
        index += 1
