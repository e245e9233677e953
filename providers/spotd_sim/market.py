"""Spot availability and prices per pool, on sim time, shared by every process.

Each pool follows either a trace file or a seeded up/down renewal process.
Both are pure functions of the :class:`MarketConfig` and the epoch, so the
daemon and every simulated VM compute the same answer for the same moment.
On-demand capacity is never short.

With ``lifetimes`` the stochastic pools never run short; each spot launch
lives a lifetime of its own instead, drawn from the seed, the pool and how
many launches that pool had before it. What happens then depends on the
order of launches, not on the moments at which real processes happen to
look at the simulated clock (``spotd demo`` runs on it).
"""

from __future__ import annotations

import fnmatch
import math
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

from spotd.core.values import Pool

from .renewal import RenewalProcess
from .trace import Trace, load_trace

_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class MarketConfig:
    """Everything that determines the market, in JSON-friendly form.

    ``traces`` pairs a pattern with a trace file, first match wins. A pattern
    without ``/`` is a glob on the zone name (``us-east-1a``, ``us-east-*``)
    and drives every instance type in matching zones; a pattern with ``/`` is
    a glob on ``provider/zone/instance_type`` (``sim-aws/us-east-1*/p3.*``).

    ``pool_variation`` spreads pools around the means: each pool scales its
    time scale and its up/down balance by factors in
    ``[exp(-v), exp(v)]`` drawn from the seed; 0 makes every pool follow the
    means exactly. An up pool has ``max_nodes`` spot nodes; a down one none.
    ``price_drift`` is the largest relative move of the spot price per hour.
    ``lifetimes``: pools without a trace never run short, and each spot launch
    is taken back after its own :meth:`SimMarket.lifetime` instead.
    """

    seed: int
    mean_up_hours: float = 6.0
    mean_down_hours: float = 2.0
    pool_variation: float = 0.5
    max_nodes: int = 64
    price_drift: float = 0.03
    traces: tuple[tuple[str, str], ...] = ()
    lifetimes: bool = False

    def __post_init__(self) -> None:
        if self.mean_up_hours <= 0:
            raise ValueError(f"mean_up_hours must be positive, got {self.mean_up_hours}")
        if self.mean_down_hours < 0:
            raise ValueError(f"mean_down_hours must be >= 0, got {self.mean_down_hours}")
        if self.pool_variation < 0 or self.price_drift < 0 or self.max_nodes < 1:
            raise ValueError("pool_variation and price_drift must be >= 0, max_nodes >= 1")

    @staticmethod
    def trace_pairs(traces: Mapping[str, Path] | None) -> tuple[tuple[str, str], ...]:
        """``traces`` as config pairs, with paths made absolute for other cwds."""
        return tuple((k, str(Path(v).expanduser().resolve())) for k, v in (traces or {}).items())

    def trace_for(self, pool: Pool) -> str | None:
        """The trace file that drives ``pool``, None for the stochastic model."""
        for pattern, path in self.traces:
            subject = str(pool) if "/" in pattern else pool.zone
            if fnmatch.fnmatchcase(subject, pattern):
                return path
        return None

    def for_pool(self, pool: Pool) -> MarketConfig:
        """This config narrowed to ``pool``: what a VM needs to follow it."""
        path = self.trace_for(pool)
        return replace(self, traces=((str(pool), path),) if path else ())

    def to_json(self) -> dict[str, object]:
        """A JSON object that :meth:`from_json` turns back into this config."""
        return {
            "seed": self.seed,
            "mean_up_hours": self.mean_up_hours,
            "mean_down_hours": self.mean_down_hours,
            "pool_variation": self.pool_variation,
            "max_nodes": self.max_nodes,
            "price_drift": self.price_drift,
            "traces": [list(pair) for pair in self.traces],
            "lifetimes": self.lifetimes,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> MarketConfig:
        """The config saved by :meth:`to_json`."""
        traces = data.get("traces") or []
        if not isinstance(traces, list):
            raise ValueError("market config: 'traces' must be a list of pairs")
        return cls(
            seed=int(str(data["seed"])),
            mean_up_hours=float(str(data["mean_up_hours"])),
            mean_down_hours=float(str(data["mean_down_hours"])),
            pool_variation=float(str(data["pool_variation"])),
            max_nodes=int(str(data["max_nodes"])),
            price_drift=float(str(data["price_drift"])),
            traces=tuple((str(p), str(f)) for p, f in traces),
            lifetimes=data.get("lifetimes") is True,
        )


class SimMarket:
    """Spot availability and prices of every simulated pool on sim time.

    Time 0 of the stochastic model and tick 0 of every trace is ``epoch``
    (use the clock's ``sim_epoch``). Trace files are read and checked here,
    so a bad one fails at construction with a :class:`TraceError`.
    """

    def __init__(self, config: MarketConfig, *, epoch: datetime) -> None:
        if epoch.utcoffset() is None:
            raise ValueError("market epoch must be timezone-aware")
        self.config = config
        self.epoch = epoch
        self._traces: dict[str, Trace] = {path: load_trace(Path(path)) for _, path in config.traces}
        self._processes: dict[Pool, RenewalProcess] = {}
        self._lock = threading.Lock()

    def available(self, pool: Pool, at: datetime, nodes: int = 1) -> bool:
        """Whether ``nodes`` spot nodes of ``pool`` can run at ``at``."""
        return self.spot_nodes(pool, at) >= nodes

    def spot_nodes(self, pool: Pool, at: datetime) -> int:
        """How many spot nodes of ``pool`` are there at ``at``."""
        offset = self._offset_us(at)
        trace = self._trace(pool)
        if trace is not None:
            return trace.value_at_tick(trace.tick(offset))
        if self.config.lifetimes:
            return self.config.max_nodes
        return self.config.max_nodes if self._process(pool).is_up(offset) else 0

    def capacity_signal(self, pool: Pool, at: datetime) -> float:
        """The provider's capacity hint: 1.0 when spot is there now, else 0.0."""
        return 1.0 if self.available(pool, at) else 0.0

    def next_change(self, pool: Pool, at: datetime, nodes: int = 1) -> datetime | None:
        """When availability for ``nodes`` nodes next flips; None if it never does."""
        offset = self._offset_us(at)
        trace = self._trace(pool)
        if trace is not None:
            tick = trace.next_change_tick(trace.tick(offset), nodes)
            return None if tick is None else self._at(tick * trace.gap_us)
        if nodes > self.config.max_nodes or self.config.lifetimes:
            return None
        change = self._process(pool).next_change(offset)
        return None if change is None else self._at(change)

    def spot_price(self, pool: Pool, base: float, at: datetime) -> float:
        """``base`` moved by this hour's drift, the same in every process."""
        if self.config.price_drift == 0:
            return base
        hour = self._offset_us(at) // 3_600_000_000
        rng = random.Random(f"spotd-sim:{self.config.seed}:{pool}:price:{hour}")  # noqa: S311
        return round(base * (1 + self.config.price_drift * rng.uniform(-1, 1)), 4)

    def lifetime(self, pool: Pool, launch: int) -> timedelta:
        """How long the ``launch``-th spot launch of ``pool`` (0 the first) runs
        before the market takes it back, with ``lifetimes``: exponential, with the
        pool's mean up time, the same for one seed, pool and launch in any process."""
        rng = random.Random(f"spotd-sim:{self.config.seed}:{pool}:life:{launch}")  # noqa: S311
        mean_up_us, _ = self._means_us(pool)
        return max(1, round(rng.expovariate(1.0 / mean_up_us))) * _MICROSECOND

    def _offset_us(self, at: datetime) -> int:
        return (at - self.epoch) // _MICROSECOND

    def _at(self, offset_us: int) -> datetime:
        return self.epoch + offset_us * _MICROSECOND

    def _trace(self, pool: Pool) -> Trace | None:
        path = self.config.trace_for(pool)
        return None if path is None else self._traces[path]

    def _process(self, pool: Pool) -> RenewalProcess:
        with self._lock:
            process = self._processes.get(pool)
            if process is None:
                process = self._processes[pool] = self._new_process(pool)
            return process

    def _new_process(self, pool: Pool) -> RenewalProcess:
        up_us, down_us = self._means_us(pool)
        return RenewalProcess(f"spotd-sim:{self.config.seed}:{pool}", up_us, down_us)

    def _means_us(self, pool: Pool) -> tuple[float, float]:
        """The pool's mean up and down times: the config's, scaled by its character."""
        # A separate generator for the pool's character, so the variation
        # setting does not shift the pool's up/down draws.
        rng = random.Random(f"spotd-sim:{self.config.seed}:{pool}:character")  # noqa: S311
        v = self.config.pool_variation
        scale = math.exp(rng.uniform(-v, v))
        balance = math.exp(rng.uniform(-v, v))
        hour_us = 3_600_000_000
        up_us = self.config.mean_up_hours * hour_us * scale * balance
        down_us = self.config.mean_down_hours * hour_us * scale / balance
        return up_us, down_us
