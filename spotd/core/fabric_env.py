"""The NCCL and libfabric environment of a multi-node job, per scale-out fabric.

One table (:data:`PROFILES`), one profile per :class:`~spotd.core.network.Fabric`:
the variables a gang on that fabric gets (each with its source), the share of
the per-GPU line rate its preflight all-reduce must reach, and the documents
the profile follows. :func:`fabric_environment` merges a job's
``[fabric_env.<fabric>]`` overrides over it; :func:`default_min_busbw_gbps` is
the preflight's bus bandwidth floor when the job sets none.

Which instance type has which fabric is :mod:`spotd.market.catalog`'s table; the
catalog's fabrics map to these offerings: InfiniBand = Azure ND A100 v4 (HDR)
and ND H100/H200 v5 (NDR); EFA = AWS p3dn, p4d/p4de, p5/p5e/p5en, p6, and the
48xlarge G5/G6/G6e; RoCE = GCP A3 Ultra and A4 (GPU RDMA over RoCE); TCPX = GCP
A3 High; TCPXO = GCP A3 Mega; Ethernet = everything else.

Sources (documents by title, checked against the current versions):

- [NCCL-ENV] NVIDIA NCCL User Guide, "Environment Variables": the meaning,
  syntax and defaults of every ``NCCL_*`` variable here (``NCCL_SOCKET_IFNAME``
  and ``NCCL_IB_HCA`` prefix lists with ``^`` exclusion and ``=`` exact match;
  ``NCCL_IB_TIMEOUT`` = 4.096 us x 2^value, default 20 in current releases;
  ``NCCL_IB_RETRY_CNT`` default 7; ``NCCL_IB_GID_INDEX`` default -1, auto
  selection since 2.21; ``NCCL_IB_TC``; ``NCCL_CROSS_NIC``; its warning that
  debugging variables kept in scripts lead to sub-optimal behaviour or hangs).
  Values set in the environment win over ``/etc/nccl.conf``.
- [AWS-EFA-NCCL] AWS EC2 User Guide, "Get started with EFA and NCCL" (the
  NCCL test run's ``FI_PROVIDER=efa`` and ``FI_EFA_USE_DEVICE_RDMA=1`` "for
  p4d and p5"), and "Elastic Fabric Adapter for AI/ML and HPC workloads on
  Amazon EC2" (RDMA read on Nitro v4 and later, and on p4d).
- [FI-EFA] libfabric man page fi_efa(7), runtime parameters
  ``FI_EFA_USE_DEVICE_RDMA`` (1 requires RDMA and aborts where the device has
  none; unset uses it where the device reports it) and ``FI_EFA_FORK_SAFE``;
  fi_fabric(7) for ``FI_PROVIDER``.
- [GCP-TCPX] Google Cloud, "Maximize GPU network bandwidth with GPUDirect-TCPX
  and multi-networking" (GKE) and the A3 High GPUDirect-TCPX VM and Cluster
  Toolkit guides: the NCCL variables of the ``GPUDirectTCPX_v7`` plugin, the
  control NIC eth0 and the four GPU NICs eth1-eth4, the receive-datapath
  manager's socket under ``/run/tcpx``.
- [GCP-TCPXO] Google Cloud, "Maximize GPU network bandwidth in Standard mode
  clusters" (GPUDirect-TCPXO, A3 Mega) and the TCPXO plugin's
  ``nccl-env-profile-simple.sh`` (GoogleCloudPlatform/container-engine-
  accelerators, "Best practice to run workload with GPUDirect-TCPX(O)"): the
  FasTrak plugin's ``NCCL_FASTRAK_*`` variables, eth0 + eth1-eth8.
- [GCP-GIB] Google Cloud AI Hypercomputer, "Run NCCL on ... A3 Ultra / A4"
  and the gIB plugin's ``set_nccl_env.sh``: ``NCCL_IB_GID_INDEX=3``,
  ``NCCL_IB_TC=52``, ``NCCL_IB_FIFO_TC=84``, ``NCCL_CROSS_NIC=0``.
- [AZURE-IB] Microsoft Learn, "Enable InfiniBand on HPC VMs" and the ND A100 v4
  / ND H100 v5 size pages, with the Azure HPC images (Azure/azhpc-images, the
  ``microsoft-dsvm:ubuntu-hpc`` default of ``providers.azure.image``): the
  InfiniBand HCAs are ``mlx5_ib0``..``mlx5_ib7``, the Accelerated Networking
  NIC is ``mlx5_an0`` with an Ethernet link layer, the management NIC is eth0,
  and the image's ``/etc/nccl.conf`` already names the size's NCCL topology
  file.
- [GUIDE] The project's domain guide and the article it started from:
  ``NCCL_IB_TIMEOUT=22`` and ``NCCL_IB_RETRY_CNT=7``; "H100 with NDR400 should
  exceed 45 GB/s bus bandwidth; under 20 GB/s the network or NCCL is wrong";
  observed bus bandwidth as a share of line rate: InfiniBand NDR 85-92 %, RoCE
  tuned 75-85 %; plain Ethernet is not for multi-node training (0.01 % packet
  loss cuts all-reduce 4-6x).

Decisions:

- **Per fabric, one per-type exception.** ``FI_EFA_USE_DEVICE_RDMA=1`` only
  where AWS documents RDMA read (p4d/p4de, p5/p5e/p5en, p6): set elsewhere
  (p3dn, G5) libfabric aborts the job. Other EFA types leave it unset, which
  libfabric resolves per device, so a type AWS adds later is never broken by
  the table. It is a family-keyed row of the EFA profile, applied when the
  caller passes ``instance_type``.
- **One node gets only the job's own overrides**: nothing crosses a scale-out
  fabric (NVLink inside the node), and a plugin variable such as
  ``NCCL_NET=GPUDirectTCPX_v7`` would make a single-node NCCL fail to start
  where the plugin's daemon is not running.
- **Plugins are named** (``NCCL_NET``) on TCPX and TCPXO: NCCL then fails to
  start when the plugin is missing instead of falling back silently to TCP
  sockets on the control NIC, a 3.5x (A3 High) to over 10x (A3 Mega) loss.
- **Interface names are those GCP documents for GKE and Container-Optimized
  OS** (eth0..eth8). Images with predictable names (Ubuntu, Debian, Rocky on
  GCE) call them enp0s12, enp6s0, ...: such a job sets
  ``[fabric_env.tcpx]``/``[fabric_env.tcpxo]`` to its names.
- **Not in the defaults**: ``NCCL_ALGO``, ``NCCL_PROTO`` and
  ``NCCL_NET_GDR_LEVEL`` on InfiniBand, EFA and RoCE. NCCL's tuning model picks
  algorithm and protocol per message size and topology, and the GPUDirect
  distance from the topology, better than one fixed value
  (``NCCL_NET_GDR_LEVEL=5`` = SYS would use GPUDirect across the CPU
  interconnect, slower than staging); the aws-ofi-nccl plugin sets EFA's
  protocol defaults itself. They stay only where the plugin's vendor requires
  them (GCP TCPX/TCPXO). A job adds any of them through its overrides.
  ``NCCL_TOPO_FILE`` is left to the image (its path differs per VM size), and
  so are the TCPX CPU bindings and GCP's tuner-plugin configuration paths
  (they depend on where the image installed the plugin).

Preflight threshold: the preflight holds an NCCL all-reduce over the gang's
GPUs (2+ nodes) to a bus bandwidth (nccl-tests' definition, GB/s). The floor
is a share of the per-GPU line rate, ``share * gbps_per_gpu / 8``, with the
share at the low end of what healthy fabrics of that kind show, so a sound
gang is never relaunched for being ordinary. InfiniBand 0.85 ([GUIDE], NDR
85-92 %): NDR400 gives 42.5 GB/s, just under the guide's "should exceed 45";
HDR200 gives 21.25. RoCE 0.75 ([GUIDE], tuned 75-85 %). EFA 0.75: SRD is an
Ethernet RDMA transport, the guide's RoCE share is the nearest figure.
TCPX/TCPXO 0.6: GPUDirect over TCP, lower than RDMA; GCP publishes no
figure. Ethernet None: a socket all-reduce's figure depends on the TCP stack
and on loss, there is no share a sound gang reliably reaches, and the policy
already prices such a run as slow; a job that wants a floor sets
``preflight.min_busbw_gbps``. With one NIC rail per GPU, an all-GPU all-reduce
over nodes approaches the node's aggregate rate, so these per-GPU floors are a
lower bound: they catch a broken path (NCCL on the management NIC of an
InfiniBand or EFA node), not a merely slow one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from spotd.core.network import Fabric, Interconnect

NCCL_ENV = 'NVIDIA NCCL User Guide, "Environment Variables"'
AWS_EFA_NCCL = 'AWS EC2 User Guide, "Get started with EFA and NCCL"'
AWS_EFA = 'AWS EC2 User Guide, "Elastic Fabric Adapter for AI/ML and HPC workloads on Amazon EC2"'
FI_EFA = "libfabric fi_efa(7) and fi_fabric(7) man pages"
GCP_TCPX = 'Google Cloud, "Maximize GPU network bandwidth with GPUDirect-TCPX and multi-networking"'
GCP_TCPXO = (
    'Google Cloud, "Maximize GPU network bandwidth in Standard mode clusters" '
    "(GPUDirect-TCPXO) and the TCPXO plugin's nccl-env-profile-simple.sh"
)
GCP_GIB = "Google Cloud AI Hypercomputer, NCCL/gIB plugin set_nccl_env.sh (A3 Ultra, A4)"
AZURE_IB = (
    'Microsoft Learn, "Enable InfiniBand on HPC VMs", ND-series size pages, '
    "Azure HPC images (azhpc-images)"
)
GUIDE = "spotd domain guide (and the article it started from)"

BITS_PER_BYTE = 8


@dataclass(frozen=True, slots=True)
class Setting:
    """One variable of a profile, with where its value comes from and why."""

    name: str
    value: str
    source: str


@dataclass(frozen=True, slots=True)
class FabricProfile:
    """What a gang on one fabric gets: its variables, its preflight share, its sources.

    ``by_family`` holds the few variables that depend on the instance type,
    keyed by family (the type's name before its first ``.``: ``p5``, ``p4de``,
    ``p6-b200``). Tuples throughout, so a profile is immutable and hashable.
    """

    fabric: Fabric
    settings: tuple[Setting, ...]
    busbw_share: float | None
    """Share of the per-GPU line rate the preflight all-reduce must reach; None: no floor."""
    sources: tuple[str, ...]
    by_family: tuple[tuple[str, tuple[Setting, ...]], ...] = ()
    note: str = ""

    @property
    def env(self) -> Mapping[str, str]:
        """The fabric's variables, for any instance type of it (read-only)."""
        return MappingProxyType({s.name: s.value for s in self.settings})

    def env_for(self, instance_type: str | None = None) -> dict[str, str]:
        """The variables for one instance type: the fabric's, plus its family's row."""
        env = {s.name: s.value for s in self.settings}
        if instance_type is not None:
            family = instance_family(instance_type)
            for key, extra in self.by_family:
                if key == family:
                    env.update((s.name, s.value) for s in extra)
        return env

    def min_busbw_gbps(self, gbps_per_gpu: float) -> float | None:
        """The preflight floor in GB/s for a fabric of ``gbps_per_gpu`` Gbit/s per GPU."""
        if self.busbw_share is None or gbps_per_gpu <= 0:
            return None
        return round(self.busbw_share * gbps_per_gpu / BITS_PER_BYTE, 2)


