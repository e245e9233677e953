"""Mapping the Google SDKs' errors onto spotd's :class:`~spotd.core.errors.ProviderError` tree.

Errors are classified by the API's machine-readable REASON and code, never
by message text: ``GoogleAPICallError.reason`` (from ``ErrorInfo``), the
``reason`` of each entry of ``.errors`` (the JSON ``error.errors[]``), and
the HTTP status. Errors that arrive on a long-running Operation
(``error.errors[].code``, which is how ``ZONE_RESOURCE_POOL_EXHAUSTED``
arrives) go through :func:`raise_for_operation`.

Messages keep the API's own text, which names the project, zone and
resource but never a credential: bearer tokens travel in headers, which no
SDK exception carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc

from spotd.core.errors import (
    AuthError,
    CapacityError,
    NotFoundError,
    ProviderError,
    ProviderUnavailable,
    QuotaError,
    ThrottledError,
)

PROVIDER = "gcp"

CAPACITY_CODES = frozenset({
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "STOCKOUT",
    "zoneResourcePoolExhausted",
    "zoneResourcePoolExhaustedWithDetails",
})  # fmt: skip
"""Reasons and operation codes that mean: no capacity in that zone now."""

RATE_LIMIT_CODES = frozenset({
    "rateLimitExceeded",
    "userRateLimitExceeded",
    "RATE_LIMIT_EXCEEDED",
    "RESOURCE_EXHAUSTED",
})  # fmt: skip
"""Reasons of per-minute API limits: back off and retry."""

QUOTA_CODES = frozenset({
    "QUOTA_EXCEEDED",
    "quotaExceeded",
    "limitExceeded",
    "dailyLimitExceeded",
})  # fmt: skip
"""Reasons of project quotas (GPUs, vCPUs, instances): retrying alone does not help."""

AUTH_CODES = frozenset({
    "authError", "forbidden", "insufficientPermissions", "accessNotConfigured",
    "ACCESS_TOKEN_EXPIRED", "CREDENTIALS_MISSING", "IAM_PERMISSION_DENIED",
    "SERVICE_DISABLED", "ACCESS_TOKEN_SCOPE_INSUFFICIENT",
})  # fmt: skip
"""Reasons that mean the identity is missing or lacks a permission."""

UNAVAILABLE_CODES = frozenset({"backendError", "internalError", "SERVICE_UNAVAILABLE"})

_Kind = type[ProviderError]


def classify(codes: Iterable[str], http_status: int | None) -> _Kind:
    """The spotd error class for these reasons/codes and HTTP status.

    Reasons win over the status: a 403 ``quotaExceeded`` is a quota, a 403
    ``rateLimitExceeded`` a throttle, any other 403 a refused identity.
    """
    found = set(codes)
    by_reason: list[tuple[frozenset[str], _Kind]] = [
        (CAPACITY_CODES, CapacityError),
        (RATE_LIMIT_CODES, ThrottledError),
        (QUOTA_CODES, QuotaError),
        (AUTH_CODES, AuthError),
        (UNAVAILABLE_CODES, ProviderUnavailable),
    ]
    for known, kind in by_reason:
        if found & known:
            return kind
    return _by_status(http_status)


def _by_status(http_status: int | None) -> _Kind:
    if http_status is None:
        return ProviderError
    if http_status == 429:
        return ThrottledError
    if http_status in (401, 403):
        return AuthError
    if http_status == 404:
        return NotFoundError
    if http_status >= 500:
        return ProviderUnavailable
    return ProviderError


def api_codes(exc: gexc.GoogleAPICallError) -> list[str]:
    """Every machine-readable reason an API error carries, most specific first."""
    codes: list[str] = []
    if exc.reason:
        codes.append(str(exc.reason))
    for entry in exc.errors:
        reason = entry.get("reason") if isinstance(entry, dict) else None
        if reason:
            codes.append(str(reason))
    return codes


def from_api_error(exc: gexc.GoogleAPICallError, action: str = "") -> ProviderError:
    """The spotd error for one error answer of a Google API."""
    codes = api_codes(exc)
    status = exc.code if isinstance(exc.code, int) else None
    kind = classify(codes, status)
    code = codes[0] if codes else str(status or type(exc).__name__)
    return kind(f"gcp: {_prefix(action)}{exc.message}", provider=PROVIDER, code=code)


def _prefix(action: str) -> str:
    return f"{action}: " if action else ""


def is_already_exists(exc: gexc.GoogleAPICallError) -> bool:
    """Whether an insert failed because the resource exists (409 ``alreadyExists``)."""
    return isinstance(exc, gexc.Conflict) or "alreadyExists" in api_codes(exc)


def raise_for_operation(operation: Any) -> None:
    """Raise the spotd error for a finished ``compute_v1.Operation`` that failed."""
    entries = list(operation.error.errors) if operation.error else []
    if not entries:
        return
    codes = [str(e.code) for e in entries if e.code]
    status = int(operation.http_error_status_code) or None
    kind = classify(codes, status)
    detail = "; ".join(f"{e.code}: {e.message}" for e in entries)
    raise kind(
        f"gcp: operation {operation.name} failed: {detail}",
        provider=PROVIDER, code=codes[0] if codes else "OPERATION_FAILED",
    )  # fmt: skip


@contextmanager
def map_gcp_errors(action: str = "") -> Iterator[None]:
    """Turn every SDK, auth and transport error inside into a spotd ProviderError.

    ``action`` (e.g. ``"insert us-central1-a/spotd-..."``) prefixes the message.
    """
    prefix = _prefix(action)
    try:
        yield
    except ProviderError:
        raise
    except gexc.GoogleAPICallError as exc:
        raise from_api_error(exc, action) from exc
    except auth_exc.InvalidOperation as exc:
        # The SDK answers a 401 by refreshing the credentials; these cannot be refreshed.
        raise AuthError(
            f"gcp: {prefix}credentials refused and not refreshable",
            provider=PROVIDER, code="CredentialsRefused",
        ) from exc  # fmt: skip
    except auth_exc.DefaultCredentialsError as exc:
        raise AuthError(
            f"gcp: {prefix}no Application Default Credentials: {exc}",
            provider=PROVIDER, code="DefaultCredentialsError",
        ) from exc  # fmt: skip
    except auth_exc.RefreshError as exc:
        raise AuthError(
            f"gcp: {prefix}credentials could not be refreshed",
            provider=PROVIDER, code="RefreshError",
        ) from exc  # fmt: skip
    except (
        requests.exceptions.RequestException, auth_exc.TransportError, auth_exc.TimeoutError,
        gexc.RetryError, ConnectionError, TimeoutError,
    ) as exc:  # fmt: skip
        raise ProviderUnavailable(
            f"gcp: {prefix}API unreachable: {type(exc).__name__}",
            provider=PROVIDER, code=type(exc).__name__,
        ) from exc  # fmt: skip
    except auth_exc.GoogleAuthError as exc:
        # The rest of google-auth's tree (OAuth, client certificates, mTLS, malformed
        # key files) is a credentials problem that a retry will not fix.
        raise AuthError(
            f"gcp: {prefix}credentials unusable: {type(exc).__name__}: {exc}",
            provider=PROVIDER, code=type(exc).__name__,
        ) from exc  # fmt: skip
