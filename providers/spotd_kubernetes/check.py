"""``spotd check-cloud`` for Kubernetes: what a launch needs, checked without creating anything.

- credentials: the node list (which every price poll reads too);
- permissions: one SelfSubjectAccessReview per verb spotd uses, cluster-wide for nodes
  and in each of its namespaces for pods, their logs and evictions, and quotas;
- with a job: its pool still has nodes in its market, not all cordoned or leaving; an
  image to run; the namespace's ResourceQuotas leave room for its GPUs and pods; the
  boot script renders within the pod command's limit.

Whether the scheduler finds room is only known on a real launch: the nodes' free GPUs
depend on pods in namespaces spotd may not read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from spotd.core.agent_wire import IMAGE
from spotd.core.errors import ProviderError, invalid_request
from spotd.core.values import CheckOutcome, CloudCheck, LaunchRequest, Market, Pool

from .calls import Calls
from .figures import GPU_RESOURCE, NAME
from .nodes import PoolFacts
from .pods import pod_name
from .quota import check_quotas, need_of
from .settings import KubernetesSettings

CLUSTER_ACCESS = (("nodes", "list"), ("nodes", "get"))
NAMESPACE_ACCESS = (
    ("pods", "create"), ("pods", "delete"), ("pods", "get"), ("pods", "list"),
    ("pods/log", "get"), ("pods/eviction", "create"), ("resourcequotas", "list"),
)  # fmt: skip
"""What spotd does in each of its namespaces (docs/providers-kubernetes.md#rbac)."""


def failed_credentials(exc: ProviderError) -> CloudCheck:
    """The check of a cluster whose node list was refused or did not answer."""
    return CloudCheck(NAME, (CheckOutcome("credentials", False, str(exc)),))


class KubernetesCheck:
    """One run of ``check-cloud`` against a cluster whose nodes were just read (``pools``)."""

    def __init__(self, settings: KubernetesSettings, calls: Calls,
                 pools: Mapping[Pool, PoolFacts],
                 boot_script: Callable[[LaunchRequest], str]) -> None:  # fmt: skip
        self._settings = settings
        self._calls = calls
        self._pools = pools
        self._boot_script = boot_script

    def run(self, request: LaunchRequest | None, namespace: str) -> CloudCheck:
        """Every outcome, and what a launch of ``request`` into ``namespace`` would create."""
        nodes = sum(len(p.nodes) for p in self._pools.values())
        outcomes = [CheckOutcome("credentials", True,
                                 f"{nodes} GPU node(s) in {len(self._pools)} pool(s)")]
        outcomes += self._permissions()
        if request is None:
            return CloudCheck(NAME, tuple(outcomes))
        pool = self._pools.get(request.offering.pool)
        outcomes.append(self._pool(request, pool))
        outcomes.append(self._image(request))
        outcomes.append(self._quota(request, pool, namespace))
        outcomes.append(self._script(request))
        made = tuple(f"pod {namespace}/{pod_name(request.client_token, rank)} on pool "
                     f"{request.offering.pool.instance_type} ({request.offering.gpus_per_node} "
                     f"{GPU_RESOURCE})" for rank in range(request.nodes))  # fmt: skip
        return CloudCheck(NAME, tuple(outcomes), made)

    def _permissions(self) -> list[CheckOutcome]:
        wanted = [("", resource, verb) for resource, verb in CLUSTER_ACCESS]
        wanted += [(ns, resource, verb) for ns in self._settings.namespaces()
                   for resource, verb in NAMESPACE_ACCESS]  # fmt: skip
        found = []
        for namespace, resource, verb in wanted:
            where = f" in {namespace}" if namespace else " (cluster-wide)"
            try:
                ok = self._calls.allowed(namespace, resource, verb)
            except ProviderError as exc:
                found.append(CheckOutcome(f"permission {verb} {resource}{where}", False, str(exc)))
                continue
            if not ok:
                found.append(CheckOutcome(f"permission {verb} {resource}{where}", False,
                                          f"not allowed: grant it (RBAC){where}"))  # fmt: skip
        if not found:
            found.append(CheckOutcome("permissions", True, f"all {len(wanted)} allowed"))
        return found

    def _pool(self, request: LaunchRequest, pool: PoolFacts | None) -> CheckOutcome:
        name = f"pool {request.offering.pool.instance_type}"
        if pool is None:
            return CheckOutcome(name, False, "no GPU node of this pool is left in the cluster")
        sold = pool.spot is not None if request.market is Market.SPOT else pool.on_demand
        if not sold:
            return CheckOutcome(name, False, f"the pool has no {request.market} nodes")
        return CheckOutcome(name, True, f"{len(pool.nodes)} node(s); whether "
                            f"{request.nodes} have their GPUs free the scheduler tells at launch")

    def _image(self, request: LaunchRequest) -> CheckOutcome:
        image = request.env.get(IMAGE) or self._settings.image
        if not image:
            return CheckOutcome("image", False, "the job names no [container] image and "
                                "providers.kubernetes.image is not set")
        return CheckOutcome("image", True, image)

    def _quota(self, request: LaunchRequest, pool: PoolFacts | None,
               namespace: str) -> CheckOutcome:  # fmt: skip
        gpus = pool.first.gpus if pool else request.offering.gpus_per_node
        try:
            check_quotas(self._calls.core(), namespace, need_of(gpus, request.nodes),
                         self._settings.request_timeout_seconds)
        except ProviderError as exc:
            return CheckOutcome(f"quota in {namespace}", False, str(exc))
        return CheckOutcome(f"quota in {namespace}", True,
                            f"room for {request.nodes} pod(s) of {gpus} GPU(s)")

    def _script(self, request: LaunchRequest) -> CheckOutcome:
        try:
            with invalid_request(NAME, "boot script"):
                self._boot_script(request)
        except ProviderError as exc:
            return CheckOutcome("boot script", False, str(exc))
        return CheckOutcome("boot script", True, "renders within the pod command's limit")
