"""The network interfaces of a VM: nic0, plus the GPU NICs of the A3 and A4 layouts.

Google's documented layouts (``compute/docs/gpus/gpu-network-bandwidth`` and
the GPUDirect pages):

- ``a3-highgpu-8g`` (GPUDirect-TCPX): nic0 plus 4 gVNIC GPU NICs, each on a
  VPC network and subnet of its own.
- ``a3-megagpu-8g`` (GPUDirect-TCPXO): nic0 plus 8 gVNIC GPU NICs, each on a
  VPC network and subnet of its own.
- ``a3-ultragpu-8g`` and ``a4-highgpu-8g`` (GPUDirect RDMA over RoCE): two
  gVNIC NICs on two ordinary VPC networks, plus 8 ``MRDMA`` NICs on one RoCE
  VPC network (a VPC with the zone's RDMA network profile), one subnet each.

spotd never creates networks: they are named in ``[providers.gcp] gpu_networks``.
A gang of such a type whose networks are missing is refused rather than
launched on nic0 alone, where NCCL would fall back to plain TCP.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from google.cloud import compute_v1

from spotd.core.errors import InvalidRequestError

from .errors import PROVIDER
from .settings import GcpGpuSubnet, GcpSettings, region_of

GVNIC = "GVNIC"
MRDMA = "MRDMA"


@dataclass(frozen=True, slots=True)
class GcpNicLayout:
    """The GPU NICs a machine type needs besides nic0, and the fabric they carry."""

    gvnic: int
    """gVNIC NICs after nic0 (taken from ``gpu_networks.<where>.gvnic`` in order)."""
    rdma: int
    """MRDMA NICs on a RoCE VPC (taken from ``gpu_networks.<where>.rdma``)."""
    fabric: str

    @property
    def fabric_nics(self) -> int:
        """How many of the NICs carry the GPU-to-GPU traffic."""
        return self.rdma or self.gvnic


LAYOUTS: dict[str, GcpNicLayout] = {
    "a3-highgpu-8g": GcpNicLayout(gvnic=4, rdma=0, fabric="GPUDirect-TCPX"),
    "a3-megagpu-8g": GcpNicLayout(gvnic=8, rdma=0, fabric="GPUDirect-TCPXO"),
    "a3-ultragpu-8g": GcpNicLayout(gvnic=1, rdma=8, fabric="RoCE"),
    "a4-highgpu-8g": GcpNicLayout(gvnic=1, rdma=8, fabric="RoCE"),
}
"""Machine types whose multi-node fabric needs GPU NICs."""

_SUBNET = re.compile(r"(?:.*/)?(?:projects/([^/]+)/)?regions/([^/]+)/subnetworks/([^/]+)$")


def layout_of(machine_type: str) -> GcpNicLayout | None:
    """The GPU NIC layout of a machine type; None when it needs none."""
    return LAYOUTS.get(machine_type)


def needs_gvnic(machine_type: str) -> bool:
    """Whether nic0 must be a gVNIC (every A3 and A4 type)."""
    return machine_type.startswith(("a3-", "a4-"))


def gpu_subnets(settings: GcpSettings, zone: str, layout: GcpNicLayout) -> list[
    tuple[str, GcpGpuSubnet]
]:
    """``(nic_type, subnet)`` of each GPU NIC of ``layout`` in ``zone``, in NIC order.

    Raises InvalidRequestError naming the setting when too few are configured.
    """
    networks = settings.gpu_networks_of(zone)
    gvnic = networks.gvnic if networks else []
    rdma = networks.rdma if networks else []
    missing = []
    if len(gvnic) < layout.gvnic:
        missing.append(f"{layout.gvnic} gvnic (found {len(gvnic)})")
    if len(rdma) < layout.rdma:
        missing.append(f"{layout.rdma} rdma (found {len(rdma)})")
    if missing:
        raise InvalidRequestError(
            f"gcp: a {layout.fabric} gang in {zone} needs GPU networks in "
            f"[providers.gcp.gpu_networks.{region_of(zone)}] (or .{zone}): "
            f"{' and '.join(missing)} entries of {{network, subnetwork}}; "
            "without them the gang would talk over plain Ethernet",
            provider=PROVIDER, code="GpuNetworksMissing",
        )  # fmt: skip
    return [(GVNIC, s) for s in gvnic[: layout.gvnic]] + [(MRDMA, s) for s in rdma[: layout.rdma]]


def subnet_path(subnet: str, project: str, region: str) -> tuple[str, str, str]:
    """``(project, region, name)`` of a configured subnetwork (name, partial or full URL)."""
    match = _SUBNET.match(subnet)
    if match is None:
        return project, region, subnet.rsplit("/", 1)[-1]
    return match.group(1) or project, match.group(2), match.group(3)


def network_interfaces(
    settings: GcpSettings, zone: str, machine_type: str, gang: bool
) -> list[compute_v1.NetworkInterface]:
    """nic0, then, for a gang of a layout type, its GPU NICs (no external address)."""
    access = (
        [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        if settings.external_ip
        else []
    )
    nic0 = compute_v1.NetworkInterface(network=settings.network, access_configs=access)
    if needs_gvnic(machine_type):
        nic0.nic_type = GVNIC  # the A3/A4 NICs are gVNIC only: VirtIO is refused
    nics = [nic0]
    layout = layout_of(machine_type)
    if gang and layout is not None:
        region = region_of(zone)
        for nic_type, subnet in gpu_subnets(settings, zone, layout):
            project, where, name = subnet_path(subnet.subnetwork, "", region)
            path = f"regions/{where}/subnetworks/{name}"
            nics.append(compute_v1.NetworkInterface(
                network=subnet.network,
                subnetwork=f"projects/{project}/{path}" if project else path,
                nic_type=nic_type,
            ))  # fmt: skip
    return nics
