"""Simulated time that every process sharing one state directory agrees on.

The daemon, a restarted daemon and every simulated VM read the same
``clock.json``, so "now" is the same for all of them without any messaging.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from .statedir import publish_json_once, read_json

CLOCK_FILE = "clock.json"


class SimClock:
    """A clock running ``speed`` simulated seconds per real second.

    Sim time is ``sim_epoch + (wall() - wall_epoch) * speed``. The first
    clock made for ``state_dir`` fixes the epoch pair and the speed in
    ``state_dir/clock.json``; later clocks on that directory reuse them, so
    ``sim_epoch`` only matters at creation. A later clock asking for another
    speed is refused: sim time would jump for every running VM.

    ``wall`` is this process's source of POSIX time: the host's by default,
    or a shared reference (the database server's) when several daemons on
    different hosts share one market. At 600 simulated seconds per real
    second, hosts one second apart would otherwise disagree by ten minutes.
    """

    def __init__(
        self,
        state_dir: Path,
        speed: float,
        *,
        sim_epoch: datetime | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"clock speed must be positive, got {speed}")
        if sim_epoch is not None and sim_epoch.utcoffset() is None:
            raise ValueError("sim_epoch must be timezone-aware")
        self._wall = wall
        now = wall()
        proposal = {
            "sim_epoch": (sim_epoch or datetime.fromtimestamp(now, UTC)).isoformat(),
            "wall_epoch": now,
            "speed": speed,
        }
        path = state_dir / CLOCK_FILE
        stored = publish_json_once(path, proposal)
        self._load(stored, path)
        if self._speed != speed:
            raise ValueError(
                f"{path} was created with speed {self._speed}, not {speed}: "
                "use the same speed or a new state directory"
            )

    @classmethod
    def open(cls, state_dir: Path, *, wall: Callable[[], float] = time.time) -> SimClock:
        """The clock already fixed for ``state_dir`` (used by the VM processes)."""
        path = state_dir / CLOCK_FILE
        clock = cls.__new__(cls)
        clock._wall = wall
        clock._load(read_json(path), path)
        return clock

    def _load(self, data: object, path: Path) -> None:
        try:
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            self._sim_epoch = datetime.fromisoformat(str(data["sim_epoch"])).astimezone(UTC)
            self._wall_epoch = float(data["wall_epoch"])
            self._speed = float(data["speed"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: not a valid clock file ({exc!r})") from exc

    @property
    def sim_epoch(self) -> datetime:
        """Sim time when the clock was first created (trace tick 0)."""
        return self._sim_epoch

    @property
    def speed(self) -> float:
        """Simulated seconds per real second."""
        return self._speed

    def now(self) -> datetime:
        """The current sim time, timezone-aware UTC."""
        elapsed = (self._wall() - self._wall_epoch) * self._speed
        return self._sim_epoch + timedelta(seconds=elapsed)

    def monotonic(self) -> float:
        """Real seconds (this host's monotonic clock), whatever the speed."""
        return time.monotonic()

    def wall_offset(self) -> float:
        """Seconds this clock's wall source is ahead of this host's clock, now.

        A VM process started by this daemon adds it to its own host time, so
        the VM and the daemon read the same simulated time.
        """
        return self._wall() - time.time()

    def seconds_to_real(self, seconds: float) -> float:
        """Real seconds that ``seconds`` of sim time take."""
        return seconds / self._speed

    def __repr__(self) -> str:
        return f"SimClock(sim_epoch={self._sim_epoch.isoformat()}, speed={self._speed})"


__all__ = ["CLOCK_FILE", "SimClock"]
