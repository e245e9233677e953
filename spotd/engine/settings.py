"""The reconcile loop's settings, and the names it tags its cloud objects with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from spotd.core.forecast import OverBudgetAction
from spotd.core.values import JobRecord
from spotd.engine.teams import TeamLimits

TAG_JOB = "spotd-job"
TAG_ATTEMPT = "spotd-attempt"
TAG_OWNER = "spotd-owner"

MISSING_BEFORE_LOST = 3
"""Describes in a row an instance must be absent from before its node counts as lost."""


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Knobs of the reconcile loop (see ``docs/config.md``)."""

    owner: str
    lease_seconds: float = 60.0
    cooldown_hours: float = 0.5
    no_capacity_timeout_hours: float | None = None
    checkpoints_dir: Path = Path("checkpoints")
    price_history_seconds: float = 300.0
    """Real seconds between two price-history rows of one provider."""
    changeover_hours: float = 0.25
    """Time a new start costs before progress resumes (boot, setup, restore)."""
    replan_seconds: float = 60.0
    """Real seconds between two checks of whether a running job should move."""
    stats_window_hours: float = 7 * 24.0
    """How much price history the pool statistics look at."""
    teams: Mapping[str, TeamLimits] = field(default_factory=dict)
    """Per team name, the limits that hold its pending jobs back (``[teams]``)."""
    forecast_over_budget: OverBudgetAction = OverBudgetAction.WARN
    """What a submit does with a job whose forecast exceeds its budget."""


def checkpoint_uri(job: JobRecord, settings: EngineSettings) -> str:
    """Where the job's checkpoints go: its spec's URI or a folder of the daemon's."""
    return job.spec.checkpoint.uri or str(settings.checkpoints_dir / job.id)