def instance_family(instance_type: str) -> str:
    """The family part of an instance type: ``p5`` for ``p5.48xlarge``, the whole name if none."""
    return instance_type.split(".", 1)[0]


def _s(name: str, value: str, source: str) -> Setting:
    return Setting(name, value, source)


# IB and RoCE share the verbs transport's transport-level retry settings.
_IB_RETRY = (
    # 4.096 us * 2^22 = ~17 s before a retry: long enough to ride out a link
    # flap or a congested spine on shared cloud fabric (NCCL's default 20 is ~4 s).
    _s("NCCL_IB_TIMEOUT", "22", f"{GUIDE}; {NCCL_ENV}"),
    # 7 is NCCL's default and the largest the 3-bit verbs field holds; pinned so
    # an image's /etc/nccl.conf cannot lower it (the environment wins over it).
    _s("NCCL_IB_RETRY_CNT", "7", f"{GUIDE}; {NCCL_ENV}"),
)

_GCP_CHUNKS = (
    _s("NCCL_DYNAMIC_CHUNK_SIZE", "524288", "GCP TCPX/TCPXO guides"),
    _s("NCCL_P2P_NET_CHUNKSIZE", "524288", "GCP TCPX/TCPXO guides"),
    _s("NCCL_P2P_PCI_CHUNKSIZE", "524288", "GCP TCPX/TCPXO guides"),
    _s("NCCL_P2P_NVL_CHUNKSIZE", "1048576", "GCP TCPX/TCPXO guides"),
)

