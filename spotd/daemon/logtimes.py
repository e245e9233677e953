"""The daemon log's timestamps: in the one zone every time is shown in, 24-hour
ISO 8601 (:mod:`spotd.core.timefmt`), not the host's local time with a comma."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, tzinfo

from spotd.core.timefmt import shown

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ZonedFormatter(logging.Formatter):
    """A formatter whose ``%(asctime)s`` is :func:`~spotd.core.timefmt.shown` in ``zone``."""

    def __init__(self, fmt: str = LOG_FORMAT, zone: tzinfo = UTC) -> None:
        super().__init__(fmt)
        self.zone = zone

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        # A log record's own creation time: the wall's, whatever the market's clock.
        return shown(datetime.fromtimestamp(record.created, UTC), self.zone)


def use_zone_in_log(zone: tzinfo, logger: logging.Logger | None = None) -> None:
    """Give every handler of ``logger`` (the root's by default) zoned timestamps."""
    for handler in (logger or logging.getLogger()).handlers:
        handler.setFormatter(ZonedFormatter(zone=zone))
