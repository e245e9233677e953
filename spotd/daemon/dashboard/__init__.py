"""The read-only web dashboard the daemon serves under ``/dashboard`` (docs/dashboard.md).

Server-rendered pages (jinja2 templates in ``templates/``) with a small script
of ours (``static/dashboard.js``) that polls each page's fragment; behind a
login that takes the API token and keeps a signed cookie (:mod:`.session`).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.daemon.dashboard.auth import create_auth_router
from spotd.daemon.dashboard.pages import create_pages_routers
from spotd.daemon.dashboard.session import COOKIE_PATH, Sessions
from spotd.daemon.reader import Reader

__all__ = ["install_dashboard"]


def install_dashboard(app: FastAPI, reader: Reader, token: str, wall: Clock = WALL) -> None:
    """Add the dashboard's routes to ``app``: its pages behind a session signed with
    ``token`` (logouts kept in the store), and its own stylesheet and
    script (no secret in them: served to all). ``wall`` is the real clock."""
    sessions = Sessions(token, reader.store, wall)
    app.include_router(create_auth_router(sessions))
    routes = create_pages_routers(reader, sessions, wall)
    app.include_router(routes.pages)
    app.include_router(routes.parts)
    static = StaticFiles(packages=[("spotd.daemon.dashboard", "static")])
    app.mount(f"{COOKIE_PATH}/static", static, name="dashboard-static")
