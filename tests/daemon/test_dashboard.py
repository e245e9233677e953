"""The dashboard's guard, against a real daemon over HTTP: no page without the session,
no login or logout from another site, no token or secret in any page; and the session
cookie's own rules."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from daemon_support import Daemon, Setup
from dashboard_support import api_token, base_url, dashboard_setup, form_token, login
from fastapi import APIRouter
from fastapi.routing import APIRoute

from spotd.core.clock import WallClock
from spotd.daemon.dashboard.cost_page import CostReports, window_of
from spotd.daemon.dashboard.pages import create_pages_routers
from spotd.daemon.dashboard.session import SESSION_SECONDS, Sessions, safe_next, same_origin
from spotd.store import open_store

SMTP_PASSWORD = "smtp-pass-9f3k2"
JOB_SECRET = "hf-secret-value-7x1q"
EXTRA = f"""
[email]
host = "127.0.0.1"
port = 9
username = "spotd"
password = "{SMTP_PASSWORD}"
to = ["ops@example.com"]

[secrets.values]
HF_TOKEN = "{JOB_SECRET}"
"""


class Unasked:
    """For Sessions that only issue cookies or build routes: the store is never asked."""

    def end_session(self, session_id: str, *, until: datetime) -> None:
        raise AssertionError("not asked")

    def session_ended(self, session_id: str) -> bool:
        raise AssertionError("not asked")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Setup, str]]:
    """A daemon with an SMTP password and a job secret, and one job that ran (calm market)."""
    setup = dashboard_setup(tmp_path_factory.mktemp("dash"), up=500.0)
    setup.config.write_text(setup.config.read_text() + EXTRA)
    setup.job_file.write_text(
        setup.job_file.read_text().replace("[resources]", 'secrets = ["HF_TOKEN"]\n\n[resources]')
    )
    running = Daemon(setup)
    try:
        job = json.loads(setup.cli("submit", str(setup.job_file), "--json").stdout)["id"]
        yield setup, job
    finally:
        assert running.stop() == 0


@pytest.fixture
def client(daemon: tuple[Setup, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url(daemon[0]), timeout=30) as c:
        yield c


def dashboard_gets(job: str) -> tuple[list[str], list[str]]:
    """Every GET route of the dashboard but the login and static files, with its path
    filled in: (pages, parts). Read from the app, so a route added later is covered."""
    # Only the routes are read: an engine with a clock is enough to build them.
    engine: Any = SimpleNamespace(clock=WallClock(), zone=UTC)
    routes = create_pages_routers(engine, Sessions("x", Unasked()))
    fill = {"{ref}": job, "{name}": "daily"}
    pool = "?provider=sim-aws&region=us-east-1&zone=us-east-1a&instance_type=g5.xlarge"
    query = {"/dashboard/market/pool": pool, "/dashboard/market/history.svg": pool}

    def filled(router: APIRouter) -> list[str]:
        paths = []
        for route in router.routes:
            assert isinstance(route, APIRoute)
            path = route.path
            for key, value in fill.items():
                path = path.replace(key, value)
            paths.append(path + query.get(route.path, ""))
        return paths

    pages, parts = filled(routes.pages), filled(routes.parts)
    return pages, parts


def test_without_the_session_pages_redirect_to_the_login_and_parts_answer_401(
    daemon: tuple[Setup, str], client: httpx.Client
) -> None:
    pages, parts = dashboard_gets(daemon[1])
    assert len(pages) >= 6 and len(parts) >= 6, (pages, parts)
    forged = Sessions("another daemon's token", Unasked()).issue()
    for cookie in ({}, {"Cookie": f"spotd_session={forged}"},
                   {"Cookie": f"spotd_session={api_token(daemon[0])}"}):  # fmt: skip
        for path in pages:
            reply = client.get(path, headers=cookie)
            assert reply.status_code == 303, (path, reply.status_code)
            assert reply.headers["location"].startswith("/dashboard/login?next=%2Fdashboard")
        for path in parts:
            reply = client.get(path, headers=cookie)
            assert reply.status_code == 401, (path, reply.status_code)
    # The login itself and the page's own script and style are open to all.
    assert client.get("/dashboard/login").status_code == 200
    assert client.get("/dashboard/static/dashboard.js").status_code == 200


def test_with_the_session_every_page_answers_and_none_shows_a_token_or_secret(
    daemon: tuple[Setup, str], client: httpx.Client
) -> None:
    setup, job = daemon
    token = api_token(setup)
    session = login(client, token)
    assert token not in session
    pages, parts = dashboard_gets(job)
    bodies = {}
    for path in [*pages, *parts, "/dashboard/login"]:
        reply = client.get(path, headers={"Cookie": f"spotd_session={session}"})
        assert reply.status_code in (200, 303), (path, reply.status_code, reply.text[:300])
        bodies[path] = reply.content
    assert b"tiny" in bodies["/dashboard/jobs"], "the job is listed"
    # The daemon's market runs faster than real time: every page says so, and names the
    # one zone its times are in (its script shows "live" in that zone too).
    jobs_page = bodies["/dashboard/jobs"].decode()
    assert 'role="status">Times are on the simulated clock, 600x real time' in jobs_page
    assert "times UTC, 24-hour" in jobs_page and 'data-zone="UTC"' in jobs_page
    assert job.encode() in bodies[f"/dashboard/jobs/{job}"]
    assert bodies["/dashboard/cost/daily.png"].startswith(b"\x89PNG")
    assert bodies[f"/dashboard/jobs/{job}/timeline.svg"].lstrip().startswith(b"<?xml")
    for path, body in bodies.items():
        for secret in (token, SMTP_PASSWORD, JOB_SECRET):
            assert secret.encode() not in body, f"{path} shows a secret"
    # The logout form's token is not the API token either.
    page = client.get("/dashboard/jobs", headers={"Cookie": f"spotd_session={session}"})
    assert token not in form_token(page.text)


def test_the_login_refuses_a_wrong_token_and_sets_a_strict_secure_cookie_for_the_right(
    daemon: tuple[Setup, str], client: httpx.Client
) -> None:
    base = str(client.base_url).rstrip("/")
    field = form_token(client.get("/dashboard/login").text)
    headers = {"Origin": base, "Cookie": f"spotd_login={field}"}
    wrong = client.post("/dashboard/login", headers=headers,
                        data={"token": "guess", "form_token": field})  # fmt: skip
    assert wrong.status_code == 401
    assert "spotd_session" not in wrong.headers.get("set-cookie", "")
    right = client.post("/dashboard/login", headers=headers,
                        data={"token": api_token(daemon[0]), "form_token": field,
                              "next": "https://elsewhere.example/"})  # fmt: skip
    assert right.status_code == 303
    assert right.headers["location"] == "/dashboard/jobs", "never off the site"
    cookie = next(c for c in right.headers.get_list("set-cookie") if "spotd_session=" in c)
    attributes = {a.strip().lower() for a in cookie.split(";")[1:]}
    assert {"secure", "httponly", "samesite=strict", "path=/dashboard",
            f"max-age={SESSION_SECONDS}"} <= attributes  # fmt: skip


@pytest.mark.parametrize("origin", ["http://evil.example", "null", None])
def test_a_login_from_another_site_is_403(
    daemon: tuple[Setup, str], client: httpx.Client, origin: str | None
) -> None:
    field = form_token(client.get("/dashboard/login").text)
    headers = {"Cookie": f"spotd_login={field}"}
    if origin is not None:
        headers["Origin"] = origin
    reply = client.post("/dashboard/login", headers=headers,
                        data={"token": api_token(daemon[0]), "form_token": field})  # fmt: skip
    assert reply.status_code == 403
    assert "spotd_session" not in reply.headers.get("set-cookie", "")


def test_a_login_without_its_form_cookie_is_403(
    daemon: tuple[Setup, str], client: httpx.Client
) -> None:
    base = str(client.base_url).rstrip("/")
    field = form_token(client.get("/dashboard/login").text)
    reply = client.post("/dashboard/login", headers={"Origin": base},
                        data={"token": api_token(daemon[0]), "form_token": field})  # fmt: skip
    assert reply.status_code == 403


def test_logout_needs_this_site_and_its_form_token(
    daemon: tuple[Setup, str], client: httpx.Client
) -> None:
    base = str(client.base_url).rstrip("/")
    session = login(client, api_token(daemon[0]))
    cookie = {"Cookie": f"spotd_session={session}"}
    field = form_token(client.get("/dashboard/jobs", headers=cookie).text)
    evil = client.post("/dashboard/logout", data={"form_token": field},
                       headers={**cookie, "Origin": "http://evil.example"})  # fmt: skip
    assert evil.status_code == 403
    tokenless = client.post("/dashboard/logout", data={}, headers={**cookie, "Origin": base})
    assert tokenless.status_code == 403
    done = client.post("/dashboard/logout", data={"form_token": field},
                       headers={**cookie, "Origin": base})  # fmt: skip
    assert done.status_code == 303 and done.headers["location"] == "/dashboard/login"
    assert re.search(r'spotd_session="?"?;.*Max-Age=0', done.headers["set-cookie"]), done.headers


def test_a_copy_of_the_cookie_is_refused_after_its_logout(
    daemon: tuple[Setup, str], client: httpx.Client
) -> None:
    base = str(client.base_url).rstrip("/")
    session = login(client, api_token(daemon[0]))
    other = login(client, api_token(daemon[0]))  # the same user, another browser
    cookie = {"Cookie": f"spotd_session={session}"}
    field = form_token(client.get("/dashboard/jobs", headers=cookie).text)
    done = client.post("/dashboard/logout", data={"form_token": field},
                       headers={**cookie, "Origin": base})  # fmt: skip
    assert done.status_code == 303
    # The browser dropped the cookie; a copy kept elsewhere is refused all the same.
    page = client.get("/dashboard/jobs", headers=cookie)
    assert page.status_code == 303 and page.headers["location"].startswith("/dashboard/login")
    assert client.get("/dashboard/fragments/jobs", headers=cookie).status_code == 401
    again = client.post("/dashboard/logout", data={"form_token": field},
                        headers={**cookie, "Origin": base})  # fmt: skip
    assert again.status_code == 403, "an ended session cannot log out again"
    # Another session of the same token is not touched.
    still = client.get("/dashboard/jobs", headers={"Cookie": f"spotd_session={other}"})
    assert still.status_code == 200


def test_the_bearer_api_is_unchanged_and_a_session_does_not_open_it(
    daemon: tuple[Setup, str], client: httpx.Client
) -> None:
    token = api_token(daemon[0])
    listed = client.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    assert listed.status_code == 200 and listed.json()["jobs"][0]["id"] == daemon[1]
    session = login(client, token)
    assert client.get("/v1/jobs", headers={"Cookie": f"spotd_session={session}"}).status_code == 401


def test_a_session_is_signed_by_the_token_and_expires(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        sessions = Sessions("t" * 32, store)
        value = sessions.issue(now=1000.0)
        assert sessions.valid(value, now=1000.0 + SESSION_SECONDS - 1)
        assert not sessions.valid(value, now=1000.0 + SESSION_SECONDS + 1)
        assert Sessions("t" * 32, store).valid(value, now=2000.0), "another daemon, same token"
        assert not Sessions("u" * 32, store).valid(value, now=2000.0)
        expiry, session_id, signature = value.split(".")
        longer = f"{int(expiry) + 3600}.{session_id}.{signature}"
        assert not sessions.valid(longer, now=2000.0), "forged expiry"
        assert not sessions.valid(f"{expiry}.{'0' * 32}.{signature}", now=2000.0), "forged id"
        assert sessions.issue(now=1000.0) != value, "each login a session of its own"
        for junk in ("", ".", "..", "abc", "1.2", "1.2.3", f"x{value}", f"{value}.x"):
            assert not sessions.valid(junk, now=2000.0)
        assert "t" * 32 not in value
    finally:
        store.close()


def test_a_session_is_refused_when_the_store_cannot_say_it_was_not_ended(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    sessions = Sessions("t" * 32, store)
    value = sessions.issue()
    assert sessions.valid(value)
    (tmp_path / "s.db").unlink()
    store.close()
    store.engine.dispose()
    (tmp_path / "s.db").mkdir()  # the database file is now a folder: every read fails
    assert not sessions.valid(value)


def test_the_same_origin_check_and_the_next_page() -> None:
    assert same_origin({"host": "127.0.0.1:8470", "origin": "http://127.0.0.1:8470"})
    assert same_origin({"host": "spotd.lan", "origin": "https://spotd.lan"})  # TLS proxy
    assert same_origin({"host": "127.0.0.1:8470", "referer": "http://127.0.0.1:8470/dashboard/x"})
    assert not same_origin({"host": "127.0.0.1:8470", "origin": "http://127.0.0.1:9999"})
    assert not same_origin({"host": "127.0.0.1:8470", "origin": "null"})
    assert not same_origin({"host": "127.0.0.1:8470"})
    assert safe_next("/dashboard/jobs/j-1", "/d") == "/dashboard/jobs/j-1"
    for elsewhere in ("//evil.example/dashboard/", "https://evil.example", "/v1/jobs",
                      "/dashboard//evil", "/dashboard/\\evil", None):  # fmt: skip
        assert safe_next(elsewhere, "/d") == "/d"


def test_the_job_page_names_a_missing_job_404(
    daemon: tuple[Setup, str], client: httpx.Client
) -> None:
    session = login(client, api_token(daemon[0]))
    cookie = {"Cookie": f"spotd_session={session}"}
    reply = client.get("/dashboard/jobs/no-such-job", headers=cookie)
    assert reply.status_code == 404



def test_the_cost_window_from_the_form() -> None:
    now = datetime(2026, 2, 9, 12, 0, tzinfo=UTC)
    default = window_of(None, None, now)
    assert default.resolved(now) == (now - timedelta(days=7), now)
    assert default.key == "-|now" and default.query == ""
    given = window_of("2026-02-01", "2026-02-03T06:30", now)
    assert given.resolved(now) == (datetime(2026, 2, 1, tzinfo=UTC),
                                   datetime(2026, 2, 3, 6, 30, tzinfo=UTC))  # fmt: skip
    assert given.query == "since=2026-02-01T00%3A00&until=2026-02-03T06%3A30"
    assert window_of("yesterday", None, now).error is not None
    backwards = window_of("2026-02-05", "2026-02-01", now)
    assert backwards.error == "the start must come before the end"
    assert backwards.resolved(now) == default.resolved(now)


def test_the_cost_page_keeps_a_windows_report_and_draws_its_charts_once(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        # A reader with no running job to forecast.
        engine: Any = SimpleNamespace(store=store, clock=WallClock(), zone=UTC,
                                      planner=SimpleNamespace(to_finish=lambda job: None))
        costs = CostReports(engine)
        window = window_of(None, None, engine.clock.now())
        first = costs.report(window)
        assert costs.report(window) is first, "built once, then kept"
        assert first.totals.jobs == 0
        daily = costs.chart(window, "daily")
        assert daily is not None and daily.startswith(b"\x89PNG")
        assert costs.chart(window, "daily") is daily
        assert costs.chart(window, "nothing") is None
        other = window_of("2026-01-01", "2026-01-02", engine.clock.now())
        assert costs.report(other) is not first
    finally:
        store.close()
