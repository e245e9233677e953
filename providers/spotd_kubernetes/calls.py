"""The API calls the adapter makes, each under :func:`~.errors.map_kubernetes_errors`
with the request timeout: one place that knows the client's method names.

The client (and with it the cluster's credentials) is built on first use, so a daemon
starts even when they are missing; each call then raises AuthError.
"""

from __future__ import annotations

import threading
from typing import Any, Literal

from kubernetes import client

from spotd.core.errors import InvalidRequestError, NotFoundError

from .clients import build_api
from .errors import is_already_exists, map_kubernetes_errors
from .figures import CONTAINER
from .nodes import is_leaving
from .pods import PodRef
from .settings import KubernetesSettings

NodeState = Literal["up", "leaving", "gone"]


class Calls:
    """The cluster's API as the adapter uses it; ``api`` injects a built CoreV1Api."""

    def __init__(self, settings: KubernetesSettings, api: Any | None = None) -> None:
        self._settings = settings
        self._api = api
        self._lock = threading.Lock()
        self._timeout = settings.request_timeout_seconds

    def nodes(self) -> list[Any]:
        """Every node of the cluster."""
        with map_kubernetes_errors("listing nodes"):
            return list(self._core().list_node(_request_timeout=self._timeout).items)

    def node_state(self, name: str) -> NodeState:
        """Whether a node is up, cordoned or tainted as leaving, or gone."""
        try:
            with map_kubernetes_errors(f"read node {name}"):
                node = self._core().read_node(name, _request_timeout=self._timeout)
        except NotFoundError:
            return "gone"
        return "leaving" if is_leaving(node) else "up"

    def pods(self, namespace: str, selector: str) -> list[Any]:
        """The pods of ``namespace`` matching the label selector."""
        with map_kubernetes_errors(f"list pods in {namespace}"):
            return list(self._core().list_namespaced_pod(
                namespace, label_selector=selector, _request_timeout=self._timeout).items)

    def pod(self, ref: PodRef) -> Any | None:
        """The pod, None when there is none of that name."""
        try:
            with map_kubernetes_errors(f"read pod {ref.id}"):
                return self._core().read_namespaced_pod(ref.name, ref.namespace,
                                                        _request_timeout=self._timeout)
        except NotFoundError:
            return None

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        """Create a pod; one of that name already there (an earlier call's) is no error."""
        with map_kubernetes_errors(f"create pod {namespace}/{body['metadata']['name']}"):
            try:
                self._core().create_namespaced_pod(namespace, body,
                                                   _request_timeout=self._timeout)
            except client.ApiException as exc:
                if not is_already_exists(exc):
                    raise

    def delete(self, ref: PodRef) -> None:
        """Delete a pod (with its grace period); one already gone is ignored."""
        try:
            with map_kubernetes_errors(f"delete pod {ref.id}"):
                self._core().delete_namespaced_pod(ref.name, ref.namespace,
                                                   _request_timeout=self._timeout)
        except NotFoundError:
            return

    def log(self, ref: PodRef) -> str:
        """The job container's output; "" for a pod gone or not started yet."""
        try:
            with map_kubernetes_errors(f"log of pod {ref.id}"):
                text = self._core().read_namespaced_pod_log(
                    ref.name, ref.namespace, container=CONTAINER,
                    _request_timeout=self._timeout)  # fmt: skip
        except (NotFoundError, InvalidRequestError):
            return ""  # 400: the container is still waiting
        return str(text)

    def evict(self, ref: PodRef) -> None:
        """Evict a pod through the Eviction API (as ``kubectl drain`` does); a
        PodDisruptionBudget that refuses it answers 429, a ThrottledError."""
        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=ref.name,
                                                                  namespace=ref.namespace))
        with map_kubernetes_errors(f"evict pod {ref.id}"):
            self._core().create_namespaced_pod_eviction(ref.name, ref.namespace, eviction,
                                                        _request_timeout=self._timeout)

    def allowed(self, namespace: str, resource: str, verb: str) -> bool:
        """Whether the identity may ``verb`` the ``resource`` (``pods/log``: a subresource)
        in ``namespace`` ("": cluster-wide), by a SelfSubjectAccessReview."""
        name, _, sub = resource.partition("/")
        body = client.V1SelfSubjectAccessReview(
            api_version="authorization.k8s.io/v1", kind="SelfSubjectAccessReview",
            spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=client.V1ResourceAttributes(
                namespace=namespace or None, resource=name, subresource=sub or None, verb=verb)),
        )  # fmt: skip
        with map_kubernetes_errors(f"access review of {verb} {resource}"):
            review = client.AuthorizationV1Api(self._core().api_client) \
                .create_self_subject_access_review(body, _request_timeout=self._timeout)
        return bool(review.status and review.status.allowed)

    def core(self) -> Any:
        """The CoreV1Api, built on first use."""
        return self._core()

    def _core(self) -> Any:
        with self._lock:
            if self._api is None:
                self._api = build_api(self._settings)
            return self._api
