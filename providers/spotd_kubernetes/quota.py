"""A namespace's ResourceQuotas, read before a launch.

The API answers a pod over quota with a plain 403 Forbidden, the same answer as a
missing permission, told apart only by its message. So spotd reads the quotas itself
and refuses a launch that would pass one with ``QuotaError`` before creating a pod.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity as _parse_quantity

from spotd.core.errors import QuotaError

from .errors import map_kubernetes_errors
from .figures import GPU_RESOURCE, NAME


def parse_quantity(text: str) -> Decimal:
    """A quantity (``8``, ``500m``, ``1Gi``) as a number, by the client's own parser."""
    return Decimal(_parse_quantity(text))  # type: ignore[no-untyped-call]


def need_of(gpus_per_pod: int, pods: int) -> dict[str, Decimal]:
    """Quota name -> how much of it ``pods`` pods of ``gpus_per_pod`` GPUs take."""
    gpus = Decimal(gpus_per_pod * pods)
    return {f"requests.{GPU_RESOURCE}": gpus, f"limits.{GPU_RESOURCE}": gpus,
            "pods": Decimal(pods), "count/pods": Decimal(pods)}  # fmt: skip


def check_quotas(api: Any, namespace: str, need: dict[str, Decimal], timeout: float) -> None:
    """Raise QuotaError when ``need`` does not fit in what a quota of ``namespace`` has left."""
    with map_kubernetes_errors(f"quotas of {namespace}"):
        quotas = api.list_namespaced_resource_quota(namespace, _request_timeout=timeout).items
    for quota in quotas:
        hard = (quota.status.hard if quota.status else None) or {}
        used = (quota.status.used if quota.status else None) or {}
        for name, amount in need.items():
            if name not in hard:
                continue
            left = parse_quantity(hard[name]) - parse_quantity(used.get(name, "0"))
            if amount > left:
                raise QuotaError(
                    f"{NAME}: ResourceQuota {namespace}/{quota.metadata.name} has {left} "
                    f"{name} left, the launch needs {amount}", provider=NAME,
                    code="ResourceQuotaExceeded",
                )  # fmt: skip
