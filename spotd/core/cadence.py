"""When a job checkpoints, and what its checkpoints cost it in time: pure, from its spec.

The daemon plans with these (the attempt's interval, whether a preemption
loses work) and the policies price them; the checkpoints themselves are
written and read by :mod:`spotd.checkpoints`.
"""

from __future__ import annotations

import math
from datetime import timedelta

from spotd.core import facts
from spotd.core.spec import JobSpec


def checkpoint_write_hours(spec: JobSpec) -> float:
    """Time to write one checkpoint of the job's stated size."""
    return spec.checkpoint.size_gb * 8 / facts.CHECKPOINT_WRITE_GBPS / 3600


def saves_on_notice(spec: JobSpec, notice_seconds: float) -> bool:
    """Whether a preemption loses no work: the job checkpoints when the agent signals the
    notice, and the write fits in the notice with the reaction time to spare."""
    write = checkpoint_write_hours(spec) * 3600
    return spec.checkpoint.on_notice and facts.NOTICE_REACTION_SECONDS + write <= notice_seconds


def checkpoint_interval(spec: JobSpec, rate: float) -> float:
    """The job's interval in hours; Young's optimum sqrt(2 C MTBF) when it says ``auto``."""
    interval = spec.checkpoint.interval
    if isinstance(interval, timedelta):
        return interval.total_seconds() / 3600
    if rate <= 0:
        return 1.0
    return math.sqrt(2 * checkpoint_write_hours(spec) / rate)
