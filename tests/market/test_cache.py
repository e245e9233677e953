"""spotd.market.ttl.TtlCache: time to live, least-recently-used bound, failed loads not kept."""

from __future__ import annotations

import pytest

from spotd.market.ttl import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_value_is_kept_for_its_time_to_live_then_loaded_again() -> None:
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(10.0, clock)
    loads: list[str] = []

    def load() -> int:
        loads.append("x")
        return len(loads)

    assert cache.get_or_load("k", load) == 1
    clock.now = 9.9
    assert cache.get_or_load("k", load) == 1
    clock.now = 10.0
    assert cache.get_or_load("k", load) == 2
    assert loads == ["x", "x"]


def test_the_least_recently_used_keys_go_beyond_the_bound() -> None:
    cache: TtlCache[str, str] = TtlCache(60.0, Clock(), max_items=2)
    cache.get_or_load("a", lambda: "A")
    cache.get_or_load("b", lambda: "B")
    assert cache.get_or_load("a", lambda: "A2") == "A"  # a hit: "a" is now the newest
    cache.get_or_load("c", lambda: "C")
    assert cache.last("b") is None
    assert cache.last("a") == "A" and cache.last("c") == "C"


def test_a_failed_load_keeps_the_old_value_for_last_and_stores_nothing() -> None:
    clock = Clock()
    cache: TtlCache[str, str] = TtlCache(1.0, clock)
    cache.get_or_load("k", lambda: "old")
    clock.now = 5.0

    def fail() -> str:
        raise RuntimeError("catalog unreachable")

    with pytest.raises(RuntimeError):
        cache.get_or_load("k", fail)
    assert cache.last("k") == "old"
    assert cache.get_or_load("k", lambda: "new") == "new"
    assert cache.last("missing") is None
