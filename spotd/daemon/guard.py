"""Who may ask, checked before anything else of a request is read.

FastAPI parses a route's JSON body before it runs the route's dependencies,
and answers broken JSON with a 422 at once: a token check written as a
dependency comes second to it, so a caller without the token learns how the
body should look. A router made with ``route_class=checked_first(check)``
runs ``check`` on the request before that parsing, for every route it holds.

A check refuses with :func:`unauthorized`: a bare 401, which the daemon's app
answers as an ``unauthorized`` problem (:mod:`spotd.daemon.problem_handlers`)
that tells nothing of the route's fields. A bare status, not an error of ours,
so that a router of these routes mounted on an app of its own refuses as well.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from fastapi.security.utils import get_authorization_scheme_param

Check = Callable[[Request], Awaitable[None]]
"""Raises :func:`unauthorized` (401) for a request its route must not see."""
Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def unauthorized(detail: str) -> HTTPException:
    """A 401 that says ``detail`` and names the scheme that would be taken (RFC 9110)."""
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": "Bearer"})


def checked_first(check: Check) -> type[APIRoute]:
    """A route class whose routes run ``check`` before they parse the request."""

    class CheckedRoute(APIRoute):
        def get_route_handler(self) -> Handler:
            handle = super().get_route_handler()

            async def checked(request: Request) -> Response:
                await check(request)
                return await handle(request)

            return checked

    return CheckedRoute


def bearer_token(request: Request) -> str | None:
    """The credentials of the request's ``Authorization: Bearer`` header, if any."""
    scheme, credentials = get_authorization_scheme_param(request.headers.get("authorization"))
    if scheme.lower() != "bearer" or not credentials:
        return None
    return credentials


def same_token(given: str, expected: str) -> bool:
    """Whether ``given`` is ``expected``, in constant time. As bytes: a header may
    hold any byte, and :func:`hmac.compare_digest` refuses non-ASCII text."""
    return hmac.compare_digest(given.encode(), expected.encode())


def token_check(token: str) -> Check:
    """The check of the daemon's own API token: 401 without it."""

    async def check(request: Request) -> None:
        given = bearer_token(request)
        if given is None or not same_token(given, token):
            raise unauthorized("missing or wrong bearer token")

    return check
