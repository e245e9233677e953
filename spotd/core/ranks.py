"""Each rank's progress, from the job's files through the agent to the daemon's watchdog.

Every rank of a job that trains with :mod:`spotd.train` keeps a small file in the
agent's run folder (beside ``SPOTD_PROGRESS_FILE``), named by its global rank::

    progress-rank-3.json   {"rank": 3, "step": 1200, "pid": 4242, "at": "..."}

The agent reads them for every heartbeat and adds what it sees of each process
(:class:`RankState`); the daemon keeps the readings with the node's report and
watches for a gang whose steps stop moving (:mod:`spotd.engine.hang`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError

RANK_FILE_PREFIX = "progress-rank-"
RANK_FILE_SUFFIX = ".json"
RANK_FILE_GLOB = f"{RANK_FILE_PREFIX}*{RANK_FILE_SUFFIX}"
"""The pattern the agent reads the ranks' files by."""
MAX_RANKS_PER_NODE = 1024
"""The most rank files an agent reads (and a heartbeat carries): far more processes than
a node has GPUs, so a folder filled by mistake cannot swell every heartbeat."""


def rank_file_name(rank: int) -> str:
    """The name of global rank ``rank``'s progress file (``progress-rank-3.json``)."""
    return f"{RANK_FILE_PREFIX}{int(rank)}{RANK_FILE_SUFFIX}"


class RankState(StrEnum):
    """What the agent saw of a rank's process at its last heartbeat."""

    RUNNING = "running"
    """The process exists and is neither stopped nor a zombie (it may be blocked)."""
    STOPPED = "stopped"
    """The process is stopped (SIGSTOP, a debugger): it makes no progress until continued."""
    DEAD = "dead"
    """No such process any more, or a zombie nobody reaped."""
    UNKNOWN = "unknown"
    """The agent cannot see the process (the job runs in a container, or wrote no pid)."""

    @property
    def suspect(self) -> bool:
        """Whether a rank in this state cannot be making progress."""
        return self in (RankState.STOPPED, RankState.DEAD)


class RankReading(BaseModel):
    """One rank of the job, as its file and the agent saw it at one heartbeat."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    rank: int = Field(ge=0)
    """The global rank (torch's ``RANK``)."""
    step: int | None = None
    """The last step the rank reported; None before its first report."""
    pid: int | None = None
    """The rank's process id, as the job saw it."""
    state: RankState = RankState.UNKNOWN


def ranks_json(readings: Sequence[RankReading]) -> str:
    """Readings as the JSON text a report keeps (a list of objects)."""
    return json.dumps([r.model_dump(mode="json") for r in readings], separators=(",", ":"))


def ranks_of(text: str | None) -> tuple[RankReading, ...]:
    """The readings :func:`ranks_json` wrote; none from None or text that is not theirs."""
    if not text:
        return ()
    try:
        data = json.loads(text)
        if not isinstance(data, list):
            return ()
        return tuple(RankReading.model_validate(item) for item in data)
    except (ValueError, ValidationError):
        return ()


def progress_key(
    step: int | None, checkpoint: str | None, readings: Sequence[RankReading]
) -> str | None:
    """What a node's progress is at one heartbeat, as text that changes when any of it
    moves: the job's step and last checkpoint (``SPOTD_PROGRESS_FILE``) and every
    rank's step; a short digest. None when the node reports no progress at all (it
    cannot be watched)."""
    steps = sorted((r.rank, r.step) for r in readings if r.step is not None)
    if step is None and checkpoint is None and not steps:
        return None
    ranks = ",".join(f"{rank}:{at}" for rank, at in steps)
    # A digest: a node of many ranks would otherwise keep kilobytes per report.
    text = f"{step}|{checkpoint or ''}|{ranks}"
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()
