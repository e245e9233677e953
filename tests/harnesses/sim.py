"""The simulated market as a contract-suite harness."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from harnesses import ErrorKind
from spotd.core.values import Market, Offering
from spotd_sim import SimProvider, build_sim_providers


def spot_offering(offerings: Iterable[Offering], *, gpus_per_node: int) -> Offering:
    """The first offering of a simulated market with capacity and a spot price, of
    ``gpus_per_node`` GPUs: both simulated harnesses launch from it."""
    return next(
        o for o in offerings
        if o.capacity and o.gpus_per_node == gpus_per_node and o.price(Market.SPOT)
    )  # fmt: skip


class SimHarness:
    makes_placements = False
    """Simulated nodes share one host: there is no fabric to place them on."""

    def __init__(self, provider: SimProvider) -> None:
        self.provider = provider
        self._sim = provider

    def gang_offering(self) -> Offering:
        return spot_offering(self._sim.offerings(), gpus_per_node=8)

    def launchable(self) -> Offering:
        return spot_offering(self._sim.offerings(), gpus_per_node=1)

    def command(self) -> tuple[str, ...]:
        return (sys.executable, "-c", "import time; time.sleep(60)")

    def supports(self, kind: ErrorKind) -> bool:
        return False  # the simulator has no API that can fail

    def fail_next_launch(self, kind: ErrorKind) -> None:
        raise NotImplementedError(kind)

    def interrupt(self, instance_id: str) -> None:
        self._sim.reclaim(instance_id)

    def settle(self) -> None:
        time.sleep(0.1)


@contextmanager
def make_harness(tmp_path: Path) -> Iterator[SimHarness]:
    # Pools stay up for ~1000 simulated hours: only interrupt() preempts.
    providers = build_sim_providers(
        tmp_path / "sim", seed=1, speed=60.0, mean_up_hours=1000.0, mean_down_hours=1.0,
        boot_seconds=0, sim_epoch=datetime(2026, 1, 1, tzinfo=UTC),
    )
    provider = providers[0]
    try:
        yield SimHarness(provider)
    finally:
        for p in providers:
            p.terminate([i.id for i in p.list_instances({}) if not i.ended])
