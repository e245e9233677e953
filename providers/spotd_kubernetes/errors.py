"""Mapping the kubernetes client's errors onto spotd's :class:`~spotd.core.errors.ProviderError`
tree, by HTTP status and the API's ``Status.reason`` (never by message text).

| answer | spotd error |
|---|---|
| 401, 403 | ``AuthError`` |
| 404 | ``NotFoundError`` |
| 409 | ``ProviderError`` (a conflict: ``AlreadyExists`` is handled where it is expected) |
| 400, 422 | ``InvalidRequestError`` |
| 429 | ``ThrottledError`` (also an eviction a PodDisruptionBudget refuses) |
| 5xx; no connection, timeouts | ``ProviderUnavailable`` |
| a kubeconfig or in-cluster configuration that cannot be loaded | ``AuthError`` |

An exceeded ResourceQuota is a plain 403 from the API: spotd tells it apart by reading
the namespace's quotas before a launch (:mod:`.quota`), which raises ``QuotaError``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from spotd.core.errors import (
    AuthError,
    InvalidRequestError,
    NotFoundError,
    ProviderError,
    ProviderUnavailable,
    ThrottledError,
)

from .figures import NAME

_BY_STATUS: dict[int, type[ProviderError]] = {
    400: InvalidRequestError,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    422: InvalidRequestError,
    429: ThrottledError,
}


def kind_of(status: int | None) -> type[ProviderError]:
    """The spotd error class of an API answer with this HTTP status."""
    if status is None:
        return ProviderUnavailable
    if status >= 500:
        return ProviderUnavailable
    return _BY_STATUS.get(status, ProviderError)


def status_reason(exc: ApiException) -> str:
    """The ``reason`` of the API's Status body (``AlreadyExists``), else the HTTP reason."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    reason = body.get("reason") if isinstance(body, dict) else None
    return str(reason or exc.reason or exc.status)


def status_message(exc: ApiException) -> str:
    """The API's message, for people (it names the object, never a credential)."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or "")


def is_already_exists(exc: ApiException) -> bool:
    """Whether a create failed because the object is there (409 ``AlreadyExists``)."""
    return exc.status == 409 and status_reason(exc) == "AlreadyExists"


def from_api_exception(exc: ApiException, action: str = "") -> ProviderError:
    """The spotd error for one error answer of the API server."""
    kind = kind_of(exc.status)
    prefix = f"{action}: " if action else ""
    return kind(f"{NAME}: {prefix}{exc.status} {status_message(exc)}",
                provider=NAME, code=status_reason(exc))  # fmt: skip


@contextmanager
def map_kubernetes_errors(action: str = "") -> Iterator[None]:
    """Turn every client, transport and configuration error inside into a spotd
    ProviderError; ``action`` (``create pod spotd/x``) prefixes the message."""
    prefix = f"{action}: " if action else ""
    try:
        yield
    except ProviderError:
        raise
    except ApiException as exc:
        raise from_api_exception(exc, action) from exc
    except ConfigException as exc:
        raise AuthError(f"{NAME}: {prefix}no usable cluster credentials: {exc}",
                        provider=NAME, code="ConfigException") from exc  # fmt: skip
    except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
        raise ProviderUnavailable(f"{NAME}: {prefix}API server unreachable: "
                                  f"{type(exc).__name__}", provider=NAME,
                                  code=type(exc).__name__) from exc  # fmt: skip
