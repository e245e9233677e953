"""The two files of each simulated instance: its spec and its VM's status.

The provider writes the spec once, before the VM starts; the VM alone writes
the status while it lives (the provider only writes it for a VM that died
without a final word). Both are JSON, so any process can read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from spotd.core.values import ENDED_STATES, Instance, InstanceState, Market, Pool

from .market import MarketConfig
from .statedir import read_json_or_none, write_json_atomic


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """What one simulated node runs, and what it costs.

    ``env`` is the request's environment plus ``SPOTD_NODE_RANK`` and
    ``SPOTD_INSTANCE_ID``. ``price`` is USD per node-hour at launch.
    """

    id: str
    provider: str
    pool: Pool
    market: Market
    nodes: int
    node_rank: int
    tags: Mapping[str, str]
    command: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str
    price: float
    client_token: str
    boot_seconds: float
    notice_seconds: float
    launched_at: datetime
    market_config: MarketConfig
    address: str = ""
    """The node's own loopback address (:mod:`spotd_sim.addresses`)."""
    clock_offset: float = 0.0
    """Seconds the launching daemon's time reference was ahead of this host's
    clock at launch (:meth:`SimClock.wall_offset`): the VM keeps time by it."""
    taken_back_at: datetime | None = None
    """When the market takes this spot node back, on a market with ``lifetimes``
    (:meth:`SimMarket.lifetime` after its launch); None: when its pool runs short."""

    def to_json(self) -> dict[str, object]:
        """A JSON object that :meth:`from_json` reads back."""
        return {
            "id": self.id,
            "provider": self.provider,
            "pool": asdict(self.pool),
            "market": self.market.value,
            "nodes": self.nodes,
            "node_rank": self.node_rank,
            "tags": dict(self.tags),
            "command": list(self.command),
            "env": dict(self.env),
            "workdir": self.workdir,
            "price": self.price,
            "client_token": self.client_token,
            "boot_seconds": self.boot_seconds,
            "notice_seconds": self.notice_seconds,
            "launched_at": self.launched_at.isoformat(),
            "market_config": self.market_config.to_json(),
            "address": self.address,
            "clock_offset": self.clock_offset,
            "taken_back_at": None if self.taken_back_at is None else self.taken_back_at.isoformat(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> InstanceSpec:
        """The spec saved by :meth:`to_json`."""
        pool = _mapping(data["pool"])
        return cls(
            id=str(data["id"]),
            provider=str(data["provider"]),
            pool=Pool(**{k: str(v) for k, v in pool.items()}),
            market=Market(str(data["market"])),
            nodes=int(str(data["nodes"])),
            node_rank=int(str(data["node_rank"])),
            tags={str(k): str(v) for k, v in _mapping(data["tags"]).items()},
            command=tuple(str(a) for a in _list(data["command"])),
            env={str(k): str(v) for k, v in _mapping(data["env"]).items()},
            workdir=str(data["workdir"]),
            price=float(str(data["price"])),
            client_token=str(data["client_token"]),
            boot_seconds=float(str(data["boot_seconds"])),
            notice_seconds=float(str(data["notice_seconds"])),
            launched_at=datetime.fromisoformat(str(data["launched_at"])),
            market_config=MarketConfig.from_json(_mapping(data["market_config"])),
            address=str(data.get("address") or ""),
            clock_offset=float(str(data.get("clock_offset") or 0.0)),
            taken_back_at=_moment(data.get("taken_back_at")),
        )

    def save(self, path: Path) -> None:
        """Write the spec atomically."""
        write_json_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> InstanceSpec | None:
        """The spec in ``path``, None when there is none."""
        data = read_json_or_none(path)
        return None if data is None else cls.from_json(data)


@dataclass(frozen=True, slots=True)
class VmStatus:
    """What a VM process reports about its node.

    Times are sim times. ``pid`` is the VM process; ``child_pid`` the job's
    process (and process group), ``child_start`` its start time in clock
    ticks since boot, to tell it from a later process reusing the pid.
    ``exit_code`` is the job's return code, negative for a signal (-9: killed).
    """

    state: InstanceState
    pid: int | None
    launched_at: datetime
    exit_code: int | None = None
    running_at: datetime | None = None
    notice_at: datetime | None = None
    ended_at: datetime | None = None
    child_pid: int | None = None
    child_start: int | None = None
    reason: str = ""
    kill_at: datetime | None = None
    """Wall-clock time (not sim time) the VM kills the job after a notice: what an
    agent on the node tells the job as its deadline."""

    @property
    def ended(self) -> bool:
        """Whether the state is final."""
        return self.state in ENDED_STATES

    def to_json(self) -> dict[str, object]:
        """A JSON object that :meth:`from_json` reads back."""
        return {
            "state": self.state.value,
            "pid": self.pid,
            "launched_at": self.launched_at.isoformat(),
            "exit_code": self.exit_code,
            "running_at": _iso(self.running_at),
            "notice_at": _iso(self.notice_at),
            "ended_at": _iso(self.ended_at),
            "child_pid": self.child_pid,
            "child_start": self.child_start,
            "reason": self.reason,
            "kill_at": _iso(self.kill_at),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> VmStatus:
        """The status saved by :meth:`to_json`."""
        return cls(
            state=InstanceState(str(data["state"])),
            pid=_opt_int(data.get("pid")),
            launched_at=datetime.fromisoformat(str(data["launched_at"])),
            exit_code=_opt_int(data.get("exit_code")),
            running_at=_opt_time(data.get("running_at")),
            notice_at=_opt_time(data.get("notice_at")),
            ended_at=_opt_time(data.get("ended_at")),
            child_pid=_opt_int(data.get("child_pid")),
            child_start=_opt_int(data.get("child_start")),
            reason=str(data.get("reason") or ""),
            kill_at=_opt_time(data.get("kill_at")),
        )

    def save(self, path: Path) -> None:
        """Write the status atomically."""
        write_json_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> VmStatus | None:
        """The status in ``path``, None when the VM has not written one."""
        data = read_json_or_none(path)
        return None if data is None else cls.from_json(data)


def instance_of(spec: InstanceSpec, status: VmStatus | None) -> Instance:
    """The node as its provider describes it: pending until its VM reports."""
    return Instance(
        id=spec.id,
        pool=spec.pool,
        market=spec.market,
        state=InstanceState.PENDING if status is None else status.state,
        tags=dict(spec.tags),
        exit_code=None if status is None else status.exit_code,
        launched_at=spec.launched_at,
        ended_at=None if status is None else status.ended_at,
        private_address=spec.address or None,
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _opt_time(value: object) -> datetime | None:
    return None if value is None else datetime.fromisoformat(str(value))


def _opt_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _mapping(value: object) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {value!r}")
    return value


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise ValueError(f"expected a JSON list, got {value!r}")
    return value


def _moment(value: object) -> datetime | None:
    return None if value is None else datetime.fromisoformat(str(value))
