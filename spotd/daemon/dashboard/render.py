"""The dashboard's pages from its jinja2 templates, with the headers every answer carries."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from typing import Any

import jinja2
from fastapi.responses import HTMLResponse

from spotd.billing.report_model import usd
from spotd.core.timefmt import shown

SECURITY_HEADERS = {
    # Our own script and styles only, nothing inline and nothing from elsewhere:
    # an injected <script> would not run even if escaping ever failed.
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; script-src 'self'; style-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: with it, a form's POST would say Origin: null, which the
    # login's same-origin check refuses.
    "Referrer-Policy": "same-origin",
    # Pages show spend and job names: no shared cache keeps them.
    "Cache-Control": "no-store",
}


def page(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """The template ``name`` rendered with ``context``, as an answer."""
    html = environment().get_template(name).render(**context)
    return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)


@cache
def environment() -> jinja2.Environment:
    """The templates of ``spotd/daemon/dashboard/templates``, every value escaped."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("spotd.daemon.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["usd"] = lambda v: "–" if v is None else usd(v)
    env.filters["hours"] = hours
    env.filters["when"] = when
    env.filters["pct"] = lambda v: "–" if v is None else f"{v:.0f} %"
    return env


def hours(value: float | None) -> str:
    """Hours for people: ``–`` for none, minutes under one hour, ``-`` when late."""
    if value is None:
        return "–"
    if abs(value) < 1:
        return f"{value * 60:.0f} min"
    return f"{value:,.1f} h"


@jinja2.pass_context
def when(context: jinja2.runtime.Context, at: datetime | None) -> str:
    """A time to the second in the page's ``zone`` (UTC unless the page names one), on
    the engine's clock: on a simulated market, its own."""
    zone = context.get("zone") or UTC
    return "–" if at is None else shown(at, zone)
