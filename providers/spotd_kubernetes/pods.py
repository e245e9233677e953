"""Translating between spotd's launch requests / instances and Kubernetes pods.

One pod per node of an attempt, named after the client token and the node's rank,
pinned by node affinity to its pool (and zone, and market), requesting all the GPUs
and fabric devices of one node. It runs the daemon's boot script (spotd's agent around
the job) with bash as its first process, which hands the pod's SIGTERM to the agent.

States (``status.phase`` -> :class:`~spotd.core.values.InstanceState`): Pending ->
PENDING, Running and Unknown -> RUNNING, Succeeded -> EXITED; Failed -> PREEMPTED when
the pod was disrupted (condition ``DisruptionTarget``, or an eviction or node shutdown
as its reason), else EXITED with the container's exit code. A running pod that is
being deleted by someone else, has ``DisruptionTarget``, or whose node is cordoned or
tainted by a drain or reclaim is NOTICE; one whose node is gone is PREEMPTED; one
spotd deleted is TERMINATED.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spotd.core.agent_wire import IMAGE
from spotd.core.values import Instance, InstanceState, LaunchRequest, Market, Pool

from .figures import (
    CONTAINER,
    GPU_RESOURCE,
    LAUNCH_LABEL,
    MANAGED_LABEL,
    MARKET_LABEL,
    NAME,
    POOL_ANNOTATION,
    RANK_LABEL,
    SPOT_TOLERATIONS,
    TAGS_ANNOTATION,
    ZONE_LABEL,
)
from .nodes import PoolFacts
from .settings import KubernetesSettings

SCRATCH = "/spotd"
"""An emptyDir mounted in the pod."""
BOOT_DIR = f"{SCRATCH}/agent"
"""Where the boot script keeps the agent's env file and launcher: a folder it creates
in the emptyDir, so that it owns it (and may make it private) under any user id."""
DISRUPTED_REASONS = frozenset({"Evicted", "Shutdown", "NodeShutdown", "Terminated",
                               "NodeLost", "Preempting"})  # fmt: skip
"""``status.reason`` of a Failed pod that the cluster took away."""
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]")

AGENT_TAIL = """
# >>> spotd kubernetes
# This script is the pod's first process: hand the pod's SIGTERM (an eviction, a
# drain, a delete) to the agent, and end with the agent's exit code.
spotd_agent=$!
trap 'kill -TERM "$spotd_agent" 2>/dev/null || true' TERM
set +e
wait "$spotd_agent"; spotd_code=$?
while kill -0 "$spotd_agent" 2>/dev/null; do wait "$spotd_agent"; spotd_code=$?; done
exit "$spotd_code"
# <<< spotd kubernetes
"""


@dataclass(frozen=True, slots=True)
class PodRef:
    """Where a pod is: spotd's instance id is ``namespace/name``."""

    namespace: str
    name: str

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, instance_id: str) -> PodRef | None:
        namespace, sep, name = instance_id.partition("/")
        if not sep or not namespace or not name or "/" in name:
            return None
        return cls(namespace, name)


def token_hash(client_token: str) -> str:
    """The launch's label value: 40 hex characters of the token's SHA-256."""
    return hashlib.sha256(client_token.encode()).hexdigest()[:40]


def pod_name(client_token: str, rank: int) -> str:
    """``spotd-<hash>-<rank>``: the same for a retried launch."""
    return f"spotd-{token_hash(client_token)[:16]}-{rank}"


def label_value(value: str) -> str:
    """``value`` as a label value (63 characters of ``[A-Za-z0-9._-]``, alphanumeric ends)."""
    return _LABEL_VALUE.sub("-", value)[:63].strip("-._")


def tag_selector(tags: Mapping[str, str]) -> str:
    """The label selector of spotd's pods whose labels carry ``tags`` (made label-safe)."""
    terms = [f"{MANAGED_LABEL}=true"]
    terms += [f"{key}={label_value(value)}" for key, value in sorted(tags.items())]
    return ",".join(terms)


def pod_body(
    settings: KubernetesSettings, request: LaunchRequest, pool: PoolFacts, *,
    rank: int, namespace: str, script: str,
) -> dict[str, Any]:
    """The pod of node ``rank`` of ``request`` in ``pool``."""
    name = pod_name(request.client_token, rank)
    node = pool.first
    limits = {GPU_RESOURCE: str(node.gpus)}
    limits.update({k: str(v) for k, v in node.fabric_resources.items()})
    labels = {key: label_value(value) for key, value in request.tags.items()}
    labels.update({MANAGED_LABEL: "true", LAUNCH_LABEL: token_hash(request.client_token),
                   RANK_LABEL: str(rank), MARKET_LABEL: request.market.value})  # fmt: skip
    off = request.offering.pool
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": settings.notice_seconds,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": _placement(settings, request, pool)}],
        }}},
        "tolerations": _tolerations(settings, request.market),
        "containers": [{
            "name": CONTAINER,
            "image": request.env.get(IMAGE) or settings.image,
            "command": ["bash", "-c", script + AGENT_TAIL],
            "env": [
                {"name": "SPOTD_AGENT_INSTANCE_ID", "value": f"{namespace}/{name}"},
                {"name": "SPOTD_BOOT_DIR", "value": BOOT_DIR},
                {"name": "SPOTD_LOG", "value": "/proc/1/fd/1"},
            ],
            "resources": {"limits": limits},
            "volumeMounts": [{"name": "spotd", "mountPath": SCRATCH},
                             {"name": "dshm", "mountPath": "/dev/shm"}],  # noqa: S108
        }],
        # NCCL's shared-memory transport needs more than the runtime's 64 MiB default.
        "volumes": [{"name": "spotd", "emptyDir": {}},
                    {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }  # fmt: skip
    if request.max_run_seconds is not None:
        spec["activeDeadlineSeconds"] = request.max_run_seconds
    if settings.priority_class:
        spec["priorityClassName"] = settings.priority_class
    if settings.service_account:
        spec["serviceAccountName"] = settings.service_account
    annotations = {
        TAGS_ANNOTATION: json.dumps(dict(request.tags), sort_keys=True),
        POOL_ANNOTATION: json.dumps([off.region, off.zone, off.instance_type]),
    }
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "annotations": annotations},
            "spec": spec}  # fmt: skip


