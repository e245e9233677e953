"""The Kubernetes adapter (the real ``kubernetes`` client) against the loopback API fake.

The fake cluster (every price is made up): an L4 Karpenter pool with spot and
on-demand nodes, an EKS node group of p5.48xlarge spot nodes with EFA, an on-premises
A100 pool named by a label of the operator's, and a CPU node.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fakes.kubernetes_fake import KubeFake, node

from harnesses import ERROR_KINDS, ErrorKind, FabricSeen
from spotd.core.clock import ManualClock
from spotd.core.values import LaunchRequest, Market, Offering
from spotd_kubernetes import KubernetesProvider, KubernetesSettings

NAMESPACE = "spotd"
EFA = "vpc.amazonaws.com/efa"
L4 = {"karpenter.sh/nodepool": "gpu-l4", "node.kubernetes.io/instance-type": "g6.xlarge",
      "topology.kubernetes.io/zone": "us-east-1a", "topology.kubernetes.io/region": "us-east-1",
      "nvidia.com/gpu.product": "NVIDIA-L4"}  # fmt: skip
P5 = {"eks.amazonaws.com/nodegroup": "p5-spot", "eks.amazonaws.com/capacityType": "SPOT",
      "node.kubernetes.io/instance-type": "p5.48xlarge",
      "topology.kubernetes.io/zone": "us-east-1b", "topology.kubernetes.io/region": "us-east-1",
      "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}  # fmt: skip
DGX = {"example.com/pool": "dgx-a100", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


def cluster() -> list[dict[str, Any]]:
    """The fake cluster's nodes."""
    spot = {"karpenter.sh/capacity-type": "spot"}
    on_demand = {"karpenter.sh/capacity-type": "on-demand"}
    return [
        *(node(f"l4-spot-{i}", {**L4, **spot}, 1) for i in range(2)),
        *(node(f"l4-od-{i}", {**L4, **on_demand}, 1) for i in range(2)),
        *(node(f"p5-{i}", P5, 8, {EFA: 32}) for i in range(5)),
        *(node(f"dgx-{i}", DGX, 8, {"rdma/ib": 1}) for i in range(2)),
        node("cpu-0", {"node.kubernetes.io/instance-type": "m7i.large"}, 0),
    ]


PRICES = {
    "gpu-l4": {"price_per_gpu_hour": 0.80, "spot_price_per_gpu_hour": 0.30},
    "p5-spot": {"spot_price_per_gpu_hour": 2.50},
    "dgx-a100": {"price_per_gpu_hour": 1.10},
}
"""Made-up prices per GPU-hour."""


def bootstrap(request: LaunchRequest) -> str:
    """Stands in for the daemon's boot script renderer."""
    return f"#!/bin/bash\n# spotd agent for {request.tags.get('spotd-job', '?')}\n"


def settings_for(fake: KubeFake, **overrides: object) -> KubernetesSettings:
    values: dict[str, object] = {
        "enabled": True, "api_endpoint": fake.url, "namespace": NAMESPACE,
        "image": "registry.example/train:1", "pool_label": "example.com/pool",
        "pools": PRICES, "request_timeout_seconds": 10.0, "schedule_poll_seconds": 0.01,
    }  # fmt: skip
    values.update(overrides)
    return KubernetesSettings.model_validate(values)


def provider_for(fake: KubeFake, clock: ManualClock | None = None,
                 **overrides: object) -> KubernetesProvider:  # fmt: skip
    kwargs: dict[str, Any] = {} if clock is None else {"clock": clock}
    return KubernetesProvider(settings_for(fake, **overrides), boot_script=bootstrap, **kwargs)


class KubernetesHarness:
    makes_placements = False

    def __init__(self, provider: KubernetesProvider, fake: KubeFake) -> None:
        self.provider = provider
        self.fake = fake

    def launchable(self) -> Offering:
        return next(o for o in self.provider.offerings()
                    if o.gpus_per_node == 1 and o.price(Market.SPOT))  # fmt: skip

    def command(self) -> tuple[str, ...]:
        return ("python", "train.py")

    def supports(self, kind: ErrorKind) -> bool:
        return kind in ERROR_KINDS

    def fail_next_launch(self, kind: ErrorKind) -> None:
        if kind == "capacity":
            self.fake.no_room = 1
        elif kind == "quota":
            self.fake.quotas[NAMESPACE] = [{
                "metadata": {"name": "gpus"},
                "spec": {"hard": {"requests.nvidia.com/gpu": "0"}},
                "status": {"hard": {"requests.nvidia.com/gpu": "0"},
                           "used": {"requests.nvidia.com/gpu": "0"}},
            }]  # fmt: skip
        else:
            code, reason = {"throttle": (429, "TooManyRequests"), "auth": (403, "Forbidden"),
                            "server": (503, "ServiceUnavailable")}[kind]  # fmt: skip
            self.fake.fail_next_create(code, reason)

    def interrupt(self, instance_id: str) -> None:
        self.fake.remove_node(self.fake.pod_of(instance_id)["spec"]["nodeName"])

    def settle(self) -> None:
        time.sleep(0.01)

    def gang_offering(self) -> Offering:
        return next(o for o in self.provider.offerings() if o.pool.instance_type == "p5-spot")

    def fabric_seen(self, instance_ids: Sequence[str]) -> FabricSeen:
        limits = [self.fake.pod_of(i)["spec"]["containers"][0]["resources"]["limits"]
                  for i in instance_ids]  # fmt: skip
        return FabricSeen(frozenset(), tuple(int(lim.get(EFA, 0)) for lim in limits))

    def expected_interfaces(self, instance_type: str) -> int:
        return 32 if instance_type == "p5-spot" else 0

    def launch_in_child(self, request: LaunchRequest, tmp_path: Path) -> subprocess.Popen[bytes]:
        pytest.skip("kubernetes makes no placement objects: nothing is left by a killed launch "
                    "but pods, which the reaper finds by their tags")


@contextmanager
def make_harness(tmp_path: Path) -> Iterator[KubernetesHarness]:
    fake = KubeFake(cluster())
    fake.start()
    try:
        yield KubernetesHarness(provider_for(fake), fake)
    finally:
        fake.stop()
