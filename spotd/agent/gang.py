"""The agent's side of gang rendezvous: join, wait for the roster, tell the job.

A node joins its gang with its address and two ports free on it (one for the
job's rendezvous, one for the preflight's), then asks again until the daemon
answers with the roster: only once every node of the attempt has joined. From
the roster the job gets its rank, the master's address and port, every
node's address, a hostfile for MPI-style launchers, and the variables torchrun
reads from its environment (``PET_*``).

The same on every provider: only the address differs in where it comes from
(the simulated market gives each node its own loopback address; on a cloud VM
it is the primary NIC's private address from the metadata service, else the
address of the interface that routes to the daemon).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from spotd.agent.reporter import ReportFailed, ReportRejected
from spotd.core.agent_wire import JoinReport, Roster, Waiting
from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.spec import GangSpec

log = logging.getLogger(__name__)

Join = Callable[[JoinReport], Roster | Waiting]

DEFAULT_GANG_TIMEOUT_SECONDS = GangSpec().timeout.total_seconds()
"""For a job whose daemon did not say: the job spec's default."""


@dataclass(frozen=True, slots=True)
class GangPlan:
    """What the daemon told every node of the gang before it booted (its environment)."""

    nodes: int = 1
    timeout_seconds: float = DEFAULT_GANG_TIMEOUT_SECONDS
    fixed_port: int | None = None
    """The job's pinned rendezvous port (``[gang] master_port``), else None."""
    slots: int = 1
    """Processes per node an MPI hostfile should offer: the node's GPUs."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GangPlan:
        """Read the plan from the job's ``SPOTD_*`` variables (defaults where unset)."""
        port = env.get("SPOTD_MASTER_PORT", "").strip()
        return cls(
            nodes=int(env.get("SPOTD_NUM_NODES", "1") or 1),
            timeout_seconds=float(
                env.get("SPOTD_GANG_TIMEOUT_SECONDS", "") or DEFAULT_GANG_TIMEOUT_SECONDS
            ),
            fixed_port=int(port) if port else None,
            slots=max(1, int(env.get("SPOTD_EXPECT_GPUS", "1") or 1)),
        )


def route_address(daemon_url: str) -> str:
    """This host's address on the route to the daemon (no packet is sent).

    On a cloud VM that is the private address its peers in the same network
    reach it on.
    """
    parts = urlsplit(daemon_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return str(probe.getsockname()[0])


def free_port(address: str) -> int:
    """A TCP port free on ``address`` now (the kernel's pick)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def wait_for_roster(
    join: Join,
    report: JoinReport,
    *,
    timeout: float,
    poll_seconds: float = 1.0,
    stop: threading.Event | None = None,
    clock: Clock = WALL,
) -> Roster | None:
    """Join and ask again until the roster comes; None after ``timeout`` seconds of
    ``clock``, which also dates each join.

    A refused join (wrong token, unknown attempt) ends the wait at once: no
    retry could pass it. Transient failures are retried like waiting.
    """
    deadline = clock.monotonic() + timeout
    while True:
        try:
            answer = join(report.model_copy(update={"at": clock.now()}))
        except ReportRejected as exc:
            log.error("the daemon refused this node's join: %s", exc)
            return None
        except ReportFailed as exc:
            log.warning("join not delivered, will retry: %s", exc)
            answer = None
        if isinstance(answer, Roster):
            return answer
        if answer is not None:
            log.info("gang: %d of %d node(s) joined", answer.joined, answer.nodes)
        left = deadline - clock.monotonic()
        if left <= 0 or (stop is not None and stop.is_set()):
            return None
        time.sleep(min(poll_seconds, left))


def roster_environment(roster: Roster, plan: GangPlan, run_dir: Path) -> dict[str, str]:
    """The job's rendezvous variables, for its rank in ``roster``; writes the hostfile."""
    hostfile = run_dir / "hostfile"
    hostfile.write_text("".join(f"{a} slots={plan.slots}\n" for a in roster.addresses))
    port = str(plan.fixed_port or roster.master_port)
    return {
        "SPOTD_NODE_RANK": str(roster.rank),
        "SPOTD_NUM_NODES": str(roster.nodes),
        "SPOTD_MASTER_ADDR": roster.master_addr,
        "SPOTD_MASTER_PORT": port,
        "SPOTD_NODE_IPS": ",".join(roster.addresses),
        "SPOTD_HOSTFILE": str(hostfile),
        "SPOTD_RDZV_ID": roster.rdzv_id,
        "PET_NNODES": str(roster.nodes),
        "PET_NODE_RANK": str(roster.rank),
        "PET_MASTER_ADDR": roster.master_addr,
        "PET_MASTER_PORT": port,
        "PET_RDZV_ID": roster.rdzv_id,
    }
