"""Spot prices from the EC2 price history, on-demand prices from the Price List API."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from .clients import Client
from .errors import map_aws_errors

log = logging.getLogger(__name__)

LINUX = "Linux/UNIX"
"""The spot price history's product description of Linux instances in a VPC."""

ON_DEMAND_ATTRIBUTES: Mapping[str, str] = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    # "Used" is the plain on-demand rate; the other statuses price capacity reservations.
    "capacitystatus": "Used",
}
"""Product attributes of the one Price List entry that is plain Linux on-demand."""


def latest_spot_prices(
    ec2: Client, instance_types: Iterable[str], now: datetime
) -> dict[tuple[str, str], float]:
    """(zone name, instance type) -> the current Linux spot price in USD per hour.

    AWS returns the price in effect at ``StartTime`` plus any change after it,
    over several pages; the newest row of each zone and type wins.
    """
    wanted = sorted(set(instance_types))
    newest: dict[tuple[str, str], tuple[datetime, float]] = {}
    if not wanted:
        return {}
    with map_aws_errors("DescribeSpotPriceHistory"):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=wanted, ProductDescriptions=[LINUX], StartTime=now
        )
        rows = [row for page in pages for row in page.get("SpotPriceHistory", [])]
    for row in rows:
        parsed = _spot_row(row)
        if parsed is None:
            continue
        key, at, price = parsed
        if key not in newest or at > newest[key][0]:
            newest[key] = (at, price)
    return {key: price for key, (_, price) in newest.items()}


def _spot_row(row: Mapping[str, Any]) -> tuple[tuple[str, str], datetime, float] | None:
    try:
        price = float(row["SpotPrice"])
        key = (str(row["AvailabilityZone"]), str(row["InstanceType"]))
        at = row["Timestamp"]
    except (KeyError, TypeError, ValueError):
        log.warning("aws: unreadable spot price row %r", row)
        return None
    if price <= 0 or not isinstance(at, datetime):
        return None
    return key, at, price


def on_demand_filters(region: str, instance_type: str) -> list[dict[str, str]]:
    """Price List filters that leave only the plain Linux on-demand entry of a type."""
    terms = {**ON_DEMAND_ATTRIBUTES, "instanceType": instance_type, "regionCode": region}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()]


def on_demand_price(pricing: Client, region: str, instance_type: str) -> float | None:
    """The Linux on-demand price of a type in a region, USD per hour; None if unlisted."""
    with map_aws_errors("GetProducts"):
        pages = pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=on_demand_filters(region, instance_type)
        )
        items = [item for page in pages for item in page.get("PriceList", [])]
    prices = [p for p in map(parse_on_demand, items) if p is not None]
    if len(set(prices)) > 1:
        log.warning(
            "aws: %d on-demand prices for %s in %s; using the lowest",
            len(prices),
            instance_type,
            region,
        )
    return min(prices, default=None)


def parse_on_demand(item: str | Mapping[str, Any]) -> float | None:
    """The hourly on-demand USD price of one ``PriceList`` entry (a JSON string).

    None for an entry that is not plain Linux on-demand, or has no positive
    hourly price: the filters should have left those out, but a price that
    is wrong by a licence or a reservation is worse than none.
    """
    product = json.loads(item) if isinstance(item, str) else item
    attributes = (product.get("product") or {}).get("attributes") or {}
    if any(attributes.get(k) != v for k, v in ON_DEMAND_ATTRIBUTES.items()):
        return None
    if attributes.get("marketoption", "OnDemand") != "OnDemand":
        return None
    hourly = [
        float(dimension["pricePerUnit"]["USD"])
        for term in ((product.get("terms") or {}).get("OnDemand") or {}).values()
        for dimension in (term.get("priceDimensions") or {}).values()
        if dimension.get("unit") == "Hrs" and "USD" in (dimension.get("pricePerUnit") or {})
    ]
    positive = [p for p in hourly if p > 0]
    return min(positive) if positive else None
