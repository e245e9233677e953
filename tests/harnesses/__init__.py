"""Per-provider test harnesses behind one protocol, for the Provider contract suite.

Each module ``tests/harnesses/<name>.py`` defines ``make_harness(tmp_path)``,
a context manager yielding a :class:`Harness` whose provider is the REAL
adapter, talking to a fake of its cloud (moto, botocore hooks, a loopback
HTTP server) or, for ``sim``, to the simulated market itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Literal, Protocol

from spotd.core.contracts import Provider
from spotd.core.values import Offering

ErrorKind = Literal["capacity", "quota", "throttle", "auth", "server"]
ERROR_KINDS: tuple[ErrorKind, ...] = ("capacity", "quota", "throttle", "auth", "server")
PROVIDERS = ("sim", "aws", "gcp", "azure")


class Harness(Protocol):
    """A provider under test and the levers of its fake."""

    provider: Provider

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


class HarnessFactory(Protocol):
    def __call__(self, tmp_path: Path) -> AbstractContextManager[Harness]: ...


def harness_iter(factory: HarnessFactory, tmp_path: Path) -> Iterator[Harness]:
    with factory(tmp_path) as harness:
        yield harness