_EFA_RDMA_READ = (_s("FI_EFA_USE_DEVICE_RDMA", "1", f"{AWS_EFA_NCCL}; {AWS_EFA}; {FI_EFA}"),)
# Families AWS documents with EFA RDMA read. Elsewhere the variable stays unset:
# libfabric then uses RDMA where the device reports it, and never aborts.
_EFA_RDMA_FAMILIES = ("p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300")

_PROFILES: dict[Fabric, FabricProfile] = {
    Fabric.INFINIBAND: FabricProfile(
        fabric=Fabric.INFINIBAND,
        settings=(
            *_IB_RETRY,
            # Prefix match: the IB rails mlx5_ib0..7, not the Accelerated Networking
            # NIC mlx5_an0 (Ethernet link layer), which a bare "mlx5" would let in.
            _s("NCCL_IB_HCA", "mlx5_ib", f"{AZURE_IB}; {NCCL_ENV}"),
            # Bootstrap on the management NIC; NCCL would otherwise prefer ib*
            # (IPoIB) interfaces, which the images do not always configure.
            _s("NCCL_SOCKET_IFNAME", "eth0", f"{AZURE_IB}; {NCCL_ENV}"),
        ),
        busbw_share=0.85,
        sources=(GUIDE, NCCL_ENV, AZURE_IB),
        note="Azure ND sizes; the HPC image's /etc/nccl.conf names the topology file.",
    ),
    Fabric.ROCE: FabricProfile(
        fabric=Fabric.ROCE,
        settings=(
            # RoCEv2 over IPv4 is GID 3 on mlx5 images; NCCL >= 2.21 finds it itself
            # (an override of "" hands the choice back), older NCCL took GID 0 (RoCEv1).
            _s("NCCL_IB_GID_INDEX", "3", f"{GCP_GIB}; {NCCL_ENV}"),
            # The traffic classes the fabric's QoS gives lossless treatment to.
            _s("NCCL_IB_TC", "52", f"{GCP_GIB}; {NCCL_ENV}"),
            _s("NCCL_IB_FIFO_TC", "84", f"{GCP_GIB}; {NCCL_ENV}"),
            *_IB_RETRY,
            # Rail-aligned: each GPU NIC sits in its own subnet; rings must not cross.
            _s("NCCL_CROSS_NIC", "0", f"{GCP_GIB}; {NCCL_ENV}"),
        ),
        busbw_share=0.75,
        sources=(GUIDE, NCCL_ENV, GCP_GIB),
        note="GCP A3 Ultra / A4; GCP's gIB plugin also wants NCCL_NET=gIB (add it per job).",
    ),
    Fabric.EFA: FabricProfile(
        fabric=Fabric.EFA,
        settings=(
            # Only the EFA provider: no EFA device is a start-up error, not TCP.
            _s("FI_PROVIDER", "efa", f"{AWS_EFA_NCCL}; {FI_EFA}"),
            # Data loaders fork after NCCL registered memory; kernels without
            # copy-on-fork for pinned pages (before 5.13) need it, others lose nothing.
            _s("FI_EFA_FORK_SAFE", "1", f"{FI_EFA}; {GUIDE}"),
        ),
        busbw_share=0.75,
        sources=(AWS_EFA_NCCL, AWS_EFA, FI_EFA, GUIDE),
        by_family=tuple((family, _EFA_RDMA_READ) for family in _EFA_RDMA_FAMILIES),
        note="FI_EFA_USE_DEVICE_RDMA=1 only on the families with RDMA read (pass instance_type).",
    ),
    Fabric.TCPX: FabricProfile(
        fabric=Fabric.TCPX,
        settings=(
            _s("NCCL_NET", "GPUDirectTCPX_v7", GCP_TCPX),
            _s("NCCL_SOCKET_IFNAME", "eth0", GCP_TCPX),
            _s("NCCL_GPUDIRECTTCPX_CTRL_DEV", "eth0", GCP_TCPX),
            _s("NCCL_GPUDIRECTTCPX_SOCKET_IFNAME", "eth1,eth2,eth3,eth4", GCP_TCPX),
            # Where the receive-datapath manager (tcpgpudmarxd) listens.
            _s("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX", "/run/tcpx", GCP_TCPX),
            _s("NCCL_GPUDIRECTTCPX_FORCE_ACK", "0", GCP_TCPX),
            _s("NCCL_GPUDIRECTTCPX_TX_COMPLETION_NANOSLEEP", "1000", GCP_TCPX),
            _s("NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS", "1000000", GCP_TCPX),
            _s("NCCL_CROSS_NIC", "0", GCP_TCPX),
            # Required by the plugin, unlike on RDMA fabrics (see the module doc).
            _s("NCCL_ALGO", "Ring", GCP_TCPX),
            _s("NCCL_PROTO", "Simple", GCP_TCPX),
            _s("NCCL_NSOCKS_PERTHREAD", "4", GCP_TCPX),
            _s("NCCL_SOCKET_NTHREADS", "1", GCP_TCPX),
            _s("NCCL_NET_GDR_LEVEL", "PIX", GCP_TCPX),
            _s("NCCL_P2P_PXN_LEVEL", "0", GCP_TCPX),
            *_GCP_CHUNKS,
        ),
        busbw_share=0.6,
        sources=(GCP_TCPX, NCCL_ENV),
        note="GCP A3 High: 4 GPU NICs in their own VPCs and the rxdm daemon on each node.",
    ),
    Fabric.TCPXO: FabricProfile(
        fabric=Fabric.TCPXO,
        settings=(
            _s("NCCL_NET", "FasTrak", GCP_TCPXO),
            _s("NCCL_SOCKET_IFNAME", "eth0", GCP_TCPXO),
            _s("NCCL_FASTRAK_CTRL_DEV", "eth0", GCP_TCPXO),
            _s("NCCL_FASTRAK_IFNAME", "eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8", GCP_TCPXO),
            _s("NCCL_FASTRAK_NUM_FLOWS", "2", GCP_TCPXO),
            _s("NCCL_FASTRAK_USE_SNAP", "1", GCP_TCPXO),
            _s("NCCL_FASTRAK_ENABLE_CONTROL_CHANNEL", "0", GCP_TCPXO),
            _s("NCCL_FASTRAK_USE_LLCM", "1", GCP_TCPXO),
            _s("NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY", "/dev/aperture_devices", GCP_TCPXO),
            _s("NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS", "600000", GCP_TCPXO),
            _s("NCCL_FASTRAK_ENABLE_HOTPATH_LOGGING", "0", GCP_TCPXO),
            _s("NCCL_CROSS_NIC", "0", GCP_TCPXO),
            # The plugin's "simple" profile: it needs no tuner configuration file,
            # whose path depends on where the image installed the plugin.
            _s("NCCL_ALGO", "Ring,Tree", GCP_TCPXO),
            _s("NCCL_PROTO", "Simple", GCP_TCPXO),
            _s("NCCL_NVLS_ENABLE", "0", GCP_TCPXO),
            _s("NCCL_MIN_NCHANNELS", "4", GCP_TCPXO),
            _s("NCCL_BUFFSIZE", "8388608", GCP_TCPXO),
            _s("NCCL_NET_GDR_LEVEL", "PIX", GCP_TCPXO),
            *_GCP_CHUNKS,
        ),
        busbw_share=0.6,
        sources=(GCP_TCPXO, NCCL_ENV),
        note="GCP A3 Mega: 8 GPU NICs in their own VPCs and the TCPXO daemon on each node.",
    ),
    Fabric.ETHERNET: FabricProfile(
        fabric=Fabric.ETHERNET,
        settings=(
            # Explicit, so NCCL never falls back to loopback or a Docker bridge.
            _s("NCCL_SOCKET_IFNAME", "^lo,docker", NCCL_ENV),
            # The only verbs device on these types is an accelerated-networking VF
            # (Azure's mlx5_an0) that carries no RDMA between VMs: sockets only.
            _s("NCCL_IB_DISABLE", "1", f"{NCCL_ENV}; {AZURE_IB}"),
        ),
        busbw_share=None,
        sources=(NCCL_ENV, GUIDE),
        note="Not for multi-node training: 0.01 % packet loss cuts all-reduce 4-6x.",
    ),
}

