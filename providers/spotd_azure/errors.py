"""Azure errors mapped onto spotd's :class:`~spotd.core.errors.ProviderError` tree.

ARM puts a stable error CODE in every error body (``{"error": {"code": ...}}``),
also in a long-running operation's failed status, so the mapping goes by code
first and by HTTP status only when the code says nothing we know. Messages are
never parsed: they change wording and language. Messages we pass on are the
ARM message (or the exception's first line), which carries no token: azure-core
keeps the ``Authorization`` header out of exceptions and redacts it in logs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import httpx
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    DecodeError,
    DeserializationError,
    HttpResponseError,
    SerializationError,
    ServiceRequestError,
    ServiceResponseError,
)

from spotd.core.errors import (
    AuthError,
    CapacityError,
    NotFoundError,
    ProviderError,
    ProviderUnavailable,
    QuotaError,
    ThrottledError,
)

PROVIDER = "azure"
MAX_MESSAGE = 300
"""Characters of a cloud message kept in our error (they can be pages long)."""

CAPACITY_CODES = frozenset({
    "SkuNotAvailable",
    "AllocationFailed",
    "ZonalAllocationFailed",
    "OverconstrainedAllocationRequest",
    "OverconstrainedZonalAllocationRequest",
})  # fmt: skip
# Azure reports vCPU family and spot quota as OperationNotAllowed (409).
QUOTA_CODES = frozenset({"OperationNotAllowed", "QuotaExceeded"})
THROTTLE_CODES = frozenset({"TooManyRequests"})
AUTH_CODES = frozenset({
    "AuthorizationFailed",
    "LinkedAuthorizationFailed",
    "InvalidAuthenticationToken",
    "InvalidAuthenticationTokenTenant",
    "ExpiredAuthenticationToken",
    "AuthenticationFailed",
})  # fmt: skip
NOT_FOUND_CODES = frozenset({"ResourceNotFound", "NotFound", "ResourceGroupNotFound"})

ErrorClass = type[ProviderError]


def class_for_code(code: str) -> ErrorClass | None:
    """Our error class for an ARM error code, None when the code is not one we know."""
    if code in CAPACITY_CODES:
        return CapacityError
    # Quota families come as codes such as "LowPriorityCoreQuotaExceeded".
    if code in QUOTA_CODES or "quota" in code.lower():
        return QuotaError
    if code in THROTTLE_CODES:
        return ThrottledError
    if code in AUTH_CODES:
        return AuthError
    if code in NOT_FOUND_CODES:
        return NotFoundError
    return None


def class_for_status(status: int | None) -> ErrorClass:
    """Our error class for an HTTP status when the code told nothing."""
    if status == 429:
        return ThrottledError
    if status in (401, 403):
        return AuthError
    if status == 404:
        return NotFoundError
    if status is not None and status >= 500:
        return ProviderUnavailable
    return ProviderError


def _codes(exc: HttpResponseError) -> list[str]:
    """The ARM code and the codes of its details, outermost first."""
    error = exc.error
    if error is None:
        return []
    codes = [error.code or ""]
    codes += [d.code or "" for d in getattr(error, "details", None) or []]
    return [c for c in codes if c]


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:MAX_MESSAGE]


def _decide(codes: list[str], status: int | None) -> tuple[str, ErrorClass]:
    """The code to report and our class: the first code we know, else by status."""
    for code in codes:
        cls = class_for_code(code)
        if cls is not None:
            return code, cls
    return (codes[0] if codes else f"HTTP{status or ''}"), class_for_status(status)


def from_http_error(exc: HttpResponseError, operation: str) -> ProviderError:
    """Map an ARM error response (or failed long-running operation) to our class."""
    code, cls = _decide(_codes(exc), exc.status_code)
    message = (exc.error.message if exc.error else None) or exc.reason or ""
    return cls(f"azure {operation}: {code}: {_first_line(message)}", provider=PROVIDER, code=code)


def unreadable(exc: Exception, operation: str) -> ProviderUnavailable:
    """A reply the SDK could not read: the service's side, like a broken connection."""
    name = type(exc).__name__
    return ProviderUnavailable(f"azure {operation}: unreadable reply: {name}",
                               provider=PROVIDER, code=name)  # fmt: skip


def from_azure_error(exc: AzureError, operation: str) -> ProviderError:
    """Map any azure-core or azure-identity exception to our class."""
    name = type(exc).__name__
    # azure-identity raises ClientAuthenticationError (and its subclass
    # CredentialUnavailableError) without an HTTP response when no credential works.
    if isinstance(exc, ClientAuthenticationError) and exc.response is None:
        return AuthError(f"azure {operation}: {name}: {_first_line(str(exc.message))}",
                         provider=PROVIDER, code=name)  # fmt: skip
    if isinstance(exc, DecodeError):
        # A 2xx whose body is not JSON (cut short, a proxy's page).
        return unreadable(exc, operation)
    if isinstance(exc, HttpResponseError):
        return from_http_error(exc, operation)
    if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
        return ProviderUnavailable(f"azure {operation}: {name}: {_first_line(str(exc.message))}",
                                   provider=PROVIDER, code=name)  # fmt: skip
    return ProviderError(f"azure {operation}: {name}: {_first_line(str(exc.message))}",
                         provider=PROVIDER, code=name)  # fmt: skip


def from_httpx_error(exc: httpx.HTTPError, operation: str) -> ProviderError:
    """Map an error of the Retail Prices API (plain HTTP, no ARM codes) to our class."""
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        return class_for_status(status)(
            f"azure {operation}: HTTP {status}", provider=PROVIDER, code=f"HTTP{status}"
        )
    name = type(exc).__name__
    # Timeouts, refused connections, broken responses: the service's side.
    return ProviderUnavailable(f"azure {operation}: {name}", provider=PROVIDER, code=name)


@contextmanager
def map_azure_errors(operation: str) -> Iterator[None]:
    """Raise the SDK's and httpx's exceptions inside as spotd ProviderErrors.

    ``operation`` names the call in the message (``"launch spotd-ab12-0"``).
    Our own ProviderErrors pass through unchanged.
    """
    try:
        yield
    except AzureError as exc:
        raise from_azure_error(exc, operation) from exc
    except httpx.HTTPError as exc:
        raise from_httpx_error(exc, operation) from exc
    except (DeserializationError, SerializationError, json.JSONDecodeError) as exc:
        # A reply the SDK could not read (ValueErrors, outside AzureError's tree).
        raise unreadable(exc, operation) from exc


def delete_each(deletes: Iterable[tuple[str, Callable[[], object]]]) -> None:
    """Run every ``(what, delete)``, mapped; ones already gone are skipped.

    Every delete is tried; the first error other than "gone" is raised after
    the last, so one failure does not keep the others from being asked.
    """
    first: ProviderError | None = None
    for what, delete in deletes:
        try:
            with map_azure_errors(f"delete {what}"):
                delete()
        except NotFoundError:
            continue
        except ProviderError as exc:
            first = first or exc
    if first is not None:
        raise first
