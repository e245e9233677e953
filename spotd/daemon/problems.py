"""The daemon's errors on the wire: the one table from spotd's error classes to HTTP
statuses, and the RFC 9457 problem details every error answer of the API carries.

An error answer is ``application/problem+json`` (docs/operations.md, "API errors")::

    {"type": "urn:spotd:problem:job-not-found", "title": "Job not found",
     "status": 404, "detail": "no job 'j-0000000001'", "code": "job-not-found",
     "job_id": "j-0000000001"}

``code`` is the error class's :attr:`~spotd.core.errors.SpotdError.error_code`;
``type`` is :data:`PROBLEM_TYPE` and the code (a URN: a stable name, not a page
to fetch); ``title`` is the code as words; ``detail`` is one line for a person.
``job_id``, ``field`` and ``errors`` (each ``field`` and ``message``) are there
where they apply. A client raises the class back from the code
(:func:`error_from_problem`).

No web framework is imported here: the CLI's client reads problems with this
module. The handlers that answer with them are :mod:`spotd.daemon.problem_handlers`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict

from spotd.core.errors import (
    ApiError,
    BadCursor,
    BadRequest,
    CheckpointError,
    ConfigError,
    DaemonFailed,
    FieldProblem,
    Forbidden,
    HeadTooLarge,
    IdempotencyKeyReused,
    IllegalTransition,
    JobNotFound,
    JobSpecError,
    LostTransition,
    MethodNotAllowed,
    PolicyError,
    ProviderError,
    RequestInvalid,
    RequestTimeout,
    RequestTooLarge,
    RouteNotFound,
    SpotdError,
    StoreError,
    StoreUnavailable,
    SubmitRefused,
    Unauthorized,
    error_class,
)

PROBLEM_MEDIA_TYPE = "application/problem+json"
"""The media type of every error answer (RFC 9457)."""
PROBLEM_TYPE = "urn:spotd:problem:"
"""A problem's ``type`` is this and its code: ``urn:spotd:problem:job-not-found``."""

STATUS: Mapping[type[SpotdError], HTTPStatus] = {
    SpotdError: HTTPStatus.INTERNAL_SERVER_ERROR,
    ConfigError: HTTPStatus.INTERNAL_SERVER_ERROR,
    JobSpecError: HTTPStatus.UNPROCESSABLE_ENTITY,
    StoreError: HTTPStatus.CONFLICT,
    StoreUnavailable: HTTPStatus.SERVICE_UNAVAILABLE,
    JobNotFound: HTTPStatus.NOT_FOUND,
    BadCursor: HTTPStatus.UNPROCESSABLE_ENTITY,
    IllegalTransition: HTTPStatus.CONFLICT,
    LostTransition: HTTPStatus.CONFLICT,
    SubmitRefused: HTTPStatus.UNPROCESSABLE_ENTITY,
    IdempotencyKeyReused: HTTPStatus.CONFLICT,
    CheckpointError: HTTPStatus.BAD_GATEWAY,
    PolicyError: HTTPStatus.CONFLICT,
    ProviderError: HTTPStatus.BAD_GATEWAY,
    ApiError: HTTPStatus.BAD_GATEWAY,
    BadRequest: HTTPStatus.BAD_REQUEST,
    Unauthorized: HTTPStatus.UNAUTHORIZED,
    Forbidden: HTTPStatus.FORBIDDEN,
    RouteNotFound: HTTPStatus.NOT_FOUND,
    MethodNotAllowed: HTTPStatus.METHOD_NOT_ALLOWED,
    RequestTimeout: HTTPStatus.REQUEST_TIMEOUT,
    RequestTooLarge: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    RequestInvalid: HTTPStatus.UNPROCESSABLE_ENTITY,
    HeadTooLarge: HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
    DaemonFailed: HTTPStatus.INTERNAL_SERVER_ERROR,
}
"""The HTTP status of each error class the API answers with. A class not in it answers
with the status of its nearest base class in it (:func:`status_of`)."""

HTTP_ERRORS: Mapping[int, type[ApiError]] = {
    status: cls
    for cls, status in STATUS.items()
    if issubclass(cls, ApiError) and cls is not ApiError
}
"""The class that stands for an HTTP error raised as a bare status (an unknown route's
404, the dashboard's 403), by that status; :class:`ApiError` for any other status."""

_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})
"""The first part of a FastAPI error's location: where in the request, not a field."""
_SHOWN_PROBLEMS = 3
"""How many field problems a 422's one-line detail names before it counts the rest."""


class FieldErrorView(BaseModel):
    """One entry of a problem's ``errors``: a field's path (where known) and what is wrong."""

    field: str | None = None
    message: str


class Problem(BaseModel):
    """An RFC 9457 problem details object, with spotd's extension members."""

    # A newer daemon may add members: a client reads the ones it knows.
    model_config = ConfigDict(extra="ignore")

    type: str
    title: str
    status: int
    detail: str
    code: str
    job_id: str | None = None
    field: str | None = None
    errors: list[FieldErrorView] | None = None
    source: str | None = None
    """``job-spec-invalid`` only: what the spec was read from."""

    def body(self) -> bytes:
        """The JSON of this problem, without the members that do not apply."""
        return self.model_dump_json(exclude_none=True).encode()


