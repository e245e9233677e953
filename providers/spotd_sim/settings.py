"""The ``[providers.sim]`` table: the simulated market's settings."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class SimSettings(BaseModel):
    """The ``[providers.sim]`` table: the simulated market."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    seed: int = 7
    speed: float = Field(default=1.0, gt=0)
    """Simulated seconds per real second: 1, real time, unless asked. A faster clock
    (``spotd demo`` runs 600x) is said on every surface that shows its times."""
    mean_up_hours: float = Field(default=6.0, gt=0)
    """Mean time a spot pool stays available."""
    mean_down_hours: float = Field(default=2.0, gt=0)
    """Mean time a spot pool stays out of capacity."""
    lifetimes: bool = False
    """Pools (without a trace) never run short; each spot launch is taken back after a
    lifetime of its own instead, drawn from the seed, the pool and the pool's count of
    launches before it (mean: the pool's mean up time). One seed then gives one history
    of preemptions whatever the timing of real processes (``spotd demo`` runs so)."""
    boot_seconds: float = Field(default=10.0, ge=0)
    """Simulated time from launch request to the job's command starting."""
    traces: dict[str, Path] = Field(default_factory=dict)
    """Pattern -> trace file (format of the shared traces) to drive matching pools instead.

    A pattern without ``/`` is a glob on the zone (``us-east-1a``, ``us-east-*``);
    one with ``/`` a glob on ``provider/zone/instance_type``. The first match wins.
    """
    epoch: datetime | None = None
    """Simulated time at the first start on a fresh data_dir; default: the wall clock then."""
    state_dir: Path | None = None
    """Where the simulated market keeps its clock, VMs and meters; default ``<data_dir>/sim``.
    Daemons sharing one PostgreSQL database share one market by naming one folder here
    (each keeps its own data_dir)."""
