"""The database-corrected clock: daemons whose own clocks differ keep one time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotd.core.clock import DatabaseClock

REFERENCE = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


class Ticker:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_now_is_the_references_whatever_the_local_clock_says() -> None:
    skew = timedelta(hours=11)  # the drift the issue measured between two daemons
    clock = DatabaseClock(lambda: REFERENCE, local=lambda: REFERENCE + skew, monotonic=Ticker())
    assert clock.now() == REFERENCE
    assert clock.offset == -skew


def test_the_reference_is_read_again_after_the_refresh_only() -> None:
    reads: list[int] = []
    tick = Ticker()

    def reference() -> datetime:
        reads.append(1)
        return REFERENCE

    clock = DatabaseClock(reference, refresh_seconds=60, local=lambda: REFERENCE, monotonic=tick)
    clock.now()
    tick.t = 59.0
    clock.now()
    assert len(reads) == 1
    tick.t = 60.0
    clock.now()
    assert len(reads) == 2


def test_a_failed_read_keeps_the_last_offset() -> None:
    tick = Ticker()
    answers: list[datetime | Exception] = [REFERENCE, ConnectionError("db down")]

    def reference() -> datetime:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    local = REFERENCE - timedelta(minutes=5)
    clock = DatabaseClock(reference, refresh_seconds=1, local=lambda: local, monotonic=tick)
    assert clock.now() == REFERENCE
    tick.t = 2.0
    assert clock.now() == REFERENCE, "kept the offset through the failure"


@pytest.mark.postgres
def test_two_daemons_two_hours_apart_agree_on_the_servers_time(pg_url: str) -> None:
    from spotd.store.base import make_engine
    from spotd.store.coordination import Coordinator

    server = Coordinator(make_engine(pg_url)).database_time
    ahead = DatabaseClock(server, local=lambda: datetime.now(UTC) + timedelta(hours=2))
    behind = DatabaseClock(server, local=lambda: datetime.now(UTC) - timedelta(hours=2))
    assert abs(ahead.now() - behind.now()) < timedelta(seconds=1)
    assert abs(ahead.now() - server()) < timedelta(seconds=1)


def test_a_clock_at_real_speed_needs_no_note() -> None:
    from spotd.core.clock import WALL, ManualClock, clock_note

    assert clock_note(WALL) is None
    assert clock_note(ManualClock(datetime(2026, 1, 1, tzinfo=UTC))) is None


@pytest.mark.parametrize(("speed", "note"), [
    (1.0, None),
    (60.0, "simulated clock, 60x real time"),
    (0.5, "simulated clock, 0.5x real time"),
])  # fmt: skip
def test_a_simulated_clock_says_its_speed_unless_it_is_real(
    tmp_path: Path, speed: float, note: str | None
) -> None:
    from spotd.core.clock import clock_note, speed_of
    from spotd_sim import SimClock

    clock = SimClock(tmp_path, speed, wall=lambda: 1000.0)
    assert speed_of(clock) == pytest.approx(speed)
    assert clock_note(clock) == note
