"""Performance and price facts the policies weigh, with their sources.

Kept out of the policies so every figure has one home and one citation.
Where a figure is an assumption rather than a measurement, it says so. The
figures of each kind of provider (egress, notice, billing) live in its
descriptor (:mod:`spotd.core.kinds`); the functions here look them up by provider.
"""

from __future__ import annotations

from collections.abc import Mapping

from spotd.core.network import Fabric

FABRIC_EFFICIENCY: Mapping[Fabric, float] = {
    # Share of peak all-reduce throughput a multi-node run reaches on the fabric
    # (practitioner figures of 2026, shared/guides/domain.md): InfiniBand NDR
    # 85-92 %, tuned RoCEv2 75-85 %, plain Ethernet "do not use" (0.01 % loss
    # cuts all-reduce 4-6x). EFA and GPUDirect-TCPX/TCPXO have no figure there:
    # assumed like tuned RoCE (TCPX a notch lower: it runs over TCP).
    Fabric.INFINIBAND: 0.88,
    Fabric.ROCE: 0.80,
    Fabric.EFA: 0.80,
    Fabric.TCPXO: 0.80,
    Fabric.TCPX: 0.75,
    Fabric.ETHERNET: 0.25,
}
"""Multi-node training efficiency by scale-out fabric (a one-node run needs none)."""

REFERENCE_FABRIC_EFFICIENCY = FABRIC_EFFICIENCY[Fabric.INFINIBAND]
"""The efficiency a job's ``compute_hours`` is taken to be measured at."""

GPU_SPEED: Mapping[str, float] = {
    # Training throughput relative to H100 SXM, dense BF16/FP16 tensor peak as a
    # proxy (vendor datasheets: H100 SXM ~990 TFLOPS, H200 same compute with more
    # memory bandwidth, B200 ~2.2 PFLOPS, B300 a little more, A100 312, L40S 362 (no NVLink: a
    # notch lower in practice), A10G 125, L4 121, V100 125). Rough: it only
    # matters when a job accepts several GPU models.
    "B300": 2.3,
    "B200": 2.2,
    "H200": 1.1,
    "H100": 1.0,
    "H100-NVL": 0.9,
    "A100": 0.32,
    "L40S": 0.3,
    "A10G": 0.12,
    "L4": 0.12,
    "V100": 0.12,
}
"""Relative training speed per GPU model; unknown models count as 0.1."""

UNKNOWN_GPU_SPEED = 0.1

TRANSFER_GBPS = 5.0
"""Assumed sustained throughput of a checkpoint copy between regions or providers."""

CHECKPOINT_WRITE_GBPS = 8.0
"""Assumed write throughput of a checkpoint to its store (1 GB/s), for Young's formula."""

NOTICE_REACTION_SECONDS = 10.0
"""Time from the notice to the job starting its checkpoint: the agent's poll (AWS 5 s)
plus the job reaching a step boundary."""

DEFAULT_PREEMPTIONS_PER_HOUR = 0.2
"""Prior rate when a pool has no history: GPU spot is reclaimed every 4-6 h in busy pools."""


def gpu_speed(gpu: str) -> float:
    """Relative training speed of a GPU model (H100 = 1)."""
    return GPU_SPEED.get(gpu.upper(), GPU_SPEED.get(gpu, UNKNOWN_GPU_SPEED))
