"""The in-process simulated market as a contract-suite harness: its clock moves on settle()."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from harnesses import ErrorKind
from harnesses.sim import spot_offering
from spotd.core.clock import ManualClock
from spotd.core.values import Offering
from spotd_sim import InProcessSimProvider, build_inprocess_providers

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
SETTLE_SECONDS = 30.0
"""Simulated time one settle() lets pass: less than a step of the default workload."""


class InProcessHarness:
    makes_placements = False
    """Simulated nodes share one host: there is no fabric to place them on."""

    def __init__(self, provider: InProcessSimProvider, clock: ManualClock) -> None:
        self.provider = provider
        self._sim = provider
        self._clock = clock

    def gang_offering(self) -> Offering:
        return spot_offering(self._sim.offerings(), gpus_per_node=8)

    def launchable(self) -> Offering:
        return spot_offering(self._sim.offerings(), gpus_per_node=1)

    def command(self) -> tuple[str, ...]:
        return ("python", "train.py")  # never run: the node's workload stands for it

    def supports(self, kind: ErrorKind) -> bool:
        return False  # the simulator has no API that can fail

    def fail_next_launch(self, kind: ErrorKind) -> None:
        raise NotImplementedError(kind)

    def interrupt(self, instance_id: str) -> None:
        self._sim.reclaim(instance_id)

    def settle(self) -> None:
        self._clock.advance(SETTLE_SECONDS)


@contextmanager
def make_harness(tmp_path: Path) -> Iterator[InProcessHarness]:
    del tmp_path  # nothing of it lives on disk
    clock = ManualClock(EPOCH)
    # Pools stay up for ~1000 simulated hours: only interrupt() preempts.
    providers = build_inprocess_providers(
        clock, seed=1, mean_up_hours=1000.0, mean_down_hours=1.0, boot_seconds=0,
    )
    yield InProcessHarness(providers[0], clock)
