"""Building the daemon's parts from settings: the clock its records are on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotd.core.clock import WallClock
from spotd.core.errors import ConfigError
from spotd.daemon.config import ProvidersSettings, Settings, load_settings
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


def test_the_start_line_names_the_config_and_hides_the_database_password(tmp_path: Path) -> None:
    from spotd.daemon.process import start_summary

    settings = load_settings(
        None, data_dir=tmp_path,
        database_url="postgresql+psycopg://spotd:s3cret@db.internal:5432/spotd",
        email={"host": "smtp.example.com", "to": ["ml@example.com"]},
    )  # fmt: skip
    line = start_summary(settings, None, ["aws", "sim-gcp"])
    assert "s3cret" not in line and "spotd:***@db.internal" in line, line
    assert line.startswith("config: no config file (defaults and SPOTD_* variables);")
    assert "providers: aws, sim-gcp; email: on via smtp.example.com, to 1 address(es)" in line
    assert line.endswith("clock: real time, times shown in UTC"), line


def test_the_start_line_says_when_the_clock_is_not_real_time(tmp_path: Path) -> None:
    from spotd.daemon.process import start_summary
    from spotd_sim import SimClock

    settings = load_settings(None, data_dir=tmp_path, display={"timezone": "Europe/Berlin"})
    line = start_summary(settings, None, ["sim-aws"], SimClock(tmp_path / "sim", 60.0))
    assert line.endswith("clock: simulated clock, 60x real time, times shown in Europe/Berlin")


def test_the_embedded_default_runs_on_real_time(tmp_path: Path) -> None:
    from spotd.core.clock import clock_note

    settings = load_settings(None, data_dir=tmp_path)
    assert settings.providers.sim.speed == 1.0
    assert clock_note(records_clock(settings)) is None
