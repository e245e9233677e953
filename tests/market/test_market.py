"""The market cache: polls, backoff, and what a failing provider leaves behind."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from engine_support import FakeProvider

from spotd.core.clock import ManualClock
from spotd.core.contracts import Published
from spotd.core.values import Offering
from spotd.market.cache import MarketCache, unoffered_gpus
from spotd.store.board import SqlOfferingBoard
from spotd.store.sql import SqlStore


class _Broken(FakeProvider):
    """An adapter with a bug: its poll raises an error it failed to map."""

    polls: int = 0

    def offerings(self) -> list:  # type: ignore[type-arg]
        self.polls += 1
        if self.polls > 1:
            raise KeyError("SpotPrice")
        return super().offerings()


def test_an_unmapped_error_in_a_poll_backs_off_and_keeps_the_last_offerings() -> None:
    broken = _Broken(name="broken")
    market = MarketCache({"broken": broken}, base_backoff_seconds=3600)
    first = market.refresh("broken")
    assert len(first.offerings) == 3 and first.failures == 0
    failed = market.refresh("broken")
    assert failed.failures == 1 and failed.error == "KeyError: 'SpotPrice'"
    assert failed.offerings == first.offerings, "the last good offerings are kept"
    assert market.refresh("broken") is failed, "backing off: no poll before retry_at"
    assert broken.polls == 2


class _Growing(FakeProvider):
    """A provider whose second poll lists one more GPU model."""

    polls: int = 0

    def offerings(self) -> list:  # type: ignore[type-arg]
        self.polls += 1
        first = super().offerings()
        return first if self.polls == 1 else [*first, replace(first[0], gpu="H100")]


def test_the_offered_gpus_are_known_once_every_provider_answered_and_follow_the_polls() -> None:
    growing, silent = _Growing(name="growing"), FakeProvider(name="silent")
    market = MarketCache({"growing": growing, "silent": silent}, base_backoff_seconds=0)
    assert market.offered_gpus() is None  # nobody polled yet
    market.refresh("growing")
    assert market.offered_gpus() is None, "silent has not answered: nobody can tell"
    market.refresh("silent")
    assert market.offered_gpus() == {"A100"}
    market.refresh("growing")
    assert market.offered_gpus() == {"A100", "H100"}


class _Counted(FakeProvider):
    polls: int = 0

    def offerings(self) -> list:  # type: ignore[type-arg]
        self.polls += 1
        return super().offerings()


FOLLOWER_NOW = datetime(2026, 12, 2, 1, tzinfo=UTC)
"""The follower's wall clock, which stands still: ages are read against it."""


class _BoardClock:
    def __init__(self) -> None:
        self.at = datetime(2026, 12, 2, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.at


def _pair(store: SqlStore) -> tuple[MarketCache, _Counted, MarketCache, _Counted, _BoardClock]:
    """A leader's and a follower's market, sharing one board in ``store``."""
    clock = _BoardClock()
    board = SqlOfferingBoard(store.engine, clock)
    leads, follows = _Counted(name="fake"), _Counted(name="fake")
    leader = MarketCache({"fake": leads})
    follower = MarketCache({"fake": follows}, clock=ManualClock(FOLLOWER_NOW))
    leader.share(board, lambda: True, {"fake": 60.0})
    follower.share(board, lambda: False, {"fake": 60.0})
    return leader, leads, follower, follows, clock


def test_a_follower_takes_the_leaders_poll_and_never_asks_the_provider(store: SqlStore) -> None:
    leader, leads, follower, follows, clock = _pair(store)
    led = leader.refresh("fake")
    clock.at += timedelta(seconds=30)
    taken = follower.refresh("fake")
    assert taken.offerings == led.offerings and not taken.stale
    assert taken.age(FOLLOWER_NOW.timestamp()) == 30, "the age is the publication's, not the read's"
    index = follower.offerings()
    assert follower.refresh("fake") is taken, "the same publication again: the index is kept"
    assert follower.offerings() is index
    assert (leads.polls, follows.polls) == (1, 0)


def test_a_follower_polls_itself_once_the_leaders_poll_is_too_old(store: SqlStore) -> None:
    leader, _leads, follower, follows, clock = _pair(store)
    assert follower.refresh("fake").offerings, "nothing published yet: it polls"
    assert follows.polls == 1
    leader.refresh("fake")
    clock.at += timedelta(seconds=61)  # the leader has gone quiet
    follower.refresh("fake")
    assert follows.polls == 2
    published = SqlOfferingBoard(store.engine, clock).read("fake")
    assert published is not None and published.age_seconds == 61.0, "a follower never publishes"


def test_a_follower_that_becomes_leader_publishes(store: SqlStore) -> None:
    clock = _BoardClock()
    board = SqlOfferingBoard(store.engine, clock)
    leading = [False]
    market = MarketCache({"fake": _Counted(name="fake")})
    market.share(board, lambda: leading[0], {"fake": 60.0})
    market.refresh("fake")
    assert board.read("fake") is None
    leading[0] = True
    market.refresh("fake")
    assert board.read("fake") is not None


class _DownBoard:
    def publish(self, provider: str, offerings: Sequence[Offering]) -> None:
        raise OSError("database unreachable")

    def read(self, provider: str) -> Published | None:
        raise OSError("database unreachable")


def test_an_unreachable_board_leaves_every_daemon_polling_for_itself() -> None:
    for leading in (True, False):
        provider = _Counted(name="fake")
        market = MarketCache({"fake": provider})
        market.share(_DownBoard(), lambda leading=leading: leading, {"fake": 60.0})
        assert market.refresh("fake").offerings and not market.snapshot("fake").stale
        assert provider.polls == 1


def test_a_slip_of_the_keyboard_points_at_the_model_meant() -> None:
    offered = frozenset({"A10G", "A100", "H100", "L40S"})
    # O for 0 is A100, not the nearer spelling A10G; a plural is the model itself.
    assert unoffered_gpus(["A1OO"], offered) == (
        "no enabled provider offers A1OO (offered: A100, A10G, H100, L40S); did you mean A100?"
    )
    assert unoffered_gpus(["H100S", "A100"], offered) == (
        "no enabled provider offers H100S (did you mean H100?); correct or remove it"
    )
    assert unoffered_gpus(["L40", "H100"], offered) is not None
    assert unoffered_gpus(["B200", "H100"], offered) is None  # not offered yet, not a slip
    assert unoffered_gpus(["A1OO"], None) is None  # nobody can tell before the first poll
