"""The daemon log's timestamps are in the display zone, 24-hour ISO 8601."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from spotd.core.timefmt import zone_named
from spotd.daemon.logtimes import ZonedFormatter, use_zone_in_log


def _record(at: datetime) -> logging.LogRecord:
    record = logging.LogRecord("spotd.x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    record.created = at.timestamp()
    return record


def test_a_line_carries_its_time_in_utc_by_default() -> None:
    line = ZonedFormatter().format(_record(datetime(2026, 12, 4, 15, 0, 1, tzinfo=UTC)))
    assert line == "2026-12-04 15:00:01Z INFO spotd.x: hello you"


def test_a_configured_zone_gives_its_offset() -> None:
    formatter = ZonedFormatter(zone=zone_named("Asia/Kolkata"))
    line = formatter.format(_record(datetime(2026, 12, 4, 15, 0, 1, tzinfo=UTC)))
    assert line.startswith("2026-12-04 20:30:01+05:30 INFO"), line


def test_every_handler_of_the_logger_gets_the_zone() -> None:
    logger = logging.getLogger("spotd.test_logtimes")
    first, second = logging.StreamHandler(), logging.StreamHandler()
    logger.addHandler(first)
    logger.addHandler(second)
    try:
        use_zone_in_log(zone_named("UTC"), logger)
        for handler in (first, second):
            assert isinstance(handler.formatter, ZonedFormatter)
            assert handler.formatter.zone is UTC
    finally:
        logger.removeHandler(first)
        logger.removeHandler(second)
