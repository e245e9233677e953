"""Expected hours and cost to finish a job on one offering: the score of ``balanced``.

hours = work on this offering (fabric efficiency, GPU speed), stretched by
checkpoint overhead and expected preemption losses, plus the changeover of
starting there and the time to move the latest checkpoint there; cost =
those hours at the offering's price for all nodes, plus the checkpoint's
egress. Every price comes from the offering (polled), every rate from pool
history (``ctx.stats``) or the provider's capacity signal; the fixed figures
live in :mod:`spotd.core.facts` with their sources.

Preemption overhead (Young 1974, CACM 17(9)): with checkpoint write time C,
interval tau and preemption rate lambda, a run needing W hours takes in
expectation T = W (1 + C/tau) / (1 - lambda (L + d)): each preemption loses
L = tau/2 of work on average plus the changeover d. L is 0 where the job
checkpoints on the preemption notice and the write fits in the offering's
notice (:func:`spotd.core.cadence.saves_on_notice`): only the changeover is lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotd.core import facts
from spotd.core.cadence import checkpoint_interval, checkpoint_write_hours, saves_on_notice
from spotd.core.progress import relative_efficiency, speed
from spotd.core.values import Market, Offering, PlacementContext
from spotd.market import catalog
from spotd.market.stats import expected_preemptions

HOPELESS_FACTOR = 20.0
"""Stretch assigned to a pool preempted faster than the job can make progress."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """The parts of a candidate's expected cost (hours are wall hours)."""

    work_hours: float
    efficiency: float
    speed: float
    preemptions_per_hour: float
    checkpoint_interval_hours: float
    lost_per_preemption_hours: float
    """Work a preemption throws away on average (0 where the notice's checkpoint saves it)."""
    preemption_overhead_hours: float
    changeover_hours: float
    migration_hours: float
    migration_usd: float
    price_per_hour: float

    @property
    def hours(self) -> float:
        """Expected wall hours from now to the end of the job on this offering."""
        return (
            self.work_hours
            + self.preemption_overhead_hours
            + self.changeover_hours
            + self.migration_hours
        )

    @property
    def cost_usd(self) -> float:
        """Expected cost from now to the end of the job on this offering."""
        return self.price_per_hour * self.hours + self.migration_usd

    def breakdown(self) -> dict[str, float]:
        """The named parts, for ``spotd plan``."""
        return {
            "price_per_hour": self.price_per_hour,
            "efficiency": self.efficiency,
            "gpu_speed": self.speed,
            "work_hours": self.work_hours,
            "preemptions_per_hour": self.preemptions_per_hour,
            "checkpoint_interval_hours": self.checkpoint_interval_hours,
            "lost_per_preemption_hours": self.lost_per_preemption_hours,
            "preemption_overhead_hours": self.preemption_overhead_hours,
            "changeover_hours": self.changeover_hours,
            "migration_hours": self.migration_hours,
            "migration_usd": self.migration_usd,
            "expected_hours": self.hours,
            "expected_cost_usd": self.cost_usd,
        }


def remaining_hours(ctx: PlacementContext) -> float:
    """Compute hours left on the reference setup; 1 hour when the spec gives none."""
    deadline = ctx.spec.deadline
    if deadline is None or deadline.compute_hours is None:
        return 1.0
    return max(0.0, deadline.compute_hours - ctx.done_hours)


def stretched(
    work: float, rate: float, *, interval: float, write: float, restart: float, lost: float
) -> float:
    """Expected wall hours for ``work`` hours checkpointed every ``interval`` under
    preemptions (Young's model), each losing ``lost`` hours of work and the ``restart``.

    The writes cost time on every market: the job checkpoints on on-demand too,
    and the daemon counts its progress net of them (:mod:`spotd.core.progress`).
    """
    if rate <= 0:
        return work * (1 + write / interval)
    loss = rate * (lost + restart)
    if loss >= 1 - 1 / HOPELESS_FACTOR:
        return work * HOPELESS_FACTOR
    return work * (1 + write / interval) / (1 - loss)


def migration(ctx: PlacementContext, off: Offering) -> tuple[float, float]:
    """(USD, hours) to bring the latest checkpoint to the offering's region."""
    src = ctx.current or ctx.checkpoint_at
    if src is None or (src.region == off.pool.region and src.provider == off.pool.provider):
        return 0.0, 0.0
    size = ctx.spec.checkpoint.size_gb
    per_gb = catalog.transfer_usd_per_gb(src.provider, off.pool.provider)
    return size * per_gb, size * 8 / facts.TRANSFER_GBPS / 3600


def estimate(ctx: PlacementContext, off: Offering, market: Market) -> Estimate:
    """Expected hours and cost to finish the job on ``off`` bought in ``market``."""
    spec = ctx.spec
    eff = relative_efficiency(spec, off)
    gpu = speed(spec, off)
    work = remaining_hours(ctx) / (eff * gpu)
    rate = expected_preemptions(ctx.stats, off, market)
    interval = checkpoint_interval(spec, rate)
    lost = 0.0 if saves_on_notice(spec, off.notice_seconds) else interval / 2
    staying = ctx.current == off.pool and ctx.current_market is market
    changeover = 0.0 if staying else ctx.changeover_hours
    wall = stretched(
        work, rate, interval=interval, write=checkpoint_write_hours(spec),
        restart=ctx.changeover_hours, lost=lost,
    )
    usd, hours = migration(ctx, off)
    return Estimate(
        work_hours=work,
        efficiency=eff,
        speed=gpu,
        preemptions_per_hour=rate,
        checkpoint_interval_hours=interval,
        lost_per_preemption_hours=lost,
        preemption_overhead_hours=wall - work,
        changeover_hours=changeover,
        migration_hours=hours,
        migration_usd=usd,
        price_per_hour=(off.price(market) or 0.0) * spec.resources.nodes,
    )
