"""The API's exception handlers: every error answer as a problem (:mod:`spotd.daemon.problems`).

- spotd's own errors, with their class's status and code (:data:`~spotd.daemon.problems.STATUS`);
- a request FastAPI cannot validate: 422 ``invalid-request``, one entry of ``errors``
  per field, never the value that was sent;
- an HTTP error raised as a bare status (an unknown route's 404, a wrong method's
  405, the dashboard's 401 and 403, a body refused by :mod:`spotd.daemon.limits`):
  the class of that status (:data:`~spotd.daemon.problems.HTTP_ERRORS`); a redirect
  (the dashboard's 303 to its login) stays one;
- anything else: 500 ``internal-error``, which says no more than that; the
  server logs the traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus

from fastapi import FastAPI, Request, Response
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from spotd.core.errors import DaemonFailed, SpotdError
from spotd.daemon.problems import (
    PROBLEM_MEDIA_TYPE,
    Problem,
    field_problems,
    http_problem,
    invalid,
    problem_of,
)

_LONGEST_PATH = 200
"""How much of an unknown route's path its 404 quotes."""


def install_problem_handlers(app: FastAPI) -> None:
    """Make every error answer of ``app`` a problem."""
    app.add_exception_handler(SpotdError, _spotd_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)


def problem_response(problem: Problem, headers: Mapping[str, str] | None = None) -> Response:
    """``problem`` as an answer: its status, its JSON, ``application/problem+json``."""
    return Response(problem.body(), status_code=problem.status, headers=headers,
                    media_type=PROBLEM_MEDIA_TYPE)  # fmt: skip


async def _spotd_error(_: Request, exc: SpotdError) -> Response:
    return problem_response(problem_of(exc))


async def _invalid(_: Request, exc: RequestValidationError) -> Response:
    return problem_response(problem_of(invalid(field_problems(exc.errors()))))


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code < HTTPStatus.BAD_REQUEST:
        return await http_exception_handler(request, exc)  # a redirect, as FastAPI makes it
    detail = str(exc.detail)
    if detail == _phrase(exc.status_code):  # the router's own: say what was asked
        path = request.url.path
        shown = path if len(path) <= _LONGEST_PATH else f"{path[:_LONGEST_PATH]}..."
        detail = f"{detail.lower()}: {request.method} {shown}"
    return problem_response(http_problem(exc.status_code, detail), exc.headers)


def _phrase(status: int) -> str | None:
    try:
        return HTTPStatus(status).phrase
    except ValueError:  # a status of no standard
        return None


async def _unexpected(_: Request, exc: Exception) -> Response:
    # Starlette raises the exception on to the server after this answer: it is
    # logged there, with its traceback, once.
    failed = DaemonFailed(
        f"the daemon failed on an unexpected error ({type(exc).__name__}); its log has the "
        "traceback"
    )
    return problem_response(problem_of(failed))
