"""The market as users see it: ``spotd prices`` over the three clouds' real adapters.

The adapters drive their real SDK clients against the fakes of
``tests/harnesses`` (moto and botocore hooks for AWS, loopback servers for
GCP and Azure); the daemon runs in-process so it can be handed them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotd.cli.app import app
from spotd.core.clock import WallClock
from spotd.core.contracts import Provider
from spotd.daemon.config import DaemonSettings, SchedulingSettings, Settings
from spotd.daemon.process import Daemon
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.market.cache import MarketCache
from spotd.store import open_store
from spotd_policies.balanced import BalancedPolicy


@pytest.fixture
def clouds(tmp_path: Path) -> Iterator[dict[str, object]]:
    import harnesses.aws
    import harnesses.azure
    import harnesses.gcp

    with ExitStack() as stack:
        yield {
            name: stack.enter_context(module.make_harness(tmp_path / name))
            for name, module in (("aws", harnesses.aws), ("gcp", harnesses.gcp),
                                 ("azure", harnesses.azure))
        }


def daemon_for(tmp_path: Path, providers: dict[str, Provider]) -> Daemon:
    settings = Settings(
        data_dir=tmp_path / "spotd",
        database_url=f"sqlite:///{tmp_path / 'spotd' / 'spotd.db'}",
        daemon=DaemonSettings(port=0, tick_seconds=0.2, owner="t"),
        scheduling=SchedulingSettings(price_poll_seconds=0.2),
    )
    engine = Engine(
        open_store(settings.db_url), providers, BalancedPolicy(), WallClock(),
        EngineSettings(owner="t", checkpoints_dir=tmp_path / "ck"),
    )
    engine.market = MarketCache(providers, base_backoff_seconds=0.05, max_backoff_seconds=0.2)
    return Daemon(settings, engine=engine)


def prices_json(tmp_path: Path) -> dict[str, object]:
    config = tmp_path / "cli.toml"
    config.write_text(f'data_dir = "{tmp_path / "spotd"}"\n')
    result = CliRunner().invoke(app, ["prices", "--json", "--config", str(config)])
    assert result.exit_code == 0, result.output
    parsed: dict[str, object] = json.loads(result.stdout)
    return parsed


def test_prices_lists_all_three_clouds(tmp_path: Path, clouds: dict[str, object]) -> None:
    providers = {name: h.provider for name, h in clouds.items()}  # type: ignore[attr-defined]
    daemon = daemon_for(tmp_path, providers)
    daemon.start()
    try:
        daemon.engine.market.refresh_all()
        view = prices_json(tmp_path)
    finally:
        daemon.stop()
    offerings = view["offerings"]
    assert isinstance(offerings, list)
    assert {o["provider"] for o in offerings} == {"aws", "gcp", "azure"}
    for name in ("aws", "gcp", "azure"):
        mine = [o for o in offerings if o["provider"] == name]
        assert any(o["spot_price"] and o["on_demand_price"] for o in mine), name
        assert all(o["fabric"] and o["gbps_per_gpu"] > 0 for o in mine)
    fresh = {p["provider"]: p for p in view["providers"]}  # type: ignore[attr-defined]
    assert all(not p["stale"] and p["age_seconds"] is not None for p in fresh.values())


def test_a_failing_cloud_leaves_stale_data_and_a_running_daemon(
    tmp_path: Path, clouds: dict[str, object]
) -> None:
    providers = {name: h.provider for name, h in clouds.items()}  # type: ignore[attr-defined]
    aws = clouds["aws"]
    daemon = daemon_for(tmp_path, providers)
    daemon.start()
    try:
        daemon.engine.market.refresh_all()
        for _ in range(100):  # from now on every spot price poll fails
            aws.fake.fail_next("DescribeSpotPriceHistory", "InternalError", 500)  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while daemon.engine.market.snapshot("aws").failures < 3:
            assert time.monotonic() < deadline, "the scheduled polls should keep trying"
            time.sleep(0.05)
        view = prices_json(tmp_path)
        assert daemon.scheduler.running, "the daemon keeps going"
    finally:
        daemon.stop()
    status = {p["provider"]: p for p in view["providers"]}  # type: ignore[attr-defined]
    assert status["aws"]["stale"] is True
    assert status["aws"]["failures"] >= 3
    assert "ProviderUnavailable" in status["aws"]["error"]
    assert status["aws"]["age_seconds"] > 0
    assert status["aws"]["offerings"] > 0, "the last good offerings are kept"
    assert not status["gcp"]["stale"] and not status["azure"]["stale"]
