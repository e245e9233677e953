"""The simulated spot market: seeded model, traces, prices, catalog."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotd.core.errors import ProviderError
from spotd.core.network import Fabric
from spotd.core.values import Pool
from spotd_sim import (
    PROVIDERS,
    MarketConfig,
    SimMarket,
    TraceError,
    catalog,
)

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
AWS_POOL = Pool("sim-aws", "us-east-1", "us-east-1a", "p3.2xlarge")
GCP_POOL = Pool("sim-gcp", "us-central1", "us-central1-a", "a3-highgpu-8g")


def market(seed: int = 7, **kwargs: object) -> SimMarket:
    return SimMarket(MarketConfig(seed=seed, **kwargs), epoch=EPOCH)  # type: ignore[arg-type]


def at_hours(h: float) -> datetime:
    return EPOCH + timedelta(hours=h)


def up_share(m: SimMarket, pool: Pool, hours: float) -> float:
    """Time-weighted share of [0, hours) the pool is up, walking the change points."""
    end = at_hours(hours)
    t, up_seconds = EPOCH, 0.0
    while t < end:
        change = m.next_change(pool, t) or end
        nxt = min(change, end)
        if m.available(pool, t):
            up_seconds += (nxt - t).total_seconds()
        t = nxt
    return up_seconds / (hours * 3600)


def write_trace(path: Path, gap: float, data: list[int]) -> Path:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


# -- seeded model -------------------------------------------------------------


def test_same_seed_same_history_in_two_markets() -> None:
    a, b = market(seed=11), market(seed=11)
    pools = catalog.all_pools()[:20]
    # Ask b in reverse time order: lazy chunking must not change the answers.
    times = [at_hours(h * 0.37) for h in range(2000)]
    expected = [[a.available(p, t) for t in times] for p in pools]
    got = [[b.available(p, t) for t in reversed(times)][::-1] for p in pools]
    assert got == expected
    assert [a.next_change(p, times[5]) for p in pools] == [
        b.next_change(p, times[5]) for p in pools
    ]


def test_different_seeds_differ() -> None:
    a, b = market(seed=1), market(seed=2)
    times = [at_hours(h) for h in range(500)]
    assert [a.available(AWS_POOL, t) for t in times] != [b.available(AWS_POOL, t) for t in times]


def test_pools_differ_under_one_seed() -> None:
    m = market()
    times = [at_hours(h) for h in range(500)]
    other = Pool("sim-aws", "us-east-1", "us-east-1c", "p3.2xlarge")
    assert [m.available(AWS_POOL, t) for t in times] != [m.available(other, t) for t in times]


def test_long_run_availability_matches_the_means() -> None:
    m = market(mean_up_hours=3.0, mean_down_hours=1.0, pool_variation=0.0)
    pools = catalog.all_pools()[:4]
    shares = [up_share(m, p, hours=20_000) for p in pools]
    assert sum(shares) / len(shares) == pytest.approx(0.75, abs=0.02)


def test_pool_variation_spreads_pools() -> None:
    m = market(mean_up_hours=3.0, mean_down_hours=1.0, pool_variation=0.8)
    shares = [up_share(m, p, hours=2_000) for p in catalog.all_pools()[:12]]
    assert max(shares) - min(shares) > 0.1


def test_next_change_flips_availability() -> None:
    m = market()
    t = at_hours(10)
    change = m.next_change(AWS_POOL, t)
    assert change is not None and change > t
    just_before = change - timedelta(microseconds=1)
    assert m.available(AWS_POOL, just_before) == m.available(AWS_POOL, t)
    assert m.available(AWS_POOL, change) != m.available(AWS_POOL, t)


def test_zero_mean_down_is_always_up() -> None:
    m = market(mean_down_hours=0.0)
    assert all(m.available(AWS_POOL, at_hours(h)) for h in range(0, 5000, 7))
    assert m.next_change(AWS_POOL, EPOCH) is None


def test_before_the_epoch_behaves_like_the_epoch() -> None:
    m = market()
    assert m.available(AWS_POOL, EPOCH - timedelta(days=3)) == m.available(AWS_POOL, EPOCH)


def test_up_pool_has_room_for_max_nodes_only() -> None:
    m = market(mean_down_hours=0.0, max_nodes=4)
    assert m.available(AWS_POOL, EPOCH, nodes=4)
    assert not m.available(AWS_POOL, EPOCH, nodes=5)


def test_capacity_signal_follows_availability() -> None:
    m = market()
    for h in range(0, 300, 3):
        t = at_hours(h)
        assert m.capacity_signal(AWS_POOL, t) == (1.0 if m.available(AWS_POOL, t) else 0.0)


def test_bad_market_config_is_refused() -> None:
    with pytest.raises(ValueError, match="mean_up_hours"):
        MarketConfig(seed=1, mean_up_hours=0)
    with pytest.raises(ValueError, match="mean_down_hours"):
        MarketConfig(seed=1, mean_down_hours=-1)


# -- prices ---------------------------------------------------------------------


def test_spot_price_drifts_within_bounds_and_is_deterministic() -> None:
    a, b = market(price_drift=0.05), market(price_drift=0.05)
    prices = [a.spot_price(AWS_POOL, 1.0, at_hours(h)) for h in range(200)]
    assert prices == [b.spot_price(AWS_POOL, 1.0, at_hours(h)) for h in range(200)]
    assert all(0.95 <= p <= 1.05 for p in prices)
    assert len(set(prices)) > 50
    # Constant within the hour.
    assert a.spot_price(AWS_POOL, 1.0, at_hours(3.1)) == a.spot_price(AWS_POOL, 1.0, at_hours(3.9))
    assert market(price_drift=0).spot_price(AWS_POOL, 2.5, at_hours(7)) == 2.5


# -- traces ---------------------------------------------------------------------


def test_trace_drives_a_zone(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "z.json", 60, [2, 0, 1, 3])
    m = market(traces=MarketConfig.trace_pairs({"us-east-1a": trace}))

    def sec(s: float) -> datetime:
        return EPOCH + timedelta(seconds=s)

    assert m.available(AWS_POOL, sec(0), nodes=2)
    assert not m.available(AWS_POOL, sec(0), nodes=3)
    assert not m.available(AWS_POOL, sec(60))
    assert m.available(AWS_POOL, sec(150), nodes=1)
    assert not m.available(AWS_POOL, sec(150), nodes=2)
    assert m.available(AWS_POOL, sec(190), nodes=3)
    # Past the end it starts over.
    assert m.spot_nodes(AWS_POOL, sec(240)) == 2
    assert m.spot_nodes(AWS_POOL, sec(240 * 5 + 61)) == 0
    assert m.next_change(AWS_POOL, sec(10)) == sec(60)
    assert m.next_change(AWS_POOL, sec(10), nodes=3) == sec(180)
    assert m.capacity_signal(AWS_POOL, sec(61)) == 0.0
    # Every type in the zone follows it; other zones do not.
    p5 = Pool("sim-aws", "us-east-1", "us-east-1a", "p5.48xlarge")
    assert m.spot_nodes(p5, sec(60)) == 0
    assert m.config.trace_for(Pool("sim-aws", "us-east-1", "us-east-1c", "p3.2xlarge")) is None


def test_trace_pattern_on_pool_and_first_match_wins(tmp_path: Path) -> None:
    up = write_trace(tmp_path / "up.json", 60, [5])
    down = write_trace(tmp_path / "down.json", 60, [0])
    m = market(traces=MarketConfig.trace_pairs({"sim-gcp/*/a3-*": down, "us-central1-*": up}))
    assert not m.available(GCP_POOL, at_hours(1))
    assert m.next_change(GCP_POOL, at_hours(1)) is None
    l4 = Pool("sim-gcp", "us-central1", "us-central1-b", "g2-standard-4")
    assert m.available(l4, at_hours(1), nodes=5)


def test_config_round_trips_and_narrows_to_a_pool(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "z.json", 30, [1, 0])
    config = MarketConfig(seed=3, traces=MarketConfig.trace_pairs({"us-east-1a": trace}))
    assert MarketConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    narrowed = config.for_pool(AWS_POOL)
    assert narrowed.trace_for(AWS_POOL) == str(trace.resolve())
    assert config.for_pool(GCP_POOL).traces == ()
    a = SimMarket(config, epoch=EPOCH)
    b = SimMarket(narrowed, epoch=EPOCH)
    times = [EPOCH + timedelta(seconds=s) for s in range(0, 600, 7)]
    assert [a.available(AWS_POOL, t) for t in times] == [b.available(AWS_POOL, t) for t in times]


def test_shared_traces_load_if_present() -> None:
    folder = Path("/work/shared/traces/aws-v100-9zones-2023-02")
    if not folder.is_dir():
        pytest.skip("shared traces not present")
    traces = {p.name.split("_")[0]: p for p in folder.glob("*.json")}
    m = market(traces=MarketConfig.trace_pairs(traces))
    share = sum(m.available(AWS_POOL, at_hours(h)) for h in range(1000)) / 1000
    assert 0.0 <= share <= 1.0


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2, 3]", "JSON object"),
        ('{"metadata": {"gap_seconds": 60}}', "missing 'data'"),
        ('{"metadata": {"gap_seconds": 60}, "data": []}', "'data' is empty"),
        ('{"metadata": {"gap_seconds": 60}, "data": [1, -2]}', r"data\[1\]' must not be negative"),
        ('{"metadata": {"gap_seconds": 60}, "data": [1, 1.5]}', r"data\[1\]' must be an integer"),
        ('{"metadata": {"gap_seconds": 60}, "data": ["1"]}', r"data\[0\]' must be an integer"),
        ('{"metadata": {"gap_seconds": 60}, "data": [true]}', r"data\[0\]' must be an integer"),
        ('{"data": [1]}', "missing 'metadata.gap_seconds'"),
        ('{"metadata": {"gap_seconds": 0}, "data": [1]}', "must be positive"),
        ('{"metadata": {"gap_seconds": "60"}, "data": [1]}', "must be a number"),
    ],
)
def test_malformed_trace_names_file_and_problem(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "bad-trace.json"
    path.write_text(content)
    with pytest.raises(TraceError, match=problem) as info:
        market(traces=MarketConfig.trace_pairs({"us-east-1a": path}))
    assert "bad-trace.json" in str(info.value)
    assert isinstance(info.value, ProviderError)
    assert isinstance(info.value, ValueError)


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"missing\.json: cannot be read"):
        market(traces=MarketConfig.trace_pairs({"*": tmp_path / "missing.json"}))


# -- catalog --------------------------------------------------------------------


def test_catalog_has_three_providers_with_sane_prices() -> None:
    assert PROVIDERS == ("sim-aws", "sim-gcp", "sim-azure")
    for provider in PROVIDERS:
        entries = catalog.entries(provider)
        assert len({e.pool.zone for e in entries}) >= 6
        assert len({e.pool.region for e in entries}) >= 3
        for e in entries:
            assert 0.299 <= e.base_spot_price / e.on_demand_price <= 0.451
    types = {e.pool.instance_type: e.shape for es in catalog.CATALOG.values() for e in es}
    assert types["p5.48xlarge"].interconnect.fabric is Fabric.EFA
    assert types["p5.48xlarge"].interconnect.gbps_per_gpu == 400
    assert types["Standard_ND96isr_H100_v5"].interconnect.fabric is Fabric.INFINIBAND
    assert types["a3-megagpu-8g"].gpus_per_node == 8
    assert types["g2-standard-4"].gpu == "L4"
    # Spot shares vary by zone.
    p3 = [e for e in catalog.entries("sim-aws") if e.pool.instance_type == "p3.2xlarge"]
    assert len({e.base_spot_price for e in p3}) > 1
    with pytest.raises(ValueError, match="unknown simulated provider"):
        catalog.entries("sim-oracle")


def test_lifetimes_are_drawn_per_launch_the_same_in_every_run() -> None:
    pools = (AWS_POOL, GCP_POOL)
    first, second = market(lifetimes=True), market(lifetimes=True)
    # Two runs ask in another order and at other moments: the schedule is the same.
    one = {p: [first.lifetime(p, n) for n in range(8)] for p in pools}
    two = {p: [second.lifetime(p, n) for n in reversed(range(8))][::-1] for p in reversed(pools)}
    assert one == two
    assert len(set(one[AWS_POOL])) == 8 and one[AWS_POOL] != one[GCP_POOL]
    assert [market(seed=8, lifetimes=True).lifetime(AWS_POOL, n) for n in range(8)] != one[AWS_POOL]
    # The mean is the pool's mean up time (6 h, spread by the pool's character).
    many = [first.lifetime(AWS_POOL, n).total_seconds() / 3600 for n in range(2000)]
    assert 6 * math.exp(-1) < sum(many) / len(many) < 6 * math.exp(1)
    # Pools never run short: the lifetimes alone take launches back.
    assert all(first.available(AWS_POOL, at_hours(h)) for h in range(0, 200, 3))
    assert first.next_change(AWS_POOL, at_hours(1)) is None
    assert MarketConfig.from_json(first.config.to_json()).lifetimes is True
    assert MarketConfig.from_json({**first.config.to_json(), "lifetimes": None}).lifetimes is False
