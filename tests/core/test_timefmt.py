"""Times as people read them: one zone, 24-hour ISO 8601."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from spotd.core.timefmt import Precision, shown, zone_named

AT = datetime(2026, 7, 4, 15, 21, 44, 123_456, tzinfo=UTC)


def test_utc_is_the_default_with_a_z() -> None:
    assert shown(AT) == "2026-07-04 15:21:44Z"
    assert shown(AT, precision=Precision.MINUTE) == "2026-07-04 15:21Z"
    assert shown(AT, precision=Precision.DAY) == "2026-07-04"


def test_a_named_zone_gives_its_offset_in_summer_and_winter() -> None:
    berlin = zone_named("Europe/Berlin")
    assert shown(AT, berlin) == "2026-07-04 17:21:44+02:00"
    assert shown(AT - timedelta(days=180), berlin) == "2026-01-05 16:21:44+01:00"


def test_a_negative_offset_with_minutes() -> None:
    newfoundland = timezone(-timedelta(hours=3, minutes=30))
    assert shown(AT, newfoundland) == "2026-07-04 11:51:44-03:30"


def test_a_naive_time_is_taken_as_utc() -> None:
    assert shown(AT.replace(tzinfo=None)) == "2026-07-04 15:21:44Z"


@pytest.mark.parametrize("name", ["UTC", "utc", "Z"])
def test_utc_by_any_of_its_names(name: str) -> None:
    assert zone_named(name) is UTC


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd"])
def test_an_unknown_zone_is_a_clear_error(name: str) -> None:
    with pytest.raises(ValueError, match="unknown time zone"):
        zone_named(name)
