"""Reading a cluster's GPU node pools from its nodes' labels and allocatable resources.

A pool is the nodes that share a node pool name (the configured ``pool_label``, else
Karpenter's, GKE's, EKS's or AKS's label, else the instance type), a zone, a GPU model
and a GPU count. Its fabric comes from spotd's instance-type tables where the nodes'
instance type is listed, else from their device resources (EFA, RDMA); its nodes are
spot or not by the clouds' capacity labels. Pure: nodes in, pools out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spotd.core.kinds import InstanceShape
from spotd.core.network import Fabric, Interconnect
from spotd.core.values import Market, Pool, PriceLink
from spotd.market.catalog import UNKNOWN_NODE_GBPS, catalog

from .figures import (
    FABRIC_RESOURCES,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABELS,
    GPU_RESOURCE,
    INSTANCE_TYPE_LABEL,
    LEAVING_TAINTS,
    POOL_LABELS,
    REGION_LABEL,
    ZONE_LABEL,
)
from .settings import KubernetesSettings

NO_ZONE = "default"
"""The zone of nodes without a zone label (on-premises clusters)."""

KNOWN_GPUS = ("GB200", "B200", "H200", "H100", "A100", "A10G", "A10", "L40S", "L40", "L4",
              "V100", "T4", "A40", "A30", "RTX6000", "MI300X", "MI250X")  # fmt: skip
"""GPU models spotd names, found as a word of a product label (``NVIDIA-A100-SXM4-80GB``)."""


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What one GPU node says of itself."""

    name: str
    pool_key: str
    pool_name: str
    zone: str
    region: str
    gpu: str
    gpu_label: tuple[str, str] | None
    """The label (and value) that named the GPU model, to pin pods to it."""
    gpus: int
    memory_gb: int
    instance_type: str
    spot: tuple[str, str] | None
    """The label and value that mark it spot; None for a node that is not."""
    fabric: Fabric | None
    fabric_resources: Mapping[str, int]
    zone_labelled: bool
    leaving: bool
    """Cordoned, or tainted by a drain, an autoscaler or a spot interruption handler."""
    cloud: str = ""
    """The scheme of its ``spec.providerID`` (``aws``, ``gce``, ``azure``); "" without one."""


@dataclass(slots=True)
class PoolFacts:
    """One pool: its nodes' shared facts and what a pod needs to land there."""

    key: tuple[str, str, str, str, int]
    first: NodeFacts
    nodes: list[str] = field(default_factory=list)
    spot: tuple[str, str] | None = None
    on_demand: bool = False

    @property
    def name(self) -> str:
        return self.first.pool_name


def node_facts(node: Any, settings: KubernetesSettings) -> NodeFacts | None:
    """The facts of a ``V1Node``; None for a node without GPUs."""
    allocatable: Mapping[str, str] = node.status.allocatable or {} if node.status else {}
    gpus = _count(allocatable.get(GPU_RESOURCE))
    if gpus < 1:
        return None
    labels: Mapping[str, str] = node.metadata.labels or {}
    pool_key, pool_name = _pool_of(labels, settings.pool_label)
    gpu_label = next(((k, labels[k]) for k in GPU_PRODUCT_LABELS if labels.get(k)), None)
    instance_type = labels.get(INSTANCE_TYPE_LABEL, "")
    shape = _shape(instance_type)
    gpu = gpu_model(gpu_label[1]) if gpu_label else (shape.gpu if shape else "GPU")
    resources = {name: _count(value) for name, value in allocatable.items()
                 if _fabric_of(name) is not None and _count(value) > 0}  # fmt: skip
    fabric = next((f for n in resources if (f := _fabric_of(n)) is not None), None)
    return NodeFacts(
        name=node.metadata.name, pool_key=pool_key, pool_name=pool_name,
        zone=labels.get(ZONE_LABEL, NO_ZONE), region=labels.get(REGION_LABEL, ""),
        gpu=gpu, gpu_label=gpu_label, gpus=gpus,
        memory_gb=_memory_gb(labels, shape, gpu), instance_type=instance_type,
        spot=_spot_of(labels, settings), fabric=fabric, fabric_resources=resources,
        zone_labelled=ZONE_LABEL in labels, leaving=is_leaving(node),
        cloud=_scheme(node.spec.provider_id if node.spec else None),
    )  # fmt: skip


