"""A command shows its times in the zone of the config it read."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotd.cli.commands.options import settings_of
from spotd.cli.render.console import use_zone, when
from spotd.core.timefmt import Precision

AT = datetime(2026, 12, 4, 15, 21, 44, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _back_to_utc() -> Iterator[None]:
    yield
    use_zone(UTC)


def test_times_are_utc_until_a_config_names_a_zone() -> None:
    assert when(AT) == "2026-12-04 15:21:44Z"
    assert when(AT, Precision.MINUTE) == "2026-12-04 15:21Z"


def test_the_configs_display_zone_is_the_commands(tmp_path: Path) -> None:
    config = tmp_path / "spotd.toml"
    config.write_text(f'data_dir = "{tmp_path}"\n[display]\ntimezone = "Europe/Berlin"\n')
    settings = settings_of(config)
    assert settings.display.timezone == "Europe/Berlin"
    assert when(AT) == "2026-12-04 16:21:44+01:00"
