"""The fabric environment table: every fabric's profile, overrides, one node, thresholds."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotd.core.fabric_env import (
    PROFILES,
    FabricProfile,
    default_min_busbw_gbps,
    fabric_environment,
    instance_family,
)
from spotd.core.network import Fabric, Interconnect
from spotd.core.spec_io import parse_job_toml
from spotd.market.catalog import catalog

IB = Interconnect(Fabric.INFINIBAND, 400.0)
EFA_P5 = Interconnect(Fabric.EFA, 400.0)


def test_every_fabric_has_a_profile_with_variables_and_sources() -> None:
    assert set(PROFILES) == set(Fabric)
    for fabric, profile in PROFILES.items():
        assert isinstance(profile, FabricProfile)
        assert profile.fabric is fabric
        assert profile.env, f"{fabric} has no variables"
        assert profile.sources, f"{fabric} cites no source"
        assert all(s.source for s in profile.settings), f"{fabric}: a variable without a source"
        names = [s.name for s in profile.settings]
        assert len(names) == len(set(names)), f"{fabric} sets a variable twice"


def test_the_table_cannot_be_changed_through_its_mappings() -> None:
    with pytest.raises(TypeError):
        PROFILES[Fabric.EFA] = PROFILES[Fabric.ETHERNET]  # type: ignore[index]
    with pytest.raises(TypeError):
        PROFILES[Fabric.EFA].env["FI_PROVIDER"] = "tcp"  # type: ignore[index]
    env = fabric_environment(EFA_P5)
    env["FI_PROVIDER"] = "tcp"  # the caller's copy
    assert fabric_environment(EFA_P5)["FI_PROVIDER"] == "efa"


def test_infiniband_keeps_the_articles_timeout_and_retry_count() -> None:
    env = fabric_environment(IB)
    assert env["NCCL_IB_TIMEOUT"] == "22"
    assert env["NCCL_IB_RETRY_CNT"] == "7"
    # The IB rails only, never Azure's accelerated-networking NIC mlx5_an0.
    assert env["NCCL_IB_HCA"] == "mlx5_ib"


def test_roce_has_the_ib_retry_settings_a_gid_and_a_traffic_class() -> None:
    env = fabric_environment(Interconnect(Fabric.ROCE, 400.0))
    assert (env["NCCL_IB_TIMEOUT"], env["NCCL_IB_RETRY_CNT"]) == ("22", "7")
    assert env["NCCL_IB_GID_INDEX"] == "3"
    assert env["NCCL_IB_TC"].isdigit()


def test_efa_uses_the_efa_provider_and_device_rdma_only_where_documented() -> None:
    assert fabric_environment(EFA_P5)["FI_PROVIDER"] == "efa"
    assert fabric_environment(EFA_P5)["FI_EFA_FORK_SAFE"] == "1"
    # Without the type the table cannot know: left to libfabric, which never aborts.
    assert "FI_EFA_USE_DEVICE_RDMA" not in fabric_environment(EFA_P5)
    for rdma in ("p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5en.48xlarge",
                 "p6-b200.48xlarge"):  # fmt: skip
        env = fabric_environment(EFA_P5, instance_type=rdma)
        assert env["FI_EFA_USE_DEVICE_RDMA"] == "1", rdma
    for none in ("p3dn.24xlarge", "g5.48xlarge", "g6.48xlarge"):
        assert "FI_EFA_USE_DEVICE_RDMA" not in fabric_environment(EFA_P5, instance_type=none)


def test_the_family_is_the_name_before_the_first_dot() -> None:
    assert instance_family("p5.48xlarge") == "p5"
    assert instance_family("p6-b200.48xlarge") == "p6-b200"
    assert instance_family("Standard_ND96isr_H100_v5") == "Standard_ND96isr_H100_v5"


def test_gpu_direct_tcp_names_its_plugin_and_the_gpu_nics() -> None:
    tcpx = fabric_environment(Interconnect(Fabric.TCPX, 125.0))
    assert tcpx["NCCL_NET"] == "GPUDirectTCPX_v7"
    assert tcpx["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"] == "eth1,eth2,eth3,eth4"
    assert tcpx["NCCL_GPUDIRECTTCPX_CTRL_DEV"] == tcpx["NCCL_SOCKET_IFNAME"] == "eth0"
    tcpxo = fabric_environment(Interconnect(Fabric.TCPXO, 225.0))
    assert tcpxo["NCCL_NET"] == "FasTrak"
    assert tcpxo["NCCL_FASTRAK_IFNAME"] == ",".join(f"eth{n}" for n in range(1, 9))
    assert tcpxo["NCCL_FASTRAK_CTRL_DEV"] == "eth0"


def test_ethernet_uses_sockets_and_excludes_loopback_and_docker() -> None:
    env = fabric_environment(Interconnect(Fabric.ETHERNET, 12.5))
    assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker"
    assert env["NCCL_IB_DISABLE"] == "1"


def test_overrides_add_replace_and_remove_only_on_their_own_fabric() -> None:
    overrides = {
        Fabric.INFINIBAND: {"NCCL_DEBUG": "INFO", "NCCL_IB_TIMEOUT": "23", "NCCL_IB_HCA": ""},
        Fabric.EFA: {"FI_PROVIDER": "tcp"},
    }
    env = fabric_environment(IB, overrides)
    assert env["NCCL_DEBUG"] == "INFO"  # added
    assert env["NCCL_IB_TIMEOUT"] == "23"  # replaced
    assert "NCCL_IB_HCA" not in env  # an empty value removes it
    assert env["NCCL_IB_RETRY_CNT"] == "7"  # the rest of the table stays
    assert "FI_PROVIDER" not in env  # EFA's override is not InfiniBand's
    assert fabric_environment(IB, {Fabric.INFINIBAND: {"NOT_SET_ANYWAY": ""}}) == (
        fabric_environment(IB)
    )


def test_overrides_from_a_job_toml() -> None:
    spec = parse_job_toml(
        'name = "t"\ncommand = ["true"]\n[resources]\ngpus = ["H100"]\n'
        "gpus_per_node = 8\nnodes = 2\n"
        '[fabric_env.efa]\nFI_EFA_FORK_SAFE = ""\nNCCL_PROTO = "simple"\n',
        source="job.toml",
        base_dir=Path("/srv/jobs"),
    )
    env = fabric_environment(EFA_P5, spec.fabric_env, nodes=spec.resources.nodes)
    assert env == {"FI_PROVIDER": "efa", "NCCL_PROTO": "simple"}


def test_one_node_gets_only_its_own_non_empty_overrides() -> None:
    assert fabric_environment(IB, nodes=1) == {}
    overrides = {Fabric.INFINIBAND: {"NCCL_DEBUG": "WARN", "NCCL_IB_HCA": ""}}
    assert fabric_environment(IB, overrides, nodes=1) == {"NCCL_DEBUG": "WARN"}
    assert fabric_environment(EFA_P5, nodes=1, instance_type="p5.48xlarge") == {}
    with pytest.raises(ValueError, match="at least 1"):
        fabric_environment(IB, nodes=0)


def test_thresholds_are_a_share_of_the_per_gpu_line_rate() -> None:
    # NDR400 at the guide's InfiniBand share: between "wrong" (20) and "should exceed" (45).
    ndr = default_min_busbw_gbps(IB)
    assert ndr == 42.5 and 20 < ndr <= 45
    assert default_min_busbw_gbps(Interconnect(Fabric.INFINIBAND, 200.0)) == 21.25
    assert default_min_busbw_gbps(Interconnect(Fabric.ROCE, 400.0)) == 37.5
    assert default_min_busbw_gbps(EFA_P5) == 37.5
    tcpx = default_min_busbw_gbps(Interconnect(Fabric.TCPX, 125.0))
    assert tcpx is not None and 0 < tcpx < 125 / 8
    # Plain Ethernet has no floor; a fabric without bandwidth has none either.
    assert default_min_busbw_gbps(Interconnect(Fabric.ETHERNET, 100.0)) is None
    assert default_min_busbw_gbps(Interconnect(Fabric.INFINIBAND, 0.0)) is None


def test_a_faster_fabric_of_the_same_kind_has_a_higher_floor() -> None:
    for fabric in Fabric:
        slow = default_min_busbw_gbps(Interconnect(fabric, 100.0))
        fast = default_min_busbw_gbps(Interconnect(fabric, 400.0))
        assert (slow is None) == (fast is None)
        if slow is not None and fast is not None:
            assert fast > slow > 0


@pytest.mark.parametrize(
    ("kind", "instance_type"),
    [(kind, name) for kind, types in catalog().items() for name in types],
)
def test_every_catalog_type_gets_an_environment_for_multi_node(
    kind: str, instance_type: str
) -> None:
    facts = catalog()[kind][instance_type]
    env = fabric_environment(facts.interconnect, nodes=2, instance_type=instance_type)
    assert env, f"{kind} {instance_type} ({facts.interconnect.fabric}) gets no variables"
    assert all(name and value for name, value in env.items())
    assert fabric_environment(facts.interconnect, nodes=1, instance_type=instance_type) == {}
    floor = default_min_busbw_gbps(facts.interconnect)
    assert (floor is None) == (facts.interconnect.fabric is Fabric.ETHERNET)
