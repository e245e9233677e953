"""spotd.market.linked: offerings priced from another provider's offering of the same machine."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from spotd.core.clock import ManualClock
from spotd.core.network import Fabric, Interconnect
from spotd.core.values import Market, Offering, Pool, PriceLink
from spotd.market.cache import MarketCache
from spotd.market.linked import price_links
from spotd.store.board import SqlOfferingBoard
from spotd.store.sql import SqlStore

ALL = frozenset(Market)
NET = Interconnect(Fabric.EFA, 50.0)


def cloud(zone: str, spot: float | None, on_demand: float | None, *, region: str = "us-east-1",
          itype: str = "p4d.24xlarge", gpus: int = 8) -> Offering:  # fmt: skip
    return Offering(Pool("cloud", region, zone, itype), "A100", gpus, 40, NET, spot, on_demand)


def pool(markets: frozenset[Market] = ALL, *, zone: str = "us-east-1a",
         spot: float | None = 0.0, on_demand: float | None = 0.0, gpus: int = 8,
         source: str = "cloud") -> Offering:  # fmt: skip
    link = PriceLink(Pool(source, "us-east-1", zone, "p4d.24xlarge"), markets)
    return Offering(Pool("cluster", "us-east-1", zone, "p4d-pool"), "A100", gpus, 40, NET,
                    spot, on_demand, price_link=link)  # fmt: skip


def priced(*offered: Offering, linked: Offering) -> Offering:
    found = price_links({"cloud": offered, "cluster": (linked,)})
    (only,) = found.offerings["cluster"]
    return only


def test_a_linked_pool_takes_the_same_zones_spot_and_on_demand_prices() -> None:
    got = priced(cloud("us-east-1a", 9.0, 32.0), cloud("us-east-1b", 7.0, 32.0), linked=pool())
    assert (got.spot_price, got.on_demand_price) == (9.0, 32.0)


def test_without_the_same_zone_the_dearest_of_the_region_is_taken() -> None:
    got = priced(cloud("us-east-1b", 7.0, 32.0), cloud("us-east-1c", 11.0, 32.0),
                 cloud("us-west-2a", 20.0, 40.0, region="us-west-2"), linked=pool())  # fmt: skip
    assert (got.spot_price, got.on_demand_price) == (11.0, 32.0)


def test_only_the_linked_markets_change_and_a_market_not_sold_stays_unsold() -> None:
    configured = pool(frozenset({Market.SPOT}), spot=0.0, on_demand=1.5)
    got = priced(cloud("us-east-1a", 9.0, 32.0), linked=configured)
    assert (got.spot_price, got.on_demand_price) == (9.0, 1.5)
    spot_only = pool(on_demand=None)
    got = priced(cloud("us-east-1a", 9.0, 32.0), linked=spot_only)
    assert (got.spot_price, got.on_demand_price) == (9.0, None)


def test_a_spot_pool_on_a_type_sold_only_on_demand_costs_the_on_demand_price() -> None:
    got = priced(cloud("us-east-1a", None, 32.0), linked=pool(on_demand=None))
    assert got.spot_price == 32.0


def test_the_price_scales_to_the_pools_gpus_per_node() -> None:
    got = priced(cloud("us-east-1a", 8.0, 32.0), linked=pool(gpus=4))
    assert (got.spot_price, got.on_demand_price) == (4.0, 16.0)


def test_a_link_no_provider_matches_keeps_its_price_and_is_reported() -> None:
    lone = pool(source="absent", spot=0.0, on_demand=0.0)
    other_type = cloud("us-east-1a", 9.0, 32.0, itype="p5.48xlarge")
    found = price_links({"cloud": (other_type,), "cluster": (lone,)})
    assert found.offerings["cluster"] == (lone,)
    assert found.unmatched == (lone,)
    assert found.offerings["cloud"] == (other_type,)


def test_without_links_nothing_is_copied() -> None:
    offered = (cloud("us-east-1a", 9.0, 32.0),)
    found = price_links({"cloud": offered})
    assert found.offerings["cloud"] is offered and found.unmatched == ()


class Listed:
    def __init__(self, name: str, offered: Sequence[Offering]) -> None:
        self.name = name
        self.offered = list(offered)

    def offerings(self) -> list[Offering]:
        return list(self.offered)


def test_the_cache_prices_links_in_its_index_find_and_snapshots_and_follows_the_source() -> None:
    source = Listed("cloud", [cloud("us-east-1a", 9.0, 32.0)])
    cluster = Listed("cluster", [pool(frozenset({Market.SPOT}), on_demand=0.5)])
    cache = MarketCache({"cluster": cluster, "cloud": source},  # type: ignore[dict-item]
                        clock=ManualClock(datetime(2026, 12, 4, tzinfo=UTC)))  # fmt: skip
    linked = cluster.offered[0]
    # The index orders the reserved on-demand price (0.5) before the cloud's (32).
    bucket = cache.offerings().bucket("A100", 8, Market.ON_DEMAND)
    assert [o.pool.provider for o in bucket] == ["cluster", "cloud"]
    assert cache.offerings().bucket("A100", 8, Market.SPOT)[0].spot_price == 9.0
    found = cache.find(linked.pool)
    assert found is not None and found.spot_price == 9.0
    assert cache.snapshots()["cluster"].offerings[0].spot_price == 9.0
    assert cache.unpriced() == ()
    source.offered = [cloud("us-east-1a", 6.0, 32.0)]  # the spot price moves
    cache.refresh("cloud")
    found = cache.find(linked.pool)
    assert found is not None and found.spot_price == 6.0
    source.offered = []  # the cloud no longer lists the type: the pool's own price
    cache.refresh("cloud")
    found = cache.find(linked.pool)
    assert found is not None and found.spot_price == 0.0
    assert cache.unpriced() == (linked,)


def test_a_link_survives_the_board(store: SqlStore) -> None:
    board = SqlOfferingBoard(store.engine, lambda: datetime(2026, 12, 4, tzinfo=UTC))
    linked = pool(frozenset({Market.SPOT}))
    board.publish("cluster", (linked,))
    published = board.read("cluster")
    assert published is not None and published.offerings == (linked,)
