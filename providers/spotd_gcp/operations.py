"""Waiting for a Compute Engine operation (zonal or regional) to finish."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.cloud import compute_v1

from spotd.core.errors import ProviderUnavailable

from .errors import PROVIDER, map_gcp_errors, raise_for_operation

WAIT_CALL_SECONDS = 150.0
"""Client timeout of one ``operations.wait`` call (the server holds it up to 2 min)."""

WaitCall = Callable[[str, float], Any]
"""One ``{zone,region}Operations.wait(operation=name, timeout=seconds)`` call."""


def wait_for(
    operation: Any, wait: WaitCall, *, timeout_seconds: float, monotonic: Callable[[], float]
) -> None:
    """Wait until ``operation`` is done, at most ``timeout_seconds``; raise its error, if any.

    Raises :class:`ProviderUnavailable` (retried by the engine) when it is not done in time.
    """
    deadline = monotonic() + timeout_seconds
    done = compute_v1.Operation.Status.DONE
    while operation.status != done:
        left = deadline - monotonic()
        if left <= 0:
            raise ProviderUnavailable(
                f"gcp: operation {operation.name} not done after {timeout_seconds:g} s",
                provider=PROVIDER, code="OperationTimeout",
            )  # fmt: skip
        with map_gcp_errors(f"waiting for {operation.name}"):
            operation = wait(operation.name, min(WAIT_CALL_SECONDS, left + 5.0))
    raise_for_operation(operation)
