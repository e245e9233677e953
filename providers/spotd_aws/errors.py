"""AWS errors onto spotd's error tree, by error code, at the adapter's boundary.

The engine decides retry, failover or failure by the class of a
:class:`~spotd.core.errors.ProviderError`, so every boto3 call of the adapter runs
inside :func:`map_aws_errors`. Codes are matched exactly as AWS sends them,
never by message text (messages change; codes are API).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    CapacityNotAvailableError,
    ClientError,
    CredentialRetrievalError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ProfileNotFound,
    SSOError,
    TokenRetrievalError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from spotd.core.errors import (
    AuthError,
    CapacityError,
    InvalidRequestError,
    NotFoundError,
    PriceTooLowError,
    ProviderError,
    ProviderUnavailable,
    QuotaError,
    ThrottledError,
)

PROVIDER = "aws"


def _codes(kind: type[ProviderError], *codes: str) -> dict[str, type[ProviderError]]:
    return dict.fromkeys(codes, kind)


ERROR_CODES: Mapping[str, type[ProviderError]] = {
    **_codes(CapacityError, "InsufficientInstanceCapacity", "InsufficientCapacity", "Unsupported"),
    **_codes(PriceTooLowError, "SpotMaxPriceTooLow"),
    **_codes(
        QuotaError, "MaxSpotInstanceCountExceeded", "VcpuLimitExceeded", "InstanceLimitExceeded"
    ),
    **_codes(ThrottledError, "RequestLimitExceeded", "Throttling", "ThrottlingException"),
    **_codes(
        AuthError,
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "ExpiredToken",
        "ExpiredTokenException",
        "SignatureDoesNotMatch",
        "AccessDeniedException",
        "OptInRequired",
    ),
    **_codes(
        ProviderUnavailable,
        "InternalError",
        "InternalFailure",
        "InternalErrorException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "Unavailable",
        # A placement group whose instances are still shutting down: try again later.
        "InvalidPlacementGroup.InUse",
    ),
    **_codes(NotFoundError, "InvalidInstanceID.NotFound", "InvalidPlacementGroup.Unknown"),
}
"""AWS error code -> spotd class. EC2 and the Price List API spell some differently."""

FIS_ERROR_CODES: Mapping[str, type[ProviderError]] = {
    "ValidationException": InvalidRequestError,
    "ResourceNotFoundException": NotFoundError,
    "ServiceQuotaExceededException": QuotaError,
}
"""Fault Injection Service codes (drills) -> spotd class, over :data:`ERROR_CODES`. Kept
apart: other services send these codes too, where they may mean something else."""

_AUTH_EXCEPTIONS = (
    NoCredentialsError,
    PartialCredentialsError,
    CredentialRetrievalError,
    ProfileNotFound,
    TokenRetrievalError,
    SSOError,
)
# Connection refused or reset, DNS, TLS, connect and read timeouts, truncated bodies.
_UNAVAILABLE_EXCEPTIONS = (
    BotoConnectionError,
    HTTPClientError,
    IncompleteReadError,
    CapacityNotAvailableError,
)

# Access key ids never belong in a message, even though AWS does not echo them today.
_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|AGPA|ANPA)[A-Z0-9]{12,}\b")
_MAX_DETAIL = 300


@contextmanager
def map_aws_errors(action: str) -> Iterator[None]:
    """Run boto3 calls for ``action``, turning what they raise into ProviderErrors.

    ``action`` names what spotd was doing (an API operation, say) for the message.
    """
    try:
        yield
    except ClientError as exc:
        raise from_client_error(exc, action) from exc
    except _AUTH_EXCEPTIONS as exc:
        # The exception's text may name a profile or a credential source: keep it out.
        code = type(exc).__name__
        raise AuthError(_auth_message(action, code), provider=PROVIDER, code=code) from exc
    except _UNAVAILABLE_EXCEPTIONS as exc:
        code = type(exc).__name__
        raise ProviderUnavailable(
            f"aws {action}: {code}: {scrub(str(exc))}", provider=PROVIDER, code=code
        ) from exc
    except BotoCoreError as exc:
        code = type(exc).__name__
        raise ProviderError(
            f"aws {action}: {code}: {scrub(str(exc))}", provider=PROVIDER, code=code
        ) from exc


@contextmanager
def map_fis_errors(action: str) -> Iterator[None]:
    """:func:`map_aws_errors` for Fault Injection Service calls, whose codes
    :data:`FIS_ERROR_CODES` maps first."""
    try:
        with map_aws_errors(action):
            yield
    except ProviderError as exc:
        kind = FIS_ERROR_CODES.get(exc.code)
        if kind is None or isinstance(exc, kind):
            raise
        raise kind(str(exc), provider=PROVIDER, code=exc.code) from exc


def from_client_error(exc: ClientError, action: str) -> ProviderError:
    """The spotd error for an error response of an AWS API."""
    response: Mapping[str, Any] = exc.response or {}
    error = response.get("Error") or {}
    code = str(error.get("Code") or "")
    status = _status(response)
    kind = classify(code, status)
    if kind is AuthError:
        message = _auth_message(action, code)
    else:
        message = f"aws {action}: {code or status}: {scrub(str(error.get('Message') or ''))}"
    return kind(message, provider=PROVIDER, code=code)


def classify(code: str, status: int | None) -> type[ProviderError]:
    """The class for an error code; the HTTP status decides only for unknown codes."""
    known = ERROR_CODES.get(code)
    if known is not None:
        return known
    if status is not None and status >= 500:
        return ProviderUnavailable
    if status == 429:
        return ThrottledError
    return ProviderError


def scrub(text: str) -> str:
    """``text`` with access key ids blanked out, cut to a readable length."""
    cleaned = _KEY_ID.sub("[redacted]", text)
    return cleaned if len(cleaned) <= _MAX_DETAIL else cleaned[:_MAX_DETAIL] + "..."


def _status(response: Mapping[str, Any]) -> int | None:
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _auth_message(action: str, code: str) -> str:
    # AWS's own text for these can carry an encoded policy context: leave it out.
    return (
        f"aws {action}: {code}: credentials are missing, expired or lack a permission "
        "(see docs/providers-aws.md for the credential chain and the IAM policy)"
    )
