"""The market page: every offering with both prices, fabric, freshness and capacity
signals, and each pool's price history as a chart (matplotlib SVG)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlencode

from matplotlib.axes import Axes
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

from spotd.billing.charts import ON_DEMAND, PALETTE, style_axes
from spotd.core.contracts import Clock
from spotd.core.values import Market, Pool, PricePoint
from spotd.daemon.dashboard.timeline import date2num
from spotd.daemon.reader import Reader
from spotd.daemon.views import MarketView, OfferingView, market_view

HISTORY_DAYS = 7
"""How far back a pool's chart goes, on the engine's clock."""


@dataclass(frozen=True)
class OfferingLine:
    """An offering as the table shows it, with spotd's own capacity signal."""

    offering: OfferingView
    signal: float | None
    """spotd's capacity signal for the pool from its own launches (None: no news)."""

    @property
    def pool(self) -> Pool:
        """The offering's pool."""
        o = self.offering
        return Pool(o.provider, o.region, o.zone, o.instance_type)


@dataclass(frozen=True)
class MarketFilter:
    """The offerings asked for, as ``spotd prices --provider --gpu`` takes them."""

    provider: str = ""
    gpu: str = ""

    @property
    def query(self) -> str:
        """The filter as the fragment's query string."""
        return urlencode({k: v for k, v in (("provider", self.provider), ("gpu", self.gpu)) if v})

    def keeps(self, o: OfferingView) -> bool:
        """Whether offering ``o`` passes."""
        return (not self.provider or o.provider == self.provider) and (
            not self.gpu or o.gpu.lower() == self.gpu.lower()
        )


@dataclass(frozen=True)
class MarketPage:
    """The market as the daemon sees it now."""

    view: MarketView
    lines: list[OfferingLine]
    """The offerings the filter keeps."""
    wanted: MarketFilter
    providers: list[str]
    gpus: list[str]
    """Every provider and GPU model offered, for the filter's choices."""


def market_page(reader: Reader, wanted: MarketFilter, wall: Clock) -> MarketPage:
    """Every provider's freshness by the ``wall`` clock, and the offerings ``wanted``
    keeps, by provider, zone and type."""
    view = market_view(reader.market.snapshots(), wall.now().timestamp())
    ordered = sorted(view.offerings, key=lambda o: (o.provider, o.zone, o.instance_type))
    signals = reader.market.signals
    lines = [
        OfferingLine(o, signals.signal(Pool(o.provider, o.region, o.zone, o.instance_type)))
        for o in ordered
        if wanted.keeps(o)
    ]
    return MarketPage(
        view, lines, wanted,
        providers=sorted({p.provider for p in view.providers}),
        gpus=sorted({o.gpu for o in view.offerings}),
    )  # fmt: skip


def pool_history(reader: Reader, pool: Pool) -> list[PricePoint]:
    """The pool's stored prices of the last :data:`HISTORY_DAYS` days, oldest first."""
    since = reader.clock.now() - timedelta(days=HISTORY_DAYS)
    return reader.store.price_history(pool, since=since)


def history_svg(pool: Pool, points: Sequence[PricePoint], clock: str | None) -> str:
    """Spot and on-demand prices of ``pool`` over time (steps), and the spot capacity."""
    fig = Figure(figsize=(8.0, 3.0), layout="constrained")
    FigureCanvasSVG(fig)
    ax = fig.add_subplot()
    style_axes(ax)
    ax.set_title(str(pool), fontsize=9, loc="left")
    if not points:
        ax.text(0.5, 0.5, "no price kept for this pool yet", ha="center", va="center",
                color="#57606a", transform=ax.transAxes)  # fmt: skip
        ax.set_xticks([])
        ax.set_yticks([])
    for market, colour in ((Market.SPOT, PALETTE[0]), (Market.ON_DEMAND, ON_DEMAND)):
        series = [p for p in points if p.market is market]
        if series:
            ax.step(_times(series), [p.price for p in series], where="post", color=colour,
                    marker="." if len(series) < 50 else None, label=f"{market} USD/h")  # fmt: skip
    if points:
        ax.set_ylabel("USD per node-hour", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("time (UTC" + (f", {clock} clock" if clock else "") + ")", fontsize=8)
        _capacity(ax, [p for p in points if p.market is Market.SPOT])
        ax.xaxis_date()
        ax.legend(fontsize=8, frameon=False, loc="upper left")
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def _capacity(ax: Axes, points: Sequence[PricePoint]) -> None:
    """The provider's spot capacity signal on a second axis, 0 to 1."""
    capacities = [(t, p.capacity) for t, p in zip(_times(points), points, strict=True)
                  if p.capacity is not None]  # fmt: skip
    if not capacities:
        return
    twin = ax.twinx()
    twin.plot([t for t, _ in capacities], [c for _, c in capacities], color=PALETTE[3], linewidth=1,
              linestyle="--", label="spot capacity")  # fmt: skip
    twin.set_ylim(0, 1.05)
    twin.set_ylabel("capacity (0-1)", fontsize=8)
    twin.tick_params(labelsize=8)
    twin.spines["top"].set_visible(False)
    twin.legend(fontsize=8, frameon=False, loc="upper right")


def _times(points: Sequence[PricePoint]) -> list[float]:
    return [date2num(p.at) for p in points]
