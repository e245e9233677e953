"""The leader's price polls, published in the database for the other daemons.

Price and capacity APIs have rate limits, and N daemons polling each would
spend N times the quota for the same answer. So only the leading daemon
polls; after each good poll it replaces its row per provider here, and the
others read the row instead (see :mod:`spotd.daemon.polling`). Offerings are
stored as compact JSON rows, zlib-compressed: 20,000 offerings are a few
hundred kilobytes.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, delete, insert, select

from spotd.core.contracts import Published
from spotd.core.network import Fabric, Interconnect
from spotd.core.values import Market, Offering, Pool, PriceLink
from spotd.store.tables import PUBLISHED

_Row = list[Any]


def _encode(offerings: Sequence[Offering]) -> bytes:
    rows: list[_Row] = [
        [o.pool.provider, o.pool.region, o.pool.zone, o.pool.instance_type, o.gpu,
         o.gpus_per_node, o.gpu_memory_gb, o.interconnect.fabric.value,
         o.interconnect.gbps_per_gpu, o.spot_price, o.on_demand_price, o.capacity,
         o.notice_seconds, _link(o.price_link)]
        for o in offerings
    ]  # fmt: skip
    return zlib.compress(json.dumps(rows, separators=(",", ":")).encode(), 6)


def _link(link: PriceLink | None) -> list[Any] | None:
    if link is None:
        return None
    source = link.source
    markets = sorted(m.value for m in link.markets)
    return [source.provider, source.region, source.zone, source.instance_type, markets]


def _decode(payload: bytes) -> tuple[Offering, ...]:
    return tuple(map(_offering, json.loads(zlib.decompress(payload))))


def _offering(r: list[Any]) -> Offering:
    # The rows are ours (written by _encode), so they are trusted as they come.
    pool = Pool(r[0], r[1], r[2], r[3])
    fabric = Interconnect(Fabric(r[7]), r[8])
    # Rows published before price links have 13 columns.
    link = _unlink(r[13]) if len(r) > 13 else None
    return Offering(pool, r[4], r[5], r[6], fabric, r[9], r[10], r[11], r[12], link)


def _unlink(link: list[Any] | None) -> PriceLink | None:
    if link is None:
        return None
    source = Pool(link[0], link[1], link[2], link[3])
    return PriceLink(source, frozenset(map(Market, link[4])))


class SqlOfferingBoard:
    """:class:`~spotd.core.contracts.OfferingBoard` on the store's database.

    ``now`` stamps a publication and ages it: on PostgreSQL the database's
    clock, so a reader whose own clock is off still sees the true age.
    """

    def __init__(self, engine: Engine, now: Callable[[], datetime]) -> None:
        self._engine = engine
        self._now = now

    def publish(self, provider: str, offerings: Sequence[Offering]) -> None:
        """Replace ``provider``'s publication with ``offerings``, stamped now."""
        row = {
            "provider": provider, "published_at": self._now(),
            "count": len(offerings), "payload": _encode(offerings),
        }  # fmt: skip
        with self._engine.begin() as conn:
            conn.execute(delete(PUBLISHED).where(PUBLISHED.c.provider == provider))
            conn.execute(insert(PUBLISHED), row)

    def read(self, provider: str) -> Published | None:
        """``provider``'s last publication and its age; None if there is none."""
        query = select(PUBLISHED.c.published_at, PUBLISHED.c.payload).where(
            PUBLISHED.c.provider == provider
        )
        with self._engine.connect() as conn:
            found = conn.execute(query).first()
        if found is None:
            return None
        age = (self._now() - found.published_at).total_seconds()
        return Published(_decode(found.payload), found.published_at, max(0.0, age))
