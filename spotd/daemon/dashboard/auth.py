"""The dashboard's login and logout routes, and the guards every other route sits behind.

Without a valid session a page answers 303 to the login page, and a fragment,
chart or other route that a script or an image asks for answers 401. Login
and logout answer 403 to a request from another site (:func:`same_origin`) or
without their form token.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool

from spotd.daemon.dashboard.render import SECURITY_HEADERS, page
from spotd.daemon.dashboard.session import (
    COOKIE_PATH,
    LOGIN_COOKIE,
    SESSION_COOKIE,
    SESSION_SECONDS,
    Sessions,
    login_form_matches,
    login_form_token,
    safe_next,
    same_origin,
)

LOGIN_PATH = f"{COOKIE_PATH}/login"
HOME_PATH = f"{COOKIE_PATH}/jobs"
MAX_FORM_BYTES = 4096
"""A login form is a token and two short fields; anything longer is refused unread."""

SessionGuard = Callable[[Request], str]


def page_guard(sessions: Sessions) -> SessionGuard:
    """A dependency giving a page's session; without one, 303 to the login page."""

    def guard(request: Request) -> str:
        session = request.cookies.get(SESSION_COOKIE)
        if session is None or not sessions.valid(session):
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            raise HTTPException(status_code=303, detail="log in first", headers={
                "Location": f"{LOGIN_PATH}?next={quote(target, safe='')}",
            })  # fmt: skip
        return session

    return guard


def part_guard(sessions: Sessions) -> SessionGuard:
    """A dependency giving the session of a fragment or chart; without one, 401."""

    def guard(request: Request) -> str:
        session = request.cookies.get(SESSION_COOKIE)
        if session is None or not sessions.valid(session):
            raise HTTPException(status_code=401, detail="log in to the dashboard first")
        return session

    return guard


def create_auth_router(sessions: Sessions) -> APIRouter:
    """``GET``/``POST /dashboard/login`` and ``POST /dashboard/logout``."""
    router = APIRouter(include_in_schema=False)

    @router.get(LOGIN_PATH)
    def login_form(next: str | None = None) -> Response:
        return _login_page(safe_next(next, HOME_PATH))

    @router.post(LOGIN_PATH)
    async def login(request: Request) -> Response:
        form = await _form(request)
        if not same_origin(request.headers):
            raise HTTPException(status_code=403, detail="cross-site login refused")
        if not login_form_matches(request.cookies.get(LOGIN_COOKIE), form.get("form_token", "")):
            raise HTTPException(status_code=403, detail="login form expired: load it again")
        target = safe_next(form.get("next"), HOME_PATH)
        if not sessions.token_matches(form.get("token", "")):
            return _login_page(target, error="That is not this daemon's token.", status=401)
        done = RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
        done.set_cookie(SESSION_COOKIE, sessions.issue(), max_age=SESSION_SECONDS,
                        path=COOKIE_PATH, secure=True, httponly=True,
                        samesite="strict")  # fmt: skip
        done.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH, secure=True, httponly=True,
                           samesite="strict")  # fmt: skip
        return done

    @router.post(f"{COOKIE_PATH}/logout")
    async def logout(request: Request) -> Response:
        form = await _form(request)
        if not same_origin(request.headers):
            raise HTTPException(status_code=403, detail="cross-site logout refused")
        session = request.cookies.get(SESSION_COOKIE)
        # Both read or write the store: in a worker thread, not on the event loop.
        allowed = await run_in_threadpool(sessions.logout_allowed, session,
                                          form.get("form_token", ""))  # fmt: skip
        if not allowed:
            raise HTTPException(status_code=403, detail="logout form token missing or wrong")
        assert session is not None  # logout_allowed checked it
        await run_in_threadpool(sessions.end, session)
        done = RedirectResponse(LOGIN_PATH, status_code=303, headers=SECURITY_HEADERS)
        done.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH, secure=True, httponly=True,
                           samesite="strict")  # fmt: skip
        return done

    return router


def _login_page(target: str, *, error: str | None = None, status: int = 200) -> Response:
    form_token = login_form_token()
    shown = page("login.html.j2", status_code=status, next=target, form_token=form_token,
                 error=error, session=None, logout_token=None)  # fmt: skip
    shown.set_cookie(LOGIN_COOKIE, form_token, max_age=3600, path=COOKIE_PATH, secure=True,
                     httponly=True, samesite="strict")  # fmt: skip
    return shown


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded form of a POST, its first value per field."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise HTTPException(status_code=413, detail="form too large")
    fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}
