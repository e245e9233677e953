"""Every error spotd raises, as one tree under :class:`SpotdError`.

```
SpotdError
├── ConfigError                  bad spotd.toml or environment
│   └── ProviderKindError        a provider kind failed to load (spotd.registry)
│       ├── UnknownProviderKind  no installed kind has that name or builds that provider
│       └── ProviderSdkMissing   an enabled kind's SDK is not installed (which extra to add)
├── JobSpecError                 bad job.toml: file, field path, line, what was expected
├── StoreError
│   ├── JobNotFound
│   ├── IllegalTransition        the table forbids from -> to
│   └── LostTransition           the compare-and-set found another status
├── SubmitRefused                the daemon cannot run this job as specified
├── ReportFailed, ReportRejected the on-VM agent's report was not taken (spotd.agent.reporter)
├── ScenarioError, TraceMissingError, PlotError
│                                `spotd simulate`'s inputs and plots (spotd.simulate)
├── WorkdirError                 a job's workdir cannot be shipped or fetched (spotd.ship)
├── CheckpointError
├── PolicyError                  a policy could not be loaded or failed
├── ApiError                     the daemon's HTTP API answered with an error
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
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class SpotdError(Exception):
    """Root of every error spotd raises on purpose."""


class ConfigError(SpotdError):
    """The daemon configuration (spotd.toml or SPOTD_* variables) is invalid."""


class ProviderKindError(ConfigError):
    """A ``spotd.providers`` entry point did not load a valid provider kind."""


class UnknownProviderKind(ProviderKindError):
    """No installed provider kind has the name asked for, or builds that provider."""


class ProviderSdkMissing(ProviderKindError):
    """An enabled provider kind cannot be built: a module of its SDK is not installed.
    The message names the kind's table, the missing module and what to install."""


class JobSpecError(SpotdError):
    """A job spec is invalid.

    ``problems`` holds one line per problem, each naming the field path, the
    line in the file where TOML tells it, and what was expected.
    """

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        detail = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: invalid job spec\n{detail}")


class StoreError(SpotdError):
    """The store could not do what was asked."""


class JobNotFound(StoreError):
    """No job has that id."""


class BadCursor(StoreError):
    """A job listing's cursor that the store did not make (its message never quotes it)."""


class IllegalTransition(StoreError):
    """The transition table does not allow this change of status."""


class LostTransition(StoreError):
    """Another writer changed the job's status first (the compare-and-set failed)."""


class SubmitRefused(SpotdError):
    """The daemon cannot run the job as specified (a GPU no provider offers, a checkpoint
    location it cannot open or write, a deadline already past); nothing was stored. The
    message names the field (and, from ``spotd submit``, the file)."""


class CheckpointError(SpotdError):
    """A checkpoint location could not be read."""


class PolicyError(SpotdError):
    """A placement policy could not be loaded or failed."""


class ApiError(SpotdError):
    """The daemon's HTTP API answered with an error, or could not be reached."""


class MailError(SpotdError):
    """An email could not be delivered. ``retryable``: the same send may pass later."""

    retryable: bool = True


class MailUnavailable(MailError):
    """The SMTP server could not be reached or answered with a temporary (4xx) error."""


class MailRefused(MailError):
    """The SMTP server refused for good (5xx, no STARTTLS, bad certificate)."""

    retryable = False


class MailAuthError(MailRefused):
    """The SMTP server refused the login."""


class WebhookUndelivered(SpotdError):
    """A webhook's POST failed: no connection, a timeout, or an answer other than 2xx."""


class ProviderError(SpotdError):
    """A provider (cloud or simulator) refused or failed a request.

    ``retryable`` tells the engine whether the same request may succeed later
    without any change on our side.
    """

    retryable: bool = False

    def __init__(self, message: str, *, provider: str = "", code: str = "") -> None:
        self.provider = provider
        self.code = code
        super().__init__(message)


class InvalidRequestError(ProviderError):
    """The provider cannot carry the request as made (a boot script it refuses, a
    parameter out of range): the same request fails the same way, so it is not retried."""

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

    retryable = True


class QuotaError(ProviderError):
    """An account limit (vCPU, GPU, spot instance count) stops the request."""


class PriceTooLowError(ProviderError):
    """The maximum price of the request is below the current spot price."""


class ThrottledError(ProviderError):
    """The provider's API rate-limited us."""

    retryable = True


class AuthError(ProviderError):
    """Credentials are missing, expired or lack a permission."""


class NotFoundError(ProviderError):
    """The instance or resource does not exist (any more)."""


class ProviderUnavailable(ProviderError):
    """The provider's API failed on its side (5xx, timeout, connection reset)."""

    retryable = True
