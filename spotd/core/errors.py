"""Every error spotd raises, as one tree under :class:`SpotdError`.

```
SpotdError
├── ConfigError                  bad spotd.toml or environment
│   └── ProviderKindError        a provider kind failed to load (spotd.registry)
│       ├── UnknownProviderKind  no installed kind has that name or builds that provider
│       └── ProviderSdkMissing   an enabled kind's SDK is not installed (which extra to add)
├── JobSpecError                 bad job.toml: file, field path, line, what was expected
├── StoreError
│   ├── StoreUnavailable         the database failed or cannot be reached: retry later
│   ├── JobNotFound
│   ├── BadCursor                a listing cursor the store did not make
│   ├── IllegalTransition        the table forbids from -> to
│   │   ├── RetryRefused         the job cannot be retried (not failed or cancelled, budget spent)
│   │   └── DrillRefused         a drill asked of a job not running on a spot node that can have one
│   ├── NothingHeld              a release asked of a job that keeps no nodes
│   └── LostTransition           the compare-and-set found another status
├── SubmitRefused                the daemon cannot run this job as specified
│   └── IdempotencyKeyReused     the key of a stored job, sent with another spec
├── ReportFailed, ReportRejected the on-VM agent's report was not taken (spotd.agent.reporter)
├── ScenarioError, TraceMissingError, PlotError
│                                `spotd simulate`'s inputs and plots (spotd.simulate)
├── WorkdirError                 a job's workdir cannot be shipped or fetched (spotd.ship)
├── CheckpointError
├── PolicyError                  a policy could not be loaded or failed
├── ApiError                     the daemon's HTTP API answered with an error
│   ├── BadRequest               400: an HTTP request the server cannot parse
│   ├── Unauthorized             401: no token, or a wrong one
│   ├── Forbidden                403: a dashboard form from elsewhere, or expired
│   ├── RouteNotFound            404: no route (or dashboard item) at that path
│   ├── MethodNotAllowed         405: the route takes another method
│   ├── RequestTimeout           408: the body did not come in time
│   ├── RequestTooLarge          413: the body is over the daemon's limit
│   ├── RequestInvalid           422: a field or parameter the route cannot read
│   ├── HeadTooLarge             431: the request head is over the server's limit
│   └── DaemonFailed             500: an unexpected error in the daemon (its log has it)
├── MailError                    a report could not be sent
│   ├── MailUnavailable          the server could not be reached: retry later
│   └── MailRefused              the server said no to this message
│       └── MailAuthError        the login was refused
├── WebhookUndelivered           a webhook's POST failed (retried, then dropped)
└── ProviderError                anything a cloud (or the simulator) said no to
    ├── InvalidRequestError      the request cannot be carried as made: do not retry
    ├── CapacityError            no capacity in that pool now: try elsewhere
    ├── QuotaError               an account limit: cool the pool down for longer
    ├── PriceTooLowError         the bid is under the spot price
    ├── ThrottledError           rate limited: retry with backoff
    ├── AuthError                credentials missing or refused: do not retry
    ├── NotFoundError            the instance or resource is gone
    └── ProviderUnavailable      the provider's API failed (5xx, timeout)
```

Adapters map their SDK's exceptions onto this tree at the boundary, so the
engine decides retry, failover or failure by class, never by message text.

Every class has a stable machine code, :attr:`SpotdError.error_code` (``job-not-found``):
the daemon's API names an error by it (:mod:`spotd.daemon.problems`) and the CLI's
client raises the same class again from it (:func:`error_class`). A class set here
names its code; a subclass elsewhere that names none gets one from its class name
(``TraceMissingError``: ``trace-missing-error``), unique as class names are.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar, NamedTuple


def _code_of_name(name: str) -> str:
    """``TraceMissingError`` as a code: ``trace-missing-error``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).lower()


