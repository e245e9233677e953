"""spotd.store.board: the leader's price polls, published for the other daemons (both backends)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engine_support import FakeProvider
from sqlalchemy import text

from spotd.core.network import Fabric, Interconnect
from spotd.core.values import Offering, Pool
from spotd.store.board import SqlOfferingBoard
from spotd.store.sql import SqlStore


class _Clock:
    def __init__(self) -> None:
        self.at = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.at


def _odd_offering() -> Offering:
    """Every optional field empty or unusual: no spot market, no capacity signal."""
    return Offering(
        Pool("aws", "us-east-1", "us-east-1a", "p5.48xlarge"), "H100", 8, 80,
        Interconnect(Fabric.EFA, 400.0), None, 98.32, None, 30,
    )  # fmt: skip


def test_a_publication_reads_back_whole_with_its_age(store: SqlStore) -> None:
    clock = _Clock()
    board = SqlOfferingBoard(store.engine, clock)
    offerings = (*FakeProvider(name="fake").offerings(), _odd_offering())
    assert board.read("fake") is None
    board.publish("fake", offerings)
    clock.at += timedelta(seconds=42)
    published = board.read("fake")
    assert published is not None
    assert published.offerings == offerings
    assert published.age_seconds == 42.0
    assert published.published_at == clock.at - timedelta(seconds=42)


def test_a_new_publication_replaces_the_last_one_of_its_provider_only(store: SqlStore) -> None:
    clock = _Clock()
    board = SqlOfferingBoard(store.engine, clock)
    first = tuple(FakeProvider(name="a").offerings())
    board.publish("a", first)
    board.publish("b", (_odd_offering(),))
    clock.at += timedelta(seconds=5)
    board.publish("a", first[:1])
    a, b = board.read("a"), board.read("b")
    assert a is not None and a.offerings == first[:1] and a.age_seconds == 0.0
    assert b is not None and b.offerings == (_odd_offering(),) and b.age_seconds == 5.0


def test_twenty_thousand_offerings_are_stored_compactly(store: SqlStore) -> None:
    base = _odd_offering()
    many = tuple(
        Offering(Pool("aws", "r", f"r-{i % 7}", f"type-{i}"), "H100", 8, 80,
                 base.interconnect, 1.0 + i / 1000, 3.0 + i / 1000, (i % 10) / 10)
        for i in range(20_000)
    )  # fmt: skip
    board = SqlOfferingBoard(store.engine, _Clock())
    board.publish("aws", many)
    published = board.read("aws")
    assert published is not None and published.offerings == many
    with store.engine.connect() as conn:
        size = conn.execute(text("SELECT length(payload) FROM published_offerings")).scalar_one()
    assert size < 1_000_000, f"{size:,} bytes for 20,000 offerings"
