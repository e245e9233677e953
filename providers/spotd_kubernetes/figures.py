"""The Kubernetes kind's fixed figures: its name, the node labels and device resources
it reads, and the labels it puts on its pods.

A leaf of the package: it imports none of its siblings, so the descriptor, the settings,
the node reader and the adapter all read these from here.
"""

from __future__ import annotations

from spotd.core.network import Fabric

NAME = "kubernetes"

NOTICE_SECONDS = 30
"""The pods' ``terminationGracePeriodSeconds`` by default: between the SIGTERM of an
eviction or a drain and the SIGKILL (Kubernetes' own default is 30 s)."""

GPU_RESOURCE = "nvidia.com/gpu"
"""The device plugin's resource a GPU node advertises and a pod requests."""

GPU_PRODUCT_LABELS = (
    "nvidia.com/gpu.product",          # NVIDIA GPU feature discovery: NVIDIA-H100-80GB-HBM3
    "cloud.google.com/gke-accelerator",  # GKE: nvidia-h100-80gb
    "k8s.amazonaws.com/accelerator",   # EKS (older AMIs): nvidia-tesla-v100
    "karpenter.k8s.aws/instance-gpu-name",  # Karpenter on AWS: h100
)
"""Node labels naming the GPU model, first found wins."""

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
"""GPU feature discovery: memory per GPU in MiB."""

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CLOUD_PROVIDERS: dict[str, str] = {"aws": "aws", "gce": "gcp", "azure": "azure"}
"""A node's ``spec.providerID`` scheme (``aws:///us-east-1a/i-0abc``) -> the spotd
provider whose offerings price a pool of such nodes (``cloud_providers`` adds to it)."""
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"

POOL_LABELS = (
    "karpenter.sh/nodepool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
)
"""Node labels naming the node pool, after the configured ``pool_label``; a node with
none of them is pooled by its instance type."""

SPOT_LABELS: dict[str, tuple[str, ...]] = {
    "karpenter.sh/capacity-type": ("spot",),
    "cloud.google.com/gke-spot": ("true",),
    "cloud.google.com/gke-preemptible": ("true",),
    "kubernetes.azure.com/scalesetpriority": ("spot",),
    "eks.amazonaws.com/capacityType": ("SPOT",),
}
"""Label -> values that mark a node as spot capacity (plus the configured ``spot_label``)."""

SPOT_TOLERATIONS = (
    ("kubernetes.azure.com/scalesetpriority", "spot"),
    ("cloud.google.com/gke-spot", "true"),
)
"""Taints the clouds put on spot nodes (``key=value:NoSchedule``): spot pods tolerate them."""

FABRIC_RESOURCES: tuple[tuple[str, Fabric], ...] = (
    ("vpc.amazonaws.com/efa", Fabric.EFA),
    ("rdma/", Fabric.INFINIBAND),
    ("nvidia.com/hostdev", Fabric.INFINIBAND),
)
"""Device resources (exact name, or a prefix ending in ``/``) and the fabric they give."""

LEAVING_TAINTS = frozenset({
    "node.kubernetes.io/unschedulable",       # cordoned (kubectl drain)
    "ToBeDeletedByClusterAutoscaler",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "cloud.google.com/impending-node-termination",
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/scheduled-maintenance",
    "node.kubernetes.io/out-of-service",
})  # fmt: skip
"""Taints that say a node is being drained or reclaimed: its pods are under notice."""

# Pod labels and annotations (the tags' own names, ``spotd-job`` and the rest, are
# labels too, with their values made label-safe).
MANAGED_LABEL = "spotd-managed"
"""On every pod spotd creates (value ``true``): the only pods it reads or deletes."""
LAUNCH_LABEL = "spotd-launch"
"""A hash of the launch's client token: a retried launch finds its pods by it."""
RANK_LABEL = "spotd-rank"
MARKET_LABEL = "spotd-market"
TAGS_ANNOTATION = "spotd-tags"
"""The exact tags as JSON (label values are restricted)."""
POOL_ANNOTATION = "spotd-pool"
"""The pool as JSON (region, zone, instance type)."""
CONTAINER = "job"