PROFILES: Mapping[Fabric, FabricProfile] = MappingProxyType(_PROFILES)
"""Every fabric's profile (read-only)."""

_missing = set(Fabric) - set(_PROFILES)
if _missing:  # a Fabric added to the domain without a profile is a bug here
    raise RuntimeError(f"no fabric profile for {sorted(_missing)}")


def fabric_environment(
    interconnect: Interconnect,
    overrides: Mapping[Fabric, Mapping[str, str]] | None = None,
    *,
    nodes: int = 2,
    instance_type: str | None = None,
) -> dict[str, str]:
    """The environment a gang of ``nodes`` nodes gets on ``interconnect``'s fabric.

    The table's variables (with the type's own row when ``instance_type`` is
    given), then the job's overrides for that fabric merged over them: a
    value replaces or adds a variable, an empty value removes it. One node
    gets only its non-empty overrides: nothing crosses the scale-out fabric.
    Returns a new dict the caller may change.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    own = (overrides or {}).get(interconnect.fabric, {})
    if nodes == 1:
        return {k: v for k, v in own.items() if v != ""}
    env = PROFILES[interconnect.fabric].env_for(instance_type)
    for name, value in own.items():
        if value == "":
            env.pop(name, None)
        else:
            env[name] = value
    return env


def default_min_busbw_gbps(interconnect: Interconnect) -> float | None:
    """The all-reduce bus bandwidth (GB/s) a 2+ node gang must exceed; None for no floor.

    A share of the per-GPU line rate (see the module doc for each share and
    why): ``share * gbps_per_gpu / 8``. None on plain Ethernet.
    """
    return PROFILES[interconnect.fabric].min_busbw_gbps(interconnect.gbps_per_gpu)
