"""The ranks' own progress files in the run folder, and what the agent sees of their processes.

Every rank of a job that trains with :mod:`spotd.train` keeps
``progress-rank-<global rank>.json`` (step and pid) in the agent's run folder
(:mod:`spotd.core.ranks`). The agent reads them for each heartbeat and adds the
state of each rank's process: running, stopped, dead (gone or a zombie), or
unknown where it cannot see the process (a job in a container has pids of its
own). A job that writes no such file sends no ranks; its single progress file
(:mod:`spotd.agent.files`) still says how far it got.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from spotd.core.agent_wire import IMAGE
from spotd.core.ranks import MAX_RANKS_PER_NODE, RANK_FILE_GLOB, RankReading, RankState

log = logging.getLogger(__name__)

PROC = Path("/proc")

_DEAD = frozenset("ZXx")
"""``/proc/<pid>/stat`` states of a process that is gone: zombie, dead."""
_STOPPED = frozenset("Tt")
"""States of a process that is stopped: by a signal, or by a tracer."""


def job_ranks(run_dir: Path, job_env: Mapping[str, str]) -> tuple[RankReading, ...]:
    """The ranks of the job started with ``job_env``: their pids are the agent's to look
    at unless the job runs in an image (a container has pids of its own)."""
    return read_ranks(run_dir, pids_visible=not job_env.get(IMAGE))


def read_ranks(
    run_dir: Path, *, pids_visible: bool = True, proc: Path = PROC
) -> tuple[RankReading, ...]:
    """Every rank's file in ``run_dir``, by rank, each with its process's state
    (:data:`~spotd.core.ranks.RankState.UNKNOWN` for all when not ``pids_visible``).
    Unreadable files are skipped: the next heartbeat reads them again."""
    found: dict[int, RankReading] = {}
    for path in itertools.islice(run_dir.glob(RANK_FILE_GLOB), MAX_RANKS_PER_NODE):
        reading = _read_one(path)
        if reading is None:
            continue
        state = RankState.UNKNOWN
        if pids_visible and reading.pid is not None:
            state = process_state(reading.pid, proc)
        found[reading.rank] = reading.model_copy(update={"state": state})
    return tuple(found[rank] for rank in sorted(found))


def process_state(pid: int, proc: Path = PROC) -> RankState:
    """What process ``pid`` is doing, from ``/proc/<pid>/stat`` where there is one."""
    if pid <= 0:
        return RankState.UNKNOWN
    if not proc.is_dir():
        return _signal_zero(pid)
    try:
        text = (proc / str(pid) / "stat").read_text()
    except FileNotFoundError:
        return RankState.DEAD
    except OSError:
        return _signal_zero(pid)
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last ")".
    fields = text.rpartition(")")[2].split()
    letter = fields[0] if fields else ""
    if letter in _DEAD:
        return RankState.DEAD
    if letter in _STOPPED:
        return RankState.STOPPED
    return RankState.RUNNING


def _signal_zero(pid: int) -> RankState:
    """Whether ``pid`` exists, without ``/proc``: signal 0 checks and sends nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return RankState.DEAD
    except PermissionError:
        return RankState.RUNNING  # it exists, as another user's
    except OSError:
        return RankState.UNKNOWN
    return RankState.RUNNING


def _read_one(path: Path) -> RankReading | None:
    try:
        return RankReading.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        return None  # replaced or removed between the listing and the read
    except (OSError, ValueError, ValidationError) as exc:
        log.warning("unreadable rank progress file %s: %s", path.name, exc)
        return None