class SpotdError(Exception):
    """Root of every error spotd raises on purpose."""

    error_code: ClassVar[str] = "spotd-error"
    """This class's stable machine code: what the API sends as a problem's ``code``."""
    bad_input: ClassVar[bool] = False
    """Whether the error is in what the user gave (arguments, a job file, the
    configuration): the same command fails the same way until that is fixed, and the
    CLI exits 2 for it, not 1 (:mod:`spotd.core.exit_codes`)."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "error_code" not in cls.__dict__:  # not the base class's: that one is taken
            cls.error_code = _code_of_name(cls.__name__)


def error_classes() -> Iterator[type[SpotdError]]:
    """:class:`SpotdError` and every subclass of it imported so far, each once."""
    seen: set[type[SpotdError]] = set()
    todo: list[type[SpotdError]] = [SpotdError]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            yield cls
            todo.extend(cls.__subclasses__())


def error_class(code: str) -> type[SpotdError] | None:
    """The error class whose :attr:`~SpotdError.error_code` is ``code``, among those
    imported; None when none is."""
    return next((cls for cls in error_classes() if cls.error_code == code), None)


class ConfigError(SpotdError):
    """The daemon configuration (spotd.toml or SPOTD_* variables) is invalid."""

    error_code = "config-error"
    bad_input = True


class ProviderKindError(ConfigError):
    """A ``spotd.providers`` entry point did not load a valid provider kind."""

    error_code = "provider-kind-error"


class UnknownProviderKind(ProviderKindError):
    """No installed provider kind has the name asked for, or builds that provider."""

    error_code = "unknown-provider-kind"


class ProviderSdkMissing(ProviderKindError):
    """An enabled provider kind cannot be built: a module of its SDK is not installed.
    The message names the kind's table, the missing module and what to install."""

    error_code = "provider-sdk-missing"
    bad_input = False  # the configuration is right; the machine lacks a package


class JobSpecError(SpotdError):
    """A job spec is invalid.

    ``problems`` holds one line per problem, each naming the field path, the
    line in the file where TOML tells it, and what was expected.
    """

    error_code = "job-spec-invalid"
    bad_input = True

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        detail = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: invalid job spec\n{detail}")


class StoreError(SpotdError):
    """The store could not do what was asked. ``job_id``: the job it was about, where
    that is one job's id."""

    error_code = "store-error"

    def __init__(self, message: str, *, job_id: str | None = None) -> None:
        self.job_id = job_id
        super().__init__(message)


class StoreUnavailable(StoreError):
    """The database failed under a statement or cannot be reached (a full disk, a lost
    connection, a lock held past the wait): the same call may pass later. ``cause``
    is the database's own short reason (``database or disk is full``)."""

    error_code = "store-unavailable"

    def __init__(self, message: str, *, cause: str = "", job_id: str | None = None) -> None:
        self.cause = cause or message
        super().__init__(message, job_id=job_id)


class JobNotFound(StoreError):
    """No job has that id."""

    error_code = "job-not-found"


class BadCursor(StoreError):
    """A job listing's cursor that the store did not make (its message never quotes it)."""

    error_code = "bad-cursor"
    bad_input = True
    field = "cursor"
    """The request parameter that was wrong."""


class IllegalTransition(StoreError):
    """The transition table does not allow this change of status."""

    error_code = "illegal-transition"


class RetryRefused(IllegalTransition):
    """``spotd retry`` of a job that cannot be retried: one that succeeded or has not
    ended (only a failed or cancelled job is), or one whose spend has reached its
    ``budget.max_usd`` (its budget covers every attempt, the retried ones too)."""

    error_code = "retry-refused"


class DrillRefused(IllegalTransition):
    """``spotd drill`` of a job that cannot have one now: it is not running, the node runs
    on-demand (only a spot node is preempted), or its provider has no way to send a
    preemption notice on purpose (:class:`~spotd.core.contracts.Driller`)."""

    error_code = "drill-refused"


class NothingHeld(StoreError):
    """``spotd release`` of a job that keeps no nodes: it has no ``keep_on_failure`` hold
    in force (none was asked, or it ran out, was released or cut by a retry)."""

    error_code = "nothing-held"


class LostTransition(StoreError):
    """Another writer changed the job's status first (the compare-and-set failed)."""

    error_code = "lost-transition"


class SubmitRefused(SpotdError):
    """The daemon cannot run the job as specified (a GPU no provider offers, a checkpoint
    location it cannot open or write, a deadline already past); nothing was stored. The
    message names the field (and, from ``spotd submit``, the file); ``field``, where
    given, is that field's path in the spec, or the request header it is about."""

    error_code = "submit-refused"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


class IdempotencyKeyReused(SubmitRefused):
    """A submit's ``Idempotency-Key`` is that of a stored job of another spec."""

    error_code = "idempotency-key-reused"

    def __init__(self, message: str, *, job_id: str | None = None) -> None:
        self.job_id = job_id
        super().__init__(message, field="Idempotency-Key")


class CheckpointError(SpotdError):
    """A checkpoint location could not be read."""

    error_code = "checkpoint-error"


class PolicyError(SpotdError):
    """A placement policy could not be loaded or failed."""

    error_code = "policy-error"


class ApiError(SpotdError):
    """The daemon's HTTP API answered with an error, or could not be reached."""

    error_code = "api-error"


class BadRequest(ApiError):
    """The daemon's HTTP server could not parse the request (400)."""

    error_code = "bad-request"