def _placement(
    settings: KubernetesSettings, request: LaunchRequest, pool: PoolFacts
) -> list[dict[str, Any]]:
    node = pool.first
    terms = [{"key": node.pool_key, "operator": "In", "values": [node.pool_name]}]
    if node.zone_labelled:
        terms.append({"key": ZONE_LABEL, "operator": "In", "values": [node.zone]})
    if node.gpu_label is not None:
        terms.append({"key": node.gpu_label[0], "operator": "In", "values": [node.gpu_label[1]]})
    if request.market is Market.SPOT and pool.spot is not None:
        terms.append({"key": pool.spot[0], "operator": "In", "values": [pool.spot[1]]})
    elif request.market is Market.ON_DEMAND:
        terms += [{"key": key, "operator": "NotIn", "values": list(values)}
                  for key, values in settings.spot_labels().items()]  # fmt: skip
    return terms


def _tolerations(settings: KubernetesSettings, market: Market) -> list[dict[str, str]]:
    found = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    if market is Market.SPOT:
        found += [{"key": k, "operator": "Equal", "value": v, "effect": "NoSchedule"}
                  for k, v in SPOT_TOLERATIONS]  # fmt: skip
    return found + [dict(t) for t in settings.tolerations]


def is_ours(pod: Any) -> bool:
    """Whether spotd created this pod (its managed and owner labels): never touch others."""
    labels = pod.metadata.labels or {}
    return labels.get(MANAGED_LABEL) == "true" and bool(labels.get("spotd-owner"))


def tags_of(pod: Any) -> dict[str, str]:
    """The exact tags of a pod, from its annotation."""
    try:
        loaded = json.loads((pod.metadata.annotations or {}).get(TAGS_ANNOTATION, "{}"))
    except ValueError:
        loaded = {}
    return {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


def pool_of(pod: Any) -> Pool:
    """The pool a pod was launched into, from its annotation."""
    try:
        region, zone, instance_type = json.loads(
            (pod.metadata.annotations or {}).get(POOL_ANNOTATION, "")
        )
    except ValueError:
        region, zone, instance_type = "", "", "unknown"
    return Pool(NAME, str(region), str(zone), str(instance_type))


def is_disrupted(pod: Any) -> bool:
    """Whether the pod has the condition ``DisruptionTarget``: the cluster is taking it."""
    conditions = (pod.status.conditions if pod.status else None) or ()
    return any(c.type == "DisruptionTarget" and c.status == "True" for c in conditions)


def unschedulable(pod: Any) -> str | None:
    """The scheduler's message when it found no node for the pod, else None."""
    conditions = (pod.status.conditions if pod.status else None) or ()
    for c in conditions:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message or "no node fits")
    return None


def to_instance(pod: Any, *, node_gone: bool, node_leaving: bool, ours: bool) -> Instance:
    """spotd's view of one of its pods. ``ours``: spotd deleted it."""
    status = pod.status
    state = _state(pod, node_gone=node_gone, node_leaving=node_leaving, ours=ours)
    terminated = _terminated(pod)
    labels = pod.metadata.labels or {}
    market = Market.SPOT if labels.get(MARKET_LABEL) == Market.SPOT.value else Market.ON_DEMAND
    exit_code = terminated.exit_code if terminated is not None else None
    ended_at = terminated.finished_at if terminated is not None else None
    if ended_at is None and state in (InstanceState.TERMINATED, InstanceState.PREEMPTED):
        ended_at = pod.metadata.deletion_timestamp
    return Instance(
        id=PodRef(pod.metadata.namespace, pod.metadata.name).id, pool=pool_of(pod),
        market=market, state=state, tags=tags_of(pod),
        exit_code=exit_code if state is InstanceState.EXITED else None,
        launched_at=pod.metadata.creation_timestamp, ended_at=ended_at,
        private_address=(status.pod_ip if status else None) or None,
    )  # fmt: skip


def _state(pod: Any, *, node_gone: bool, node_leaving: bool, ours: bool) -> InstanceState:
    phase = pod.status.phase if pod.status else None
    disrupted = is_disrupted(pod)
    if phase == "Succeeded":
        return InstanceState.EXITED
    if phase == "Failed":
        reason = pod.status.reason or ""
        return InstanceState.PREEMPTED if disrupted or reason in DISRUPTED_REASONS \
            else InstanceState.EXITED
    if node_gone:
        return InstanceState.PREEMPTED
    if pod.metadata.deletion_timestamp is not None:
        return InstanceState.TERMINATED if ours else InstanceState.NOTICE
    if disrupted or node_leaving:
        return InstanceState.NOTICE
    return InstanceState.PENDING if phase == "Pending" else InstanceState.RUNNING


def _terminated(pod: Any) -> Any | None:
    statuses = (pod.status.container_statuses if pod.status else None) or ()
    for s in statuses:
        if s.name == CONTAINER and s.state is not None and s.state.terminated is not None:
            return s.state.terminated
    return None
