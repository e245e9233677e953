"""Per-provider test harnesses behind one protocol, for the Provider contract suite.

Each module ``tests/harnesses/<name>.py`` defines ``make_harness(tmp_path)``,
a context manager yielding a :class:`Harness` whose provider is the REAL
adapter, talking to a fake of its cloud (moto, botocore hooks, a loopback
HTTP server) or, for ``sim``, to the simulated market itself.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from spotd.core.contracts import Provider
from spotd.core.values import LaunchRequest, Offering

ErrorKind = Literal["capacity", "quota", "throttle", "auth", "server"]
ERROR_KINDS: tuple[ErrorKind, ...] = ("capacity", "quota", "throttle", "auth", "server")
PROVIDERS = ("sim", "sim_inprocess", "aws", "gcp", "azure", "kubernetes")


@dataclass(frozen=True)
class FabricSeen:
    """What the fake was asked for, for the nodes of one gang launch."""

    placements: frozenset[str]
    """Ids (as :class:`~spotd.core.values.PlacementObject` gives them) the nodes were put in."""
    interfaces: tuple[int, ...]
    """Per node, how many fabric network interfaces the request gave it."""


class Harness(Protocol):
    """A provider under test and the levers of its fake."""

    provider: Provider
    makes_placements: bool
    """Whether the provider creates placement objects for gangs (a PlacementHost)."""

    def launchable(self) -> Offering:
        """A one-node spot offering the fake will launch now."""
        ...

    def command(self) -> tuple[str, ...]:
        """A command to put in launch requests (the sim runs it; clouds pass it to the agent)."""
        ...

    def supports(self, kind: ErrorKind) -> bool:
        """Whether :meth:`fail_next_launch` can inject this kind of error."""
        ...

    def fail_next_launch(self, kind: ErrorKind) -> None:
        """Make the fake refuse the next launch with its own error of that kind."""
        ...

    def interrupt(self, instance_id: str) -> None:
        """Take the instance back from the provider's side (preempt, evict, delete)."""
        ...

    def settle(self) -> None:
        """Let the fake move on (for the sim: wait a little real time)."""
        ...

    def gang_offering(self) -> Offering:
        """A spot offering of a fabric type (EFA, TCPX, InfiniBand...) the fake launches 4 of."""
        ...

    def fabric_seen(self, instance_ids: Sequence[str]) -> FabricSeen:
        """The placement and fabric interfaces the fake received for these nodes."""
        ...

    def expected_interfaces(self, instance_type: str) -> int:
        """Fabric interfaces per node the fake's own catalog gives this type."""
        ...

    def launch_in_child(self, request: LaunchRequest, tmp_path: Path) -> subprocess.Popen[bytes]:
        """Launch ``request`` with the same adapter in a child process against this fake.

        The fake holds that launch's instance call once the placement object
        exists, so the test can SIGKILL the child mid-launch.
        """
        ...


class HarnessFactory(Protocol):
    def __call__(self, tmp_path: Path) -> AbstractContextManager[Harness]: ...


def harness_iter(factory: HarnessFactory, tmp_path: Path) -> Iterator[Harness]:
    with factory(tmp_path) as harness:
        yield harness