def group(nodes: Iterable[NodeFacts]) -> list[PoolFacts]:
    """Nodes by pool; a pool's spot and non-spot nodes are one pool sold in two markets."""
    pools: dict[tuple[str, str, str, str, int], PoolFacts] = {}
    for node in nodes:
        key = (node.pool_key, node.pool_name, node.zone, node.gpu, node.gpus)
        pool = pools.setdefault(key, PoolFacts(key, node))
        pool.nodes.append(node.name)
        if node.spot is not None:
            pool.spot = pool.spot or node.spot
        else:
            pool.on_demand = True
    return sorted(pools.values(), key=lambda p: p.key)


def interconnect_of(pool: PoolFacts, settings: KubernetesSettings) -> Interconnect:
    """The pool's scale-out fabric: the configured figure, the tables', or its devices'."""
    node = pool.first
    configured = settings.pools.get(pool.name)
    shape = _shape(node.instance_type)
    fabric = node.fabric or (shape.interconnect.fabric if shape else Fabric.ETHERNET)
    if configured is not None and configured.gbps_per_node is not None:
        return Interconnect(fabric, configured.gbps_per_node / node.gpus)
    if shape is not None and shape.gpus_per_node == node.gpus:
        return shape.interconnect
    gbps = settings.default_fabric_gbps_per_node if node.fabric else UNKNOWN_NODE_GBPS
    return Interconnect(fabric, gbps / node.gpus)


def price_link(pool: PoolFacts, settings: KubernetesSettings) -> PriceLink | None:
    """Where the markets of a pool with no configured price take it from: the enabled
    provider its nodes' cloud maps to, for their instance type, region and zone. None
    for a pool not on a cloud spotd knows, without a region or instance type label, or
    priced in every market it sells."""
    node = pool.first
    source = settings.cloud_provider(node.cloud)
    if not (source and node.region and node.instance_type):
        return None
    sold = {Market.SPOT} if pool.spot is not None else set()
    sold |= {Market.ON_DEMAND} if pool.on_demand else set()
    configured = settings.pools.get(pool.name)
    markets = frozenset(sold) - (configured.priced_markets() if configured else frozenset())
    if not markets:
        return None
    return PriceLink(Pool(source, node.region, node.zone, node.instance_type), markets)


def gpu_model(product: str) -> str:
    """The GPU model a product label names (``NVIDIA-H100-80GB-HBM3``: ``H100``); the
    label upper-cased when it names none spotd knows."""
    words = set(re.split(r"[-_\s]+", product.upper()))
    return next((m for m in KNOWN_GPUS if m in words), product.upper())


def is_leaving(node: Any) -> bool:
    """Whether a node is cordoned or carries a taint of a drain or a reclaim."""
    spec = node.spec
    if spec is None:
        return False
    if spec.unschedulable:
        return True
    return any(t.key in LEAVING_TAINTS for t in spec.taints or ())


def _pool_of(labels: Mapping[str, str], configured: str) -> tuple[str, str]:
    for key in (configured, *POOL_LABELS):
        if key and labels.get(key):
            return key, labels[key]
    return INSTANCE_TYPE_LABEL, labels.get(INSTANCE_TYPE_LABEL, "gpu-nodes")


def _spot_of(labels: Mapping[str, str], settings: KubernetesSettings) -> tuple[str, str] | None:
    for key, values in settings.spot_labels().items():
        if labels.get(key) in values:
            return key, labels[key]
    return None


def _shape(instance_type: str) -> InstanceShape | None:
    if not instance_type:
        return None
    for table in catalog().values():
        if instance_type in table:
            return table[instance_type]
    return None


def _memory_gb(labels: Mapping[str, str], shape: InstanceShape | None, gpu: str) -> int:
    mib = _count(labels.get(GPU_MEMORY_LABEL))
    if mib > 0:
        return round(mib / 1024)
    if shape is not None:
        return shape.gpu_memory_gb
    known = [s.gpu_memory_gb for t in catalog().values() for s in t.values() if s.gpu == gpu]
    return max(known, default=0)


def _fabric_of(resource: str) -> Fabric | None:
    for name, fabric in FABRIC_RESOURCES:
        if resource == name or (name.endswith("/") and resource.startswith(name)):
            return fabric
    return None


def _scheme(provider_id: str | None) -> str:
    """``aws`` of ``aws:///us-east-1a/i-0abc``; "" for no providerID or one without a scheme."""
    scheme, found, _ = (provider_id or "").partition("://")
    return scheme.lower() if found else ""


def _count(value: str | None) -> int:
    """A whole count of an allocatable or a label (``8``); 0 for anything else."""
    try:
        return int(value or 0)
    except ValueError:
        return 0
