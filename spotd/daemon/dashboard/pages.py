"""The dashboard's pages, the fragments its script polls, and its chart images.

Read-only: nothing here changes a job. Each page is a template around a
fragment; ``dashboard.js`` asks for the fragment again every few seconds and
swaps it in, so a page follows the daemon without a reload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import RedirectResponse

from spotd.core.clock import WALL, clock_note
from spotd.core.contracts import Clock
from spotd.core.errors import JobNotFound
from spotd.core.values import JobRecord, Pool
from spotd.daemon.dashboard.auth import HOME_PATH, page_guard, part_guard
from spotd.daemon.dashboard.cost_page import JOBS_SHOWN, KEEP_SECONDS, CostReports, window_of
from spotd.daemon.dashboard.job_page import job_detail, notices_by_attempt
from spotd.daemon.dashboard.jobs import JobFilter, job_table
from spotd.daemon.dashboard.kept import KeptBuilds
from spotd.daemon.dashboard.market_page import (
    MarketFilter,
    history_svg,
    market_page,
    pool_history,
)
from spotd.daemon.dashboard.render import SECURITY_HEADERS, page
from spotd.daemon.dashboard.session import COOKIE_PATH, SESSION_COOKIE, Sessions
from spotd.daemon.dashboard.timeline import timeline_svg
from spotd.daemon.reader import Reader
from spotd.daemon.views import STATUS_WORDS, attempt_view
from spotd.market.ttl import TtlCache

REFRESH_SECONDS = 2
"""How often a page's fragment is asked for again."""
SVG = "image/svg+xml"


@dataclass(frozen=True)
class DashboardRoutes:
    """The dashboard's routes by what a missing session gets: ``pages`` a 303 to the
    login, ``parts`` (fragments and charts) a 401."""

    pages: APIRouter
    parts: APIRouter


