"""Machine types of the zones: which are GPU types, and what they are billed for."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.cloud import compute_v1

from spotd.core.kinds import InstanceShape
from spotd.market import catalog

from .figures import INSTANCE_TYPES, NAME
from .settings import GcpAttachedGpu

log = logging.getLogger(__name__)

ACCELERATORS: dict[str, tuple[str, int]] = {
    "nvidia-tesla-a100": ("A100", 40),
    "nvidia-a100-80gb": ("A100", 80),
    "nvidia-h100-80gb": ("H100", 80),
    "nvidia-h100-mega-80gb": ("H100", 80),
    "nvidia-h200-141gb": ("H200", 141),
    "nvidia-b200": ("B200", 180),
    "nvidia-l4": ("L4", 24),
    "nvidia-tesla-v100": ("V100", 16),
    "nvidia-tesla-t4": ("T4", 16),
}
"""GCE accelerator type -> (spotd GPU name, GB of memory per GPU)."""


HYPERDISK_ONLY: dict[str, str] = {
    "a3-ultragpu": "A3 Ultra",
    "a4-highgpu": "A4",
    "a4x-highgpu": "A4X",
    "a4x-maxgpu": "A4X Max",
}
"""Machine families (the type's name before its size) that take Hyperdisk only, no
Persistent Disk, by series: Compute Engine's "Accelerator-optimized machine family"
page, supported disk types per series (read 2026-12-04). The other GPU families
(A3 Mega, A3 High, A2, G2, N1) take Persistent Disk as well."""

HYPERDISK_BOOT = "hyperdisk-balanced"
"""The boot disk of a Hyperdisk-only family when the configured type is a Persistent Disk."""


def hyperdisk_only(machine_type: str) -> str | None:
    """The series name of a Hyperdisk-only machine type (``A3 Ultra``), else None."""
    for family, series in HYPERDISK_ONLY.items():
        if machine_type.startswith(f"{family}-"):
            return series
    return None


def boot_disk_type(machine_type: str, configured: str) -> str:
    """The boot disk type of ``machine_type``: ``configured`` (``boot_disk_type``), except
    that a Hyperdisk-only family gets ``hyperdisk-balanced`` for a Persistent Disk type,
    which Compute Engine would refuse there."""
    if hyperdisk_only(machine_type) and not configured.startswith("hyperdisk-"):
        return HYPERDISK_BOOT
    return configured


@dataclass(frozen=True, slots=True)
class MachineType:
    """A GPU machine type as Compute Engine lists it: its accelerator, and what it is
    billed for (GCP prices a VM by its parts: GPUs, vCPUs, memory)."""

    name: str
    accelerator: str
    gpus: int
    vcpus: int
    memory_gib: float

    @property
    def family(self) -> str:
        """The billing family: ``a2-highgpu-8g`` -> ``A2``."""
        return self.name.split("-", 1)[0].upper()

    @property
    def gpu(self) -> str:
        """spotd's GPU name (``A100``), or the accelerator type when unknown."""
        return ACCELERATORS.get(self.accelerator, (self.accelerator, 0))[0]

    @property
    def shape(self) -> InstanceShape:
        """Its shape as spotd names it on every provider."""
        fabric = catalog.interconnect(NAME, self.name, self.gpus)
        return InstanceShape(self.gpu, self.gpus, self.gpu_memory_gb, fabric)

    @property
    def gpu_memory_gb(self) -> int:
        """GB per GPU: the interconnect table's figure, else the accelerator's."""
        known = INSTANCE_TYPES.get(self.name)
        if known is not None:
            return known.gpu_memory_gb
        return ACCELERATORS.get(self.accelerator, ("", 0))[1]


def shape_of(
    machine_type: Any, attached: Mapping[str, GcpAttachedGpu] | None = None
) -> MachineType | None:
    """The shape of a ``compute_v1.MachineType``; None when it has no GPUs.

    A type that lists no built-in accelerators has GPUs only when ``attached``
    (the ``attached_gpus`` setting) names them: the launch then attaches them.
    """
    accelerators = list(machine_type.accelerators)
    if accelerators:
        kind = str(accelerators[0].guest_accelerator_type)
        count = int(accelerators[0].guest_accelerator_count)
    elif attached and machine_type.name in attached:
        kind, count = attached[machine_type.name].accelerator, attached[machine_type.name].count
    else:
        return None
    return MachineType(
        name=machine_type.name,
        accelerator=kind,
        gpus=count,
        vcpus=int(machine_type.guest_cpus),
        memory_gib=int(machine_type.memory_mb) / 1024,
    )


def wanted_types(
    configured: list[str] | None, attached: Mapping[str, GcpAttachedGpu] | None = None
) -> frozenset[str]:
    """The machine types to offer: the configured ones, else the interconnect table's
    plus those with attached GPUs."""
    if configured is not None:
        return frozenset(configured)
    return frozenset(INSTANCE_TYPES) | frozenset(attached or {})


def list_request(project: str, zone: str) -> compute_v1.ListMachineTypesRequest:
    """The per-zone machine types call (paged by the SDK's pager)."""
    return compute_v1.ListMachineTypesRequest(project=project, zone=zone)
