"""A real daemon on the simulated market for the dashboard's tests, and a login over HTTP."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from daemon_support import Setup, make_setup

DEADLINE = """
[deadline]
compute_hours = 2.0
finish_by = 2026-02-03T00:00:00Z
"""
"""The job's deadline, on the simulated clock (epoch 2026-02-02): a day to do 2 hours,
so that the pages show progress and slack."""


def dashboard_setup(root: Path, *, seed: int = 5, up: float = 0.5) -> Setup:
    """The end-to-end tests' daemon and job, with a price-history row every second (the
    pool charts get a line) and the job given a deadline."""
    setup = make_setup(root, seed=seed, up=up)
    config = setup.config.read_text().replace(
        "[scheduling]\n", "[scheduling]\nprice_history_seconds = 1.0\n"
    )
    setup.config.write_text(config)
    setup.job_file.write_text(setup.job_file.read_text() + DEADLINE)
    return setup


def base_url(setup: Setup) -> str:
    """Where the setup's running daemon answers."""
    info = json.loads((setup.root / "daemon.json").read_text())
    return f"http://127.0.0.1:{info['port']}"


def api_token(setup: Setup) -> str:
    """The daemon's API token (its token file)."""
    return (setup.root / "token").read_text().strip()


def form_token(html: str) -> str:
    """The ``form_token`` field of the page's form."""
    found = re.search(r'name="form_token" value="([^"]+)"', html)
    assert found is not None, html
    return found.group(1)


def login(client: httpx.Client, token: str) -> str:
    """Log in as a browser would (form, its cookie, this site's Origin); the session cookie.

    Cookies are passed by hand: they are ``Secure``, and Python's cookie jar keeps a
    Secure cookie to itself on http, even on loopback, where browsers send it.
    """
    form = client.get("/dashboard/login")
    assert form.status_code == 200
    field = form_token(form.text)
    done = client.post(
        "/dashboard/login",
        data={"token": token, "form_token": field, "next": "/dashboard/jobs"},
        headers={"Origin": str(client.base_url).rstrip("/"), "Cookie": f"spotd_login={field}"},
    )
    assert done.status_code == 303, done.text
    found = re.search(r"spotd_session=([^;]+)", done.headers["set-cookie"])
    assert found is not None, done.headers
    return found.group(1)
