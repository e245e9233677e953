"""Linux spot and pay-as-you-go prices from the Azure Retail Prices API.

The API (``GET {base}/api/retail/prices?$filter=...``) needs no credentials
and pages its answer through ``NextPageLink``. One query per region and size
returns every meter of that size: Windows and Linux, spot, low priority,
pay-as-you-go, dev/test and reservations. :func:`pick_prices` keeps the Linux
hourly consumption rows and tells spot from on-demand by ``skuName``.

Prices change rarely (the public catalogue is updated a few times a month),
so answers are cached for an hour; when a refresh fails, the last known
price is used and a warning logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.errors import ProviderError, ProviderUnavailable
from spotd.market.ttl import TtlCache

from .errors import PROVIDER, map_azure_errors

log = logging.getLogger(__name__)

CACHE_SECONDS = 3600.0
MAX_PAGES = 50
"""Pages followed per query; a size has a few dozen meters, so more means a loop."""
TIMEOUT_SECONDS = 30.0

Row = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PricePair:
    """USD per node-hour of one size in one region; None where it is not sold."""

    spot: float | None
    on_demand: float | None


def _odata_quote(value: str) -> str:
    # OData string literals escape a quote by doubling it.
    return "'" + value.replace("'", "''") + "'"


def price_filter(region: str, size: str) -> str:
    """The ``$filter`` for every Virtual Machines meter of ``size`` in ``region``."""
    return (
        f"serviceName eq 'Virtual Machines' and armRegionName eq {_odata_quote(region)} "
        f"and armSkuName eq {_odata_quote(size)}"
    )


def _is_linux_hourly(row: Row) -> bool:
    return (
        row.get("type") == "Consumption"
        and row.get("unitOfMeasure") == "1 Hour"
        and "Windows" not in str(row.get("productName", ""))
    )


def _kind(row: Row) -> str | None:
    """"spot", "on-demand", or None for a row that is neither (low priority)."""
    sku_name = str(row.get("skuName", ""))
    if "Low Priority" in sku_name:
        return None
    return "spot" if "Spot" in sku_name else "on-demand"


def _latest_price(rows: list[Row]) -> float | None:
    # A meter whose price changed is listed once per effective date: take the
    # newest; among rows of the same date, the lowest.
    priced = [r for r in rows if isinstance(r.get("retailPrice"), int | float)]
    priced = [r for r in priced if float(r["retailPrice"]) > 0]
    if not priced:
        return None
    newest = max(str(r.get("effectiveStartDate", "")) for r in priced)
    return min(float(r["retailPrice"]) for r in priced
               if str(r.get("effectiveStartDate", "")) == newest)  # fmt: skip


def pick_prices(rows: Iterable[Row], region: str, size: str) -> PricePair:
    """The Linux spot and on-demand hourly prices of ``size`` in ``region`` among ``rows``."""
    mine = [
        r for r in rows
        if _is_linux_hourly(r)
        and str(r.get("armRegionName", "")).lower() == region.lower()
        and str(r.get("armSkuName", "")).lower() == size.lower()
    ]  # fmt: skip
    return PricePair(
        spot=_latest_price([r for r in mine if _kind(r) == "spot"]),
        on_demand=_latest_price([r for r in mine if _kind(r) == "on-demand"]),
    )


class RetailPrices:
    """A cached client of the Retail Prices API at ``base_url``.

    ``clock``'s monotonic seconds age the cache (tests step it to expire the cache).
    """

    def __init__(
        self,
        base_url: str,
        *,
        http: httpx.Client | None = None,
        cache_seconds: float = CACHE_SECONDS,
        clock: Clock = WALL,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._http = http or httpx.Client(timeout=TIMEOUT_SECONDS)
        self._cache: TtlCache[tuple[str, str], PricePair] = TtlCache(cache_seconds, clock.monotonic)

    def prices(self, region: str, size: str) -> PricePair:
        """Prices of ``size`` in ``region``, from the cache when under an hour old."""
        key = (region.lower(), size.lower())
        try:
            return self._cache.get_or_load(
                key, lambda: pick_prices(self._rows(region, size), region, size)
            )
        except ProviderError as exc:
            last = self._cache.last(key)
            if last is None:
                raise
            log.warning("azure prices of %s in %s: %s; using the last known", size, region, exc)
            return last

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()

    def __enter__(self) -> RetailPrices:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rows(self, region: str, size: str) -> list[Row]:
        operation = f"retail prices of {size} in {region}"
        with map_azure_errors(operation):
            try:
                return list(self._pages(price_filter(region, size)))
            except ValueError as exc:  # not JSON, or not the API's shape
                raise ProviderUnavailable(
                    f"azure {operation}: unreadable answer", provider=PROVIDER, code="BadResponse"
                ) from exc

    def _pages(self, odata_filter: str) -> Iterator[Row]:
        url: str | None = f"{self._base}/api/retail/prices"
        params: dict[str, str] | None = {"$filter": odata_filter}
        for _ in range(MAX_PAGES):
            if url is None:
                return
            response = self._http.get(url, params=params)
            response.raise_for_status()
            body = response.json()
            if not isinstance(body, dict):
                raise ValueError("the answer is not a JSON object")
            yield from (i for i in body.get("Items") or [] if isinstance(i, dict))
            url, params = self._next(body.get("NextPageLink")), None
        if url is not None:
            log.warning("azure prices: stopped after %d pages of %s", MAX_PAGES, odata_filter)

    def _next(self, link: object) -> str | None:
        """The next page's URL, only when it is on the API's own host."""
        if not isinstance(link, str) or not link:
            return None
        base, nxt = urlsplit(self._base), urlsplit(link)
        if (nxt.scheme, nxt.netloc) != (base.scheme, base.netloc):
            # Never send requests where a response tells us to, off the API's host.
            log.warning("azure prices: ignoring a next page link off %s", base.netloc)
            return None
        return link