def create_pages_routers(
    reader: Reader, sessions: Sessions, wall: Clock = WALL
) -> DashboardRoutes:
    """Every page, fragment and chart of the dashboard, each behind the session.

    ``wall`` is the real clock (price poll ages, how long drawings are kept), which
    the daemon's, on a simulated market, is not.
    """
    # Pages send a browser without a session to the login; the parts a page's script
    # or its images ask for answer 401.
    pages = APIRouter(include_in_schema=False, dependencies=[Depends(page_guard(sessions))])
    parts = APIRouter(include_in_schema=False, dependencies=[Depends(part_guard(sessions))])
    costs = CostReports(reader, wall)
    # Charts drawn lately, by what they show: a job's timeline by its version (and while
    # it runs, the refresh period). Drawing one takes matplotlib a few hundred
    # milliseconds, and a page's script asks again every few seconds.
    drawn: TtlCache[tuple[str, str, str], str] = TtlCache(60.0, wall.monotonic, max_items=64)
    # A pool's history: the chart kept is answered at once, and redrawn behind the
    # answer once 30 s old (a drawing takes about 0.4 s).
    histories: KeptBuilds[Pool, str] = KeptBuilds(
        30.0, max_items=64, name="spotd-charts", failure="the dashboard could not redraw %s",
        clock=wall,
    )
    clock = clock_note(reader.clock)

    def shown(name: str, request: Request, **context: Any) -> Response:
        session = request.cookies[SESSION_COOKIE]  # the guard found it valid
        return page(name, session=session, logout_token=sessions.logout_form_token(session),
                    clock=clock, zone=reader.zone, refresh=REFRESH_SECONDS,
                    **context)  # fmt: skip

    @pages.get(COOKIE_PATH)
    @pages.get(f"{COOKIE_PATH}/")
    def home() -> Response:
        return RedirectResponse(HOME_PATH, status_code=303, headers=SECURITY_HEADERS)

    @pages.get(f"{COOKIE_PATH}/jobs")
    def jobs(request: Request, status: str | None = None, name: str | None = None,
             cursor: str | None = None) -> Response:  # fmt: skip
        wanted = JobFilter.of(status, name, cursor)
        return shown("jobs.html.j2", request, nav="jobs", wanted=wanted,
                     table=job_table(reader, wanted), words=list(STATUS_WORDS))  # fmt: skip

    @parts.get(f"{COOKIE_PATH}/fragments/jobs")
    def jobs_part(status: str | None = None, name: str | None = None,
                  cursor: str | None = None) -> Response:  # fmt: skip
        wanted = JobFilter.of(status, name, cursor)
        return page("jobs_table.html.j2", wanted=wanted, table=job_table(reader, wanted),
                    zone=reader.zone)  # fmt: skip

    @pages.get(f"{COOKIE_PATH}/jobs/{{ref}}")
    def job(request: Request, ref: str) -> Response:
        detail = job_detail(reader, _job(reader, ref))
        return shown("job.html.j2", request, nav="jobs", d=detail, stamp=_stamp(detail.job, wall))

    @parts.get(f"{COOKIE_PATH}/fragments/jobs/{{ref}}")
    def job_part(ref: str) -> Response:
        detail = job_detail(reader, _job(reader, ref))
        return page("job_body.html.j2", d=detail, clock=clock, zone=reader.zone,
                    stamp=_stamp(detail.job, wall))  # fmt: skip

    @parts.get(f"{COOKIE_PATH}/jobs/{{ref}}/timeline.svg")
    def timeline(ref: str) -> Response:
        found = _job(reader, ref)

        def draw() -> str:
            attempts = reader.store.attempts(found.id)
            reports = reader.store.reports(found.id)
            notices = notices_by_attempt(attempts, reader.store.events(found.id))
            views = [attempt_view(a, 0.0, reports) for a in attempts]
            return timeline_svg(views, notices, reader.clock.now(), clock)

        svg = drawn.get_or_load(("timeline", found.id, _stamp(found, wall)), draw)
        return Response(svg, media_type=SVG, headers=SECURITY_HEADERS)

    def cost_context(since: str | None, until: str | None) -> dict[str, Any]:
        window = window_of(since, until, reader.clock.now())
        report = costs.ready(window)
        if report is not None:
            start, end = report.period.since, report.period.until
        else:
            start, end = window.resolved(reader.clock.now())
        return {"window": window, "report": report, "since": f"{start:%Y-%m-%dT%H:%M}",
                "until": f"{end:%Y-%m-%dT%H:%M}", "jobs_shown": JOBS_SHOWN,
                "keep": f"{KEEP_SECONDS:g}"}  # fmt: skip

    @pages.get(f"{COOKIE_PATH}/cost")
    def cost(request: Request, since: str | None = None, until: str | None = None) -> Response:
        return shown("cost.html.j2", request, nav="cost", **cost_context(since, until))

    @parts.get(f"{COOKIE_PATH}/fragments/cost")
    def cost_part(since: str | None = None, until: str | None = None) -> Response:
        return page("cost_body.html.j2", clock=clock, **cost_context(since, until))

    @parts.get(f"{COOKIE_PATH}/cost/{{name}}.png")
    def cost_chart(name: str, since: str | None = None,
                   until: str | None = None) -> Response:  # fmt: skip
        png = costs.chart(window_of(since, until, reader.clock.now()), name)
        if png is None:
            raise HTTPException(status_code=404, detail=f"no chart named {name!r}")
        return Response(png, media_type="image/png", headers=SECURITY_HEADERS)

    @pages.get(f"{COOKIE_PATH}/market")
    def market(request: Request, provider: str = "", gpu: str = "") -> Response:
        found = market_page(reader, MarketFilter(provider, gpu), wall)
        return shown("market.html.j2", request, nav="market", m=found)

    @parts.get(f"{COOKIE_PATH}/fragments/market")
    def market_part(provider: str = "", gpu: str = "") -> Response:
        return page("market_body.html.j2", m=market_page(reader, MarketFilter(provider, gpu), wall))

    @pages.get(f"{COOKIE_PATH}/market/pool")
    def pool(request: Request, provider: str, region: str, zone: str,
             instance_type: str) -> Response:  # fmt: skip
        return shown("pool.html.j2", request, nav="market",
                     pool=Pool(provider, region, zone, instance_type))  # fmt: skip

    @parts.get(f"{COOKIE_PATH}/market/history.svg")
    def history(provider: str, region: str, zone: str,
                instance_type: str) -> Response:  # fmt: skip
        where = Pool(provider, region, zone, instance_type)
        svg = histories.get(where, lambda: history_svg(where, pool_history(reader, where), clock))
        return Response(svg, media_type=SVG, headers=SECURITY_HEADERS)

    return DashboardRoutes(pages, parts)


def _job(reader: Reader, ref: str) -> JobRecord:
    try:
        return reader.store.find_job(ref)
    except JobNotFound as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from exc


def _stamp(job: JobRecord, wall: Clock) -> str:
    """What the timeline image's address changes with: the job's version, and while the
    job is active the ``wall`` time too (its open attempt's bar grows)."""
    if job.status.terminal:
        return str(job.version)
    return f"{job.version}-{int(wall.now().timestamp() // REFRESH_SECONDS)}"