class Unauthorized(ApiError):
    """The request lacks the token its route needs, or has a wrong one (401)."""

    error_code = "unauthorized"


class Forbidden(ApiError):
    """The request was understood and refused: a dashboard form from another site, or
    expired (403)."""

    error_code = "forbidden"


class RouteNotFound(ApiError):
    """No route at that path, or no dashboard item of that name (404)."""

    error_code = "route-not-found"


class MethodNotAllowed(ApiError):
    """The route at that path takes another HTTP method (405)."""

    error_code = "method-not-allowed"


class RequestTimeout(ApiError):
    """The request's body did not all come within the daemon's time for it (408)."""

    error_code = "request-timeout"


class RequestTooLarge(ApiError):
    """The request's body is over the daemon's limit (413)."""

    error_code = "request-too-large"


class HeadTooLarge(ApiError):
    """The request's head (line, headers, cookies) is over the server's limit (431)."""

    error_code = "request-head-too-large"


class DaemonFailed(ApiError):
    """The daemon failed on an error it did not expect (500); its log has the traceback."""

    error_code = "internal-error"


class FieldProblem(NamedTuple):
    """What is wrong with one field of a request: its path and why."""

    field: str
    """The field's dotted path (``spec.resources.gpus``) or the parameter's name."""
    message: str


class RequestInvalid(ApiError):
    """A field or parameter of the request that the route cannot read (422); ``problems``
    says which and why, one :class:`FieldProblem` each."""

    error_code = "invalid-request"
    bad_input = True

    def __init__(self, message: str, problems: Sequence[FieldProblem] = ()) -> None:
        self.problems = tuple(problems)
        self.field = self.problems[0].field if len(self.problems) == 1 else None
        super().__init__(message)


class MailError(SpotdError):
    """An email could not be delivered. ``retryable``: the same send may pass later."""

    error_code = "mail-error"
    retryable: bool = True


class MailUnavailable(MailError):
    """The SMTP server could not be reached or answered with a temporary (4xx) error."""

    error_code = "mail-unavailable"


class MailRefused(MailError):
    """The SMTP server refused for good (5xx, no STARTTLS, bad certificate)."""

    error_code = "mail-refused"
    retryable = False


class MailAuthError(MailRefused):
    """The SMTP server refused the login."""

    error_code = "mail-auth-refused"


class WebhookUndelivered(SpotdError):
    """A webhook's POST failed: no connection, a timeout, or an answer other than 2xx."""

    error_code = "webhook-undelivered"


class ProviderError(SpotdError):
    """A provider (cloud or simulator) refused or failed a request.

    ``retryable`` tells the engine whether the same request may succeed later
    without any change on our side. ``code`` is the provider's own error code
    (``InsufficientInstanceCapacity``); spotd's is :attr:`error_code`.
    """

    error_code = "provider-error"
    retryable: bool = False

    def __init__(self, message: str, *, provider: str = "", code: str = "") -> None:
        self.provider = provider
        self.code = code
        super().__init__(message)


class InvalidRequestError(ProviderError):
    """The provider cannot carry the request as made (a boot script it refuses, a
    parameter out of range): the same request fails the same way, so it is not retried."""

    error_code = "provider-invalid-request"

    def __init__(self, message: str, *, provider: str = "", code: str = "InvalidParameter"):
        super().__init__(message, provider=provider, code=code)


@contextmanager
def invalid_request(provider: str, action: str) -> Iterator[None]:
    """Raise a ValueError inside as :class:`InvalidRequestError`, for the steps that
    build what a request carries (a boot script the renderer refuses, say)."""
    try:
        yield
    except ValueError as exc:
        raise InvalidRequestError(f"{provider} {action}: {exc}", provider=provider) from exc


class CapacityError(ProviderError):
    """The pool has no capacity for the request right now."""

    error_code = "provider-capacity"
    retryable = True


class QuotaError(ProviderError):
    """An account limit (vCPU, GPU, spot instance count) stops the request."""

    error_code = "provider-quota"


class PriceTooLowError(ProviderError):
    """The maximum price of the request is below the current spot price."""

    error_code = "provider-price-too-low"


class ThrottledError(ProviderError):
    """The provider's API rate-limited us."""

    error_code = "provider-throttled"
    retryable = True


class AuthError(ProviderError):
    """Credentials are missing, expired or lack a permission."""

    error_code = "provider-auth"


class NotFoundError(ProviderError):
    """The instance or resource does not exist (any more)."""

    error_code = "provider-not-found"


class ProviderUnavailable(ProviderError):
    """The provider's API failed on its side (5xx, timeout, connection reset)."""

    error_code = "provider-unavailable"
    retryable = True