def status_of(cls: type[SpotdError]) -> HTTPStatus:
    """The status ``cls`` answers with: its own in :data:`STATUS`, else its nearest
    base class's (the method resolution order decides between two bases)."""
    return next(STATUS[base] for base in cls.__mro__ if base in STATUS)


def title_of(code: str) -> str:
    """A problem's title: its code as words (``job-not-found``: ``Job not found``)."""
    return code.replace("-", " ").capitalize()


def one_line(text: str) -> str:
    """``text`` on one line: a message of several (a spec's problems, one a line,
    after the line that names the spec) as its first line, a colon, and the rest
    separated by semicolons."""
    lines = [line.strip().removeprefix("- ") for line in text.splitlines()]
    lines = [line for line in lines if line]
    if len(lines) <= 1:
        return "".join(lines)
    return f"{lines[0]}: {'; '.join(lines[1:])}"


def problem_of(exc: SpotdError) -> Problem:
    """The problem that tells ``exc`` to a client, with its class's status and code."""
    cls = type(exc)
    errors: list[FieldErrorView] | None = None
    source: str | None = None
    if isinstance(exc, RequestInvalid):
        errors = [FieldErrorView(field=p.field, message=p.message) for p in exc.problems]
    elif isinstance(exc, JobSpecError):
        errors = [FieldErrorView(message=p) for p in exc.problems]
        source = exc.source
    return _problem(
        cls, status_of(cls), str(exc),
        job_id=getattr(exc, "job_id", None), field=getattr(exc, "field", None),
        errors=errors or None, source=source,
    )  # fmt: skip


def http_problem(status: int, detail: str) -> Problem:
    """The problem of an HTTP error raised as a bare ``status`` (:data:`HTTP_ERRORS`)."""
    return _problem(HTTP_ERRORS.get(status, ApiError), status, detail)


def _problem(cls: type[SpotdError], status: int, detail: str, **members: Any) -> Problem:
    code = cls.error_code
    return Problem(type=PROBLEM_TYPE + code, title=title_of(code), status=status,
                   detail=one_line(detail), code=code, **members)  # fmt: skip


def field_problems(
    errors: Iterable[Mapping[str, Any]], *, within: Sequence[str | int] = ()
) -> list[FieldProblem]:
    """pydantic's (or FastAPI's) errors as field problems: each location as a dotted
    path under ``within`` (``spec.command[0]``), never with the value that was sent."""
    found = []
    for error in errors:
        loc = [*within, *error["loc"]]
        where = "body"
        if loc and loc[0] in _LOCATIONS:
            where, loc = str(loc[0]), loc[1:]  # "body.priority" is the body's "priority"
        if error["type"] == "json_invalid":
            at = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
            reason = (error.get("ctx") or {}).get("error", "")
            found.append(FieldProblem(where, f"not JSON{at}: {reason}".rstrip(": ")))
            continue
        found.append(FieldProblem(_dotted(loc) or where, str(error["msg"])))
    return found


def _dotted(loc: Sequence[str | int]) -> str:
    """A location as a path: names joined by dots, list indexes in brackets."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def invalid(problems: Sequence[FieldProblem]) -> RequestInvalid:
    """A 422 for ``problems``, whose detail names the first few on one line."""
    shown = "; ".join(f"{p.field}: {p.message}" for p in problems[:_SHOWN_PROBLEMS])
    more = len(problems) - _SHOWN_PROBLEMS
    if more > 0:
        shown += f"; and {more} more"
    return RequestInvalid(f"invalid request: {shown}", problems)


def invalid_field(field: str, message: str) -> RequestInvalid:
    """A 422 for one field whose message says all (``Idempotency-Key: ... is empty; ...``):
    the message is the detail, and without the field's name in front its ``message``."""
    return RequestInvalid(message, [FieldProblem(field, message.removeprefix(f"{field}: "))])


def error_from_problem(problem: Problem) -> SpotdError:
    """The error ``problem`` tells, raised again as its own class (by its code) with
    its detail as the message: the inverse of :func:`problem_of`.

    A code this process does not know (a newer daemon's, or a class in a module not
    imported here) comes back as the class of its status (:data:`HTTP_ERRORS`), else
    :class:`~spotd.core.errors.ApiError`; so does a class whose constructor takes
    other arguments than a message.
    """
    found = error_class(problem.code)
    cls = found or HTTP_ERRORS.get(problem.status, ApiError)
    detail, errors = problem.detail, problem.errors or []
    if issubclass(cls, JobSpecError):
        return cls(problem.source or "job spec", [e.message for e in errors] or [detail])
    if issubclass(cls, RequestInvalid):
        return cls(detail, [FieldProblem(e.field or "", e.message) for e in errors])
    if issubclass(cls, IdempotencyKeyReused | StoreError):
        return cls(detail, job_id=problem.job_id)
    if issubclass(cls, SubmitRefused):
        return cls(detail, field=problem.field)
    try:
        return cls(detail)
    except TypeError:  # a constructor of (source, problems), say: the message still tells
        return ApiError(detail)
