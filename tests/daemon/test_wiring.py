"""Building the daemon's parts from settings: the clock its records are on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotd.core.clock import WallClock
from spotd.core.errors import ConfigError
from spotd.daemon.config import ProvidersSettings, Settings
from spotd.daemon.wiring import records_clock
from spotd_sim import SimClock, SimSettings


def test_reports_read_the_simulated_markets_clock_once_it_has_started(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, providers=ProvidersSettings(sim=SimSettings(speed=60)))
    assert isinstance(records_clock(settings), WallClock)  # no simulated time yet
    far = datetime(2031, 1, 1, tzinfo=UTC)
    settings.sim_state_dir.mkdir(parents=True)
    SimClock(settings.sim_state_dir, 60, sim_epoch=far)
    now = records_clock(settings).now()
    assert far <= now < far + timedelta(hours=1)
    off = Settings(data_dir=tmp_path, providers=ProvidersSettings(sim=SimSettings(enabled=False)))
    assert isinstance(records_clock(off), WallClock)


def test_an_unreadable_simulated_clock_is_a_config_error(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    settings.sim_state_dir.mkdir(parents=True)
    (settings.sim_state_dir / "clock.json").write_text('{"speed": 60}')
    with pytest.raises(ConfigError, match=r"^\[providers\.sim\]: "):
        records_clock(settings)
