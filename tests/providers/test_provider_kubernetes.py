"""Kubernetes-specific tests: the real ``kubernetes`` client against the loopback API fake.

Expected prices are computed here from the harness's (made-up) prices per GPU-hour.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fakes.kubernetes_fake import KubeFake, node
from gang_support import assert_gang_env, gang_request, script_env
from harnesses.kubernetes import EFA, NAMESPACE, P5, PRICES, cluster, provider_for

from spotd.core.clock import ManualClock
from spotd.core.contracts import Driller
from spotd.core.errors import (
    AuthError,
    CapacityError,
    InvalidRequestError,
    NotFoundError,
    ProviderError,
    ProviderUnavailable,
    ThrottledError,
)
from spotd.core.network import Fabric
from spotd.core.values import InstanceState, LaunchRequest, Market, Offering, Pool
from spotd.daemon.bootstrap import bootstrap_for
from spotd.registry import load_kind
from spotd_kubernetes import KIND, KubernetesProvider, KubernetesSettings, nodes
from spotd_kubernetes.errors import kind_of

TAGS = {"spotd-job": "j-kube", "spotd-attempt": "1", "spotd-owner": "daemon-a"}


@pytest.fixture
def fake() -> Iterator[KubeFake]:
    server = KubeFake(cluster())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def provider(fake: KubeFake) -> KubernetesProvider:
    return provider_for(fake)


def offering(p: KubernetesProvider, pool: str) -> Offering:
    return next(o for o in p.offerings() if o.pool.instance_type == pool)


def request(o: Offering, *, market: Market = Market.SPOT, nodes: int = 1, token: str = "tok",
            env: dict[str, str] | None = None) -> LaunchRequest:  # fmt: skip
    return LaunchRequest(offering=o, market=market, nodes=nodes, client_token=token,
                         tags=TAGS, command=("python", "train.py"),
                         env=env or {"SPOTD_JOB_ID": "j-kube"})  # fmt: skip


def state(p: KubernetesProvider, iid: str) -> InstanceState | None:
    found = p.describe([iid])
    return found[0].state if found else None


# -- offerings -------------------------------------------------------------------------


def test_node_pools_become_offerings_priced_per_gpu_hour(provider: KubernetesProvider) -> None:
    by_pool = {o.pool.instance_type: o for o in provider.offerings()}
    assert set(by_pool) == {"gpu-l4", "p5-spot", "dgx-a100"}  # the CPU node is no pool
    l4 = by_pool["gpu-l4"]
    assert (l4.gpu, l4.gpus_per_node, l4.pool.zone, l4.pool.region) == (
        "L4", 1, "us-east-1a", "us-east-1")
    # Spot and on-demand nodes of one Karpenter pool: one pool sold in both markets.
    assert l4.spot_price == pytest.approx(PRICES["gpu-l4"]["spot_price_per_gpu_hour"])
    assert l4.on_demand_price == pytest.approx(PRICES["gpu-l4"]["price_per_gpu_hour"])
    p5 = by_pool["p5-spot"]
    assert (p5.gpu, p5.gpus_per_node, p5.gpu_memory_gb) == ("H100", 8, 80)
    assert p5.spot_price == pytest.approx(8 * PRICES["p5-spot"]["spot_price_per_gpu_hour"])
    assert p5.on_demand_price is None  # no on-demand node in that group
    # p5.48xlarge is in spotd's AWS table: EFA at 3,200 Gbps per node.
    assert p5.interconnect.fabric is Fabric.EFA
    assert p5.interconnect.gbps_per_gpu == pytest.approx(400)
    dgx = by_pool["dgx-a100"]
    assert (dgx.gpu, dgx.pool.zone, dgx.spot_price) == ("A100", nodes.NO_ZONE, None)
    assert dgx.on_demand_price == pytest.approx(8 * PRICES["dgx-a100"]["price_per_gpu_hour"])
    # An RDMA device resource and no table entry: InfiniBand at the configured default.
    assert dgx.interconnect.fabric is Fabric.INFINIBAND
    assert dgx.interconnect.gbps_per_gpu == pytest.approx(100.0 / 8)
    assert all(o.notice_seconds == 30 and o.capacity is None for o in by_pool.values())


def test_a_pool_without_a_price_costs_nothing(fake: KubeFake) -> None:
    p = provider_for(fake, pools={})
    dgx = offering(p, "dgx-a100")
    assert dgx.on_demand_price == 0.0


@pytest.mark.parametrize("labels", [
    {"cloud.google.com/gke-nodepool": "spot-pool", "cloud.google.com/gke-spot": "true"},
    {"kubernetes.azure.com/agentpool": "spot-pool",
     "kubernetes.azure.com/scalesetpriority": "spot"},
    {"eks.amazonaws.com/nodegroup": "spot-pool", "eks.amazonaws.com/capacityType": "SPOT"},
    {"karpenter.sh/nodepool": "spot-pool", "karpenter.sh/capacity-type": "spot"},
    {"example.com/pool": "spot-pool", "example.com/lifecycle": "preemptible"},
])  # fmt: skip
def test_spot_nodes_are_told_by_each_clouds_label(labels: dict[str, str]) -> None:
    fake = KubeFake([node("n-0", {**labels, "nvidia.com/gpu.product": "Tesla-T4"}, 1)])
    fake.start()
    try:
        p = provider_for(fake, spot_label="example.com/lifecycle=preemptible", pools={})
        (only,) = p.offerings()
    finally:
        fake.stop()
    assert (only.pool.instance_type, only.gpu) == ("spot-pool", "T4")
    assert only.spot_price == 0.0 and only.on_demand_price is None


@pytest.mark.parametrize(("product", "model"), [
    ("NVIDIA-H100-80GB-HBM3", "H100"), ("NVIDIA-A100-SXM4-80GB", "A100"),
    ("nvidia-tesla-a100", "A100"), ("nvidia-l4", "L4"), ("NVIDIA-A10G", "A10G"),
    ("Tesla-T4", "T4"), ("nvidia-h100-mega-80gb", "H100"), ("Some-New-GPU", "SOME-NEW-GPU"),
])  # fmt: skip
def test_gpu_models_from_product_labels(product: str, model: str) -> None:
    assert nodes.gpu_model(product) == model


def test_a_pool_with_cordoned_nodes_offers_less_capacity(
    fake: KubeFake, provider: KubernetesProvider
) -> None:
    fake.cordon("p5-0")
    assert offering(provider, "p5-spot").capacity == pytest.approx(4 / 5)


# -- launching ---------------------------------------------------------------------------


def test_a_two_node_gang_is_two_pods_with_the_rendezvous_environment(fake: KubeFake) -> None:
    script = bootstrap_for("kubernetes", daemon_url="http://spotd.example:8420",
                           daemon_token="daemon-secret")  # fmt: skip
    p = KubernetesProvider(provider_for(fake)._settings, boot_script=script)
    o = offering(p, "p5-spot")
    ids = [i.id for i in p.launch(gang_request(o, tags=TAGS))]
    assert len(ids) == 2 and len({i.private_address for i in p.describe(ids)}) == 2
    bodies = fake.created()
    assert [b["metadata"]["labels"]["spotd-rank"] for b in bodies] == ["0", "1"]
    for iid, body in zip(ids, bodies, strict=True):
        (container,) = body["spec"]["containers"]
        assert container["command"][:2] == ["bash", "-c"]
        assert_gang_env(script_env(container["command"][2]), Fabric.EFA)
        assert {"name": "SPOTD_AGENT_INSTANCE_ID", "value": iid} in container["env"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "8", EFA: "32"}
        (term,) = body["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        pins = {(e["key"], e["operator"], tuple(e["values"])) for e in term["matchExpressions"]}
        assert ("eks.amazonaws.com/nodegroup", "In", ("p5-spot",)) in pins
        assert ("topology.kubernetes.io/zone", "In", (P5["topology.kubernetes.io/zone"],)) in pins
        assert ("eks.amazonaws.com/capacityType", "In", ("SPOT",)) in pins
        assert body["spec"]["terminationGracePeriodSeconds"] == 30
        assert body["metadata"]["labels"]["spotd-owner"] == "daemon-a"


def test_on_demand_pods_keep_off_spot_nodes(fake: KubeFake, provider: KubernetesProvider) -> None:
    (inst,) = provider.launch(request(offering(provider, "gpu-l4"), market=Market.ON_DEMAND))
    assert inst.market is Market.ON_DEMAND
    assert fake.pod_of(inst.id)["spec"]["nodeName"].startswith("l4-od-")


def test_a_market_the_pool_does_not_sell_is_refused(provider: KubernetesProvider) -> None:
    with pytest.raises(InvalidRequestError):
        provider.launch(request(offering(provider, "p5-spot"), market=Market.ON_DEMAND))


def test_the_jobs_image_runs_as_the_pod_and_not_inside_it(
    fake: KubeFake, provider: KubernetesProvider
) -> None:
    rendered: list[LaunchRequest] = []

    def script(r: LaunchRequest) -> str:
        rendered.append(r)
        return "#!/bin/bash\n"

    p = KubernetesProvider(provider._settings, boot_script=script)
    env = {"SPOTD_JOB_ID": "j-kube", "SPOTD_IMAGE": "ghcr.io/team/train:7"}
    p.launch(request(offering(p, "gpu-l4"), env=env))
    (body,) = fake.created()
    assert body["spec"]["containers"][0]["image"] == "ghcr.io/team/train:7"
    assert "SPOTD_IMAGE" not in rendered[0].env  # the agent starts no container of its own


def test_a_team_runs_in_its_own_namespace(fake: KubeFake) -> None:
    p = provider_for(fake, team_namespaces={"vision": "team-vision"})
    env = {"SPOTD_JOB_ID": "j-kube", "SPOTD_TEAM": "vision"}
    (inst,) = p.launch(request(offering(p, "gpu-l4"), env=env))
    assert inst.id.startswith("team-vision/")
    assert [i.id for i in p.list_instances({"spotd-job": "j-kube"})] == [inst.id]


def test_a_full_pool_is_a_capacity_error_and_leaves_no_pod(
    fake: KubeFake, provider: KubernetesProvider
) -> None:
    # Five p5 nodes: a gang of six cannot be placed whole, so none of it stays.
    with pytest.raises(CapacityError) as err:
        provider.launch(request(offering(provider, "p5-spot"), nodes=6))
    assert err.value.code == "Unschedulable" and "5 of 6" in str(err.value)
    assert fake.pods == {}
    assert provider.list_instances({"spotd-job": "j-kube"}) == []


def test_waiting_for_an_autoscaler_gives_up_at_the_deadline(fake: KubeFake) -> None:
    clock = ManualClock(datetime(2026, 12, 1, tzinfo=UTC))
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(seconds)

    settings = provider_for(fake, wait_for_autoscaler=True, schedule_timeout_seconds=5,
                            schedule_poll_seconds=1)._settings  # fmt: skip
    p = KubernetesProvider(settings, boot_script=lambda r: "#!/bin/bash\n", clock=clock,
                           sleep=sleep)  # fmt: skip
    with pytest.raises(CapacityError):
        p.launch(request(offering(p, "p5-spot"), nodes=6))
    assert waits == [1] * 5
    assert fake.pods == {}


# -- watching ----------------------------------------------------------------------------


def launched(p: KubernetesProvider, pool: str = "gpu-l4") -> str:
    (inst,) = p.launch(request(offering(p, pool)))
    assert state(p, inst.id) is InstanceState.RUNNING
    return inst.id


def test_a_disruption_target_is_a_notice(fake: KubeFake, provider: KubernetesProvider) -> None:
    iid = launched(provider)
    fake.disrupt(*iid.split("/"))
    assert state(provider, iid) is InstanceState.NOTICE


@pytest.mark.parametrize("taint", [None, "karpenter.sh/disrupted",
                                   "aws-node-termination-handler/spot-itn"])  # fmt: skip
def test_a_drained_node_puts_its_pod_under_notice(
    fake: KubeFake, provider: KubernetesProvider, taint: str | None
) -> None:
    iid = launched(provider)
    fake.cordon(fake.pod_of(iid)["spec"]["nodeName"], taint)
    assert state(provider, iid) is InstanceState.NOTICE


def test_a_node_gone_ends_the_pod_preempted(fake: KubeFake, provider: KubernetesProvider) -> None:
    iid = launched(provider)
    fake.remove_node(fake.pod_of(iid)["spec"]["nodeName"])
    (gone,) = provider.describe([iid])
    assert gone.state is InstanceState.PREEMPTED and gone.ended_at is not None


def test_an_evicted_pod_is_preempted_and_an_exit_is_an_exit(
    fake: KubeFake, provider: KubernetesProvider
) -> None:
    evicted = launched(provider)
    fake.finish(*evicted.split("/"), exit_code=137, reason="Evicted")
    (inst,) = provider.launch(request(offering(provider, "gpu-l4"), token="other"))
    fake.finish(*inst.id.split("/"), exit_code=3)
    states = {i.id: (i.state, i.exit_code) for i in provider.describe([evicted, inst.id])}
    assert states == {evicted: (InstanceState.PREEMPTED, None),
                      inst.id: (InstanceState.EXITED, 3)}  # fmt: skip


def test_a_drill_evicts_the_pod_through_the_eviction_api(
    fake: KubeFake, provider: KubernetesProvider
) -> None:
    assert isinstance(provider, Driller)
    iid = launched(provider)
    provider.drill(iid)
    (sent,) = [s for s in fake.requests if s.path.endswith("/eviction")]
    assert sent.body["metadata"]["name"] == iid.split("/")[1]
    assert state(provider, iid) is InstanceState.NOTICE
    assert state(provider, iid) is InstanceState.PREEMPTED


def test_logs_are_the_pods_output(fake: KubeFake, provider: KubernetesProvider) -> None:
    iid = launched(provider)
    fake.logs[tuple(iid.split("/"))] = "step 1 loss 2.5\nstep 2 loss 2.1\n"  # type: ignore[index]
    assert provider.logs(iid) == "step 1 loss 2.5\nstep 2 loss 2.1\n"
    assert provider.logs("spotd/no-such-pod") == ""


# -- never touching pods spotd did not create -------------------------------------------


def foreign(fake: KubeFake, labels: dict[str, str]) -> str:
    fake.pods[(NAMESPACE, "theirs")] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "theirs", "namespace": NAMESPACE, "labels": labels},
        "spec": {"containers": [{"name": "job", "image": "x"}], "nodeName": "dgx-0"},
        "status": {"phase": "Running"},
    }  # fmt: skip
    return f"{NAMESPACE}/theirs"


@pytest.mark.parametrize("labels", [
    {}, {"spotd-job": "j-kube"}, {"spotd-managed": "true", "spotd-job": "j-kube"},
])  # fmt: skip
def test_a_pod_spotd_did_not_create_is_never_read_nor_deleted(
    fake: KubeFake, provider: KubernetesProvider, labels: dict[str, str]
) -> None:
    iid = foreign(fake, labels)
    provider.terminate([iid])
    assert (NAMESPACE, "theirs") in fake.pods
    assert [s for s in fake.requests if s.method == "DELETE"] == []
    assert provider.describe([iid]) == []
    assert provider.list_instances({"spotd-job": "j-kube"}) == []


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "kind"), [
    (400, InvalidRequestError), (401, AuthError), (403, AuthError), (404, NotFoundError),
    (409, ProviderError), (422, InvalidRequestError), (429, ThrottledError),
    (500, ProviderUnavailable), (503, ProviderUnavailable),
])  # fmt: skip
def test_api_errors_map_by_status(status: int, kind: type[ProviderError]) -> None:
    assert kind_of(status) is kind


@pytest.mark.parametrize(("status", "reason", "kind"), [
    (422, "Invalid", InvalidRequestError), (409, "Conflict", ProviderError),
    (401, "Unauthorized", AuthError),
])  # fmt: skip
def test_a_refused_create_raises_its_class_with_the_apis_reason(
    fake: KubeFake, provider: KubernetesProvider, status: int, reason: str,
    kind: type[ProviderError],
) -> None:
    fake.fail_next_create(status, reason)
    with pytest.raises(kind) as err:
        provider.launch(request(offering(provider, "gpu-l4")))
    assert type(err.value) is kind and err.value.code == reason
    assert err.value.provider == "kubernetes"


def test_an_api_server_that_does_not_answer_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = KubernetesSettings(enabled=True, api_endpoint=f"http://127.0.0.1:{port}")
    p = KubernetesProvider(settings, boot_script=lambda r: "")
    with pytest.raises(ProviderUnavailable):
        p.offerings()


def test_a_missing_kubeconfig_is_an_auth_error(tmp_path: Any) -> None:
    settings = KubernetesSettings(enabled=True, auth="kubeconfig",
                                  kubeconfig=str(tmp_path / "none"))  # fmt: skip
    p = KubernetesProvider(settings, boot_script=lambda r: "")
    with pytest.raises(AuthError):
        p.offerings()


# -- the kind ----------------------------------------------------------------------------


def test_the_kind_is_found_by_its_entry_point() -> None:
    kind = load_kind("kubernetes")
    assert kind is KIND and kind.boot is not None and kind.sdk is not None
    assert kind.sdk.extra == "kubernetes"


@pytest.mark.parametrize("endpoint", ["http://10.0.0.1:6443", "ftp://127.0.0.1"])
def test_plain_http_is_only_for_loopback(endpoint: str) -> None:
    with pytest.raises(ValueError, match="endpoint"):
        KubernetesSettings(api_endpoint=endpoint)



# -- the pod's first process ---------------------------------------------------------------


def test_the_pods_sigterm_reaches_the_agent_and_its_exit_code_is_the_pods(tmp_path: Any) -> None:
    """The boot script starts the agent in the background (as on a VM); the lines spotd
    adds make bash, the pod's first process, pass the SIGTERM of an eviction on and end
    with the agent's own exit code."""
    import signal
    import subprocess
    import sys
    import time

    from spotd_kubernetes.pods import AGENT_TAIL

    ready = tmp_path / "ready"
    agent = (f"import signal, sys, time, pathlib\n"
             f"signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
             f"pathlib.Path({str(ready)!r}).touch()\n"
             f"time.sleep(60)\n")  # fmt: skip
    (tmp_path / "agent.py").write_text(agent)
    script = f"set -euo pipefail\nnohup {sys.executable} {tmp_path / 'agent.py'} &\n"
    shell = subprocess.Popen(["bash", "-c", script + AGENT_TAIL])
    limit = time.monotonic() + 20
    while not ready.exists():
        assert time.monotonic() < limit and shell.poll() is None, "the agent never started"
        time.sleep(0.01)
    shell.send_signal(signal.SIGTERM)
    assert shell.wait(timeout=20) == 42


# -- spotd plan --------------------------------------------------------------------------


def test_plan_fills_the_paid_for_pool_first_then_the_spot_pools_and_the_clouds(
    fake: KubeFake, tmp_path: Any
) -> None:
    from spotd.core.spec import JobSpec
    from spotd.daemon.config import load_settings
    from spotd.daemon.planning import plan_job

    config = tmp_path / "spotd.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "state"}"\n'
        "[providers.sim]\nenabled = true\n"
        f'[providers.kubernetes]\nenabled = true\napi_endpoint = "{fake.url}"\n'
        'image = "registry.example/train:1"\npool_label = "example.com/pool"\n'
        "[providers.kubernetes.pools.p5-spot]\nspot_price_per_gpu_hour = 2.5\n"
        '[agent]\ndaemon_url = "http://127.0.0.1:8470"\n'
    )  # fmt: skip
    spec = JobSpec.model_validate({
        "name": "plan-kube", "command": ["python", "train.py"],
        "resources": {"gpus": ["A100", "H100"], "gpus_per_node": 8},
        "market": {"type": "auto"},
    })  # fmt: skip
    view = plan_job(spec, load_settings(config), "cheapest")
    assert view.choice is not None
    assert (view.choice.provider, view.choice.instance_type, view.choice.market) == (
        "kubernetes", "dgx-a100", "on-demand")
    assert view.choice.price_per_hour == 0.0
    usable = [c for c in view.candidates if c.excluded is None]
    assert usable[0].instance_type == "dgx-a100"
    # The spot pool of the cluster and the clouds' pools follow it, with their prices.
    p5 = next(c for c in usable if c.instance_type == "p5-spot")
    assert (p5.market, p5.price_per_hour) == ("spot", pytest.approx(8 * 2.5))
    assert {"sim-aws", "sim-azure"} <= {c.provider for c in usable[1:]}
    assert all(c.price_per_hour > 0 for c in usable[1:])


EKS_P4D = {"eks.amazonaws.com/nodegroup": "p4d-pool", "eks.amazonaws.com/capacityType": "SPOT",
           "node.kubernetes.io/instance-type": "p4d.24xlarge",
           "topology.kubernetes.io/zone": "us-east-1a",
           "topology.kubernetes.io/region": "us-east-1",
           "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}  # fmt: skip
"""An EKS node group of p4d.24xlarge spot nodes, with no price configured."""


def eks_cluster() -> KubeFake:
    p4d = [node(f"p4d-{i}", EKS_P4D, 8, {EFA: 4}, provider_id=f"aws:///us-east-1a/i-0p4d{i}")
           for i in range(2)]  # fmt: skip
    return KubeFake([*cluster(), *p4d])


def test_a_cloud_pool_is_linked_to_its_clouds_provider_unless_priced(fake: KubeFake) -> None:
    eks = eks_cluster()
    eks.start()
    try:
        linked = offering(provider_for(eks, cloud_providers={"aws": "sim-aws"}), "p4d-pool")
        priced = offering(provider_for(eks, pools={"p4d-pool": {"price_per_gpu_hour": 1.0}}),
                          "p4d-pool")  # fmt: skip
        off = offering(provider_for(eks, cloud_providers={"aws": ""}), "p4d-pool")
    finally:
        eks.stop()
    assert linked.price_link is not None
    assert linked.price_link.source == Pool("sim-aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
    assert linked.price_link.markets == {Market.SPOT}  # the group has no on-demand node
    assert linked.spot_price == 0.0  # until the market cache prices it
    # A configured price always wins; a cloud mapped to no provider is priced by the settings.
    assert priced.price_link is None and priced.spot_price == pytest.approx(8.0)
    assert off.price_link is None and off.spot_price == 0.0
    # Nodes without a providerID (the harness's own) are not linked, whatever their labels.
    assert offering(provider_for(fake), "p5-spot").price_link is None


def test_plan_prices_an_eks_pool_from_the_clouds_offering_after_the_reserved_pool(
    tmp_path: Any
) -> None:
    from spotd.core.spec import JobSpec
    from spotd.daemon.config import load_settings
    from spotd.daemon.planning import plan_job

    eks = eks_cluster()
    eks.start()
    config = eks_config(tmp_path, eks, sim=True)
    spec = JobSpec.model_validate({
        "name": "plan-eks", "command": ["python", "train.py"],
        "resources": {"gpus": ["A100"], "gpus_per_node": 8}, "market": {"type": "auto"},
    })  # fmt: skip
    try:
        view = plan_job(spec, load_settings(config), "cheapest")
    finally:
        eks.stop()
    usable = [c for c in view.candidates if c.excluded is None]
    # The reserved pool keeps its configured price and comes first.
    assert (usable[0].provider, usable[0].instance_type, usable[0].market) == (
        "kubernetes", "dgx-a100", "on-demand")
    assert usable[0].price_per_hour == pytest.approx(8 * 0.25)
    # The EKS pool costs what sim-aws sells a spot p4d.24xlarge for in its zone.
    (eks_pool,) = [c for c in usable if c.instance_type == "p4d-pool"]
    (same,) = [c for c in usable if (c.provider, c.zone, c.instance_type, c.market) == (
        "sim-aws", "us-east-1a", "p4d.24xlarge", "spot")]  # fmt: skip
    assert eks_pool.market == "spot"
    assert eks_pool.price_per_hour == pytest.approx(same.price_per_hour)
    assert eks_pool.price_per_hour > usable[0].price_per_hour
    assert usable.index(eks_pool) > 0


def eks_config(tmp_path: Any, eks: KubeFake, *, sim: bool) -> Any:
    config = tmp_path / "spotd.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "state"}"\n'
        f"[providers.sim]\nenabled = {'true' if sim else 'false'}\n"
        f'[providers.kubernetes]\nenabled = true\napi_endpoint = "{eks.url}"\n'
        'image = "registry.example/train:1"\npool_label = "example.com/pool"\n'
        'cloud_providers = { aws = "sim-aws" }\n'
        "[providers.kubernetes.pools.dgx-a100]\nprice_per_gpu_hour = 0.25\n"
        '[agent]\ndaemon_url = "http://127.0.0.1:8470"\n'
    )  # fmt: skip
    return config


@pytest.mark.parametrize("sim", [True, False])
def test_check_cloud_says_how_a_cloud_pool_is_priced(tmp_path: Any, sim: bool) -> None:
    from spotd.daemon.cloudcheck import check_clouds
    from spotd.daemon.config import load_settings

    eks = eks_cluster()
    eks.start()
    try:
        (check,) = check_clouds(load_settings(eks_config(tmp_path, eks, sim=sim)), None,
                                "kubernetes")  # fmt: skip
    finally:
        eks.stop()
    (price,) = [x for x in check.outcomes if x.name.startswith("price of ")]
    assert price.name == "price of kubernetes/us-east-1a/p4d-pool"
    if sim:
        assert price.ok and "as sim-aws sells p4d.24xlarge in us-east-1" in price.detail
    else:  # no provider sells that machine here: it costs 0, and check-cloud says so
        assert not price.ok and not check.ok
        assert "provider sim-aws is not enabled" in price.detail


# -- the engine on the cluster -----------------------------------------------------------


def test_a_drained_node_is_a_notice_then_a_preemption_and_the_job_resumes(
    fake: KubeFake, provider: KubernetesProvider, tmp_path: Any
) -> None:
    import time

    from spotd.core.clock import WallClock
    from spotd.core.spec import JobSpec
    from spotd.core.states import JobStatus
    from spotd.core.values import AttemptEnd
    from spotd.engine.reconcile import Engine
    from spotd.engine.settings import EngineSettings
    from spotd.registry import load_policy
    from spotd.store.sql import open_store

    # No cooldown: the cluster has one L4 spot pool, which a preemption would cool down.
    engine = Engine(open_store(f"sqlite:///{tmp_path / 'spotd.db'}"), {"kubernetes": provider},
                    load_policy("cheapest"), WallClock(),
                    EngineSettings(owner="daemon-a", checkpoints_dir=tmp_path / "ckpt",
                                   cooldown_hours=0))  # fmt: skip
    job = engine.submit(JobSpec.model_validate({
        "name": "drained", "command": ["python", "train.py"],
        "resources": {"gpus": ["L4"], "gpus_per_node": 1}, "market": {"type": "spot"},
    }))  # fmt: skip

    def until(status: JobStatus) -> None:
        limit = time.monotonic() + 30
        while engine.store.get_job(job.id).status is not status:
            assert time.monotonic() < limit, engine.store.get_job(job.id).status
            engine.tick()

    until(JobStatus.RUNNING)
    (first,) = engine.store.attempts(job.id)
    (iid,) = first.instance_ids
    node_name = fake.pod_of(iid)["spec"]["nodeName"]
    fake.cordon(node_name, "karpenter.sh/disrupted")  # Karpenter takes the spot node back
    until(JobStatus.CHECKPOINTING)
    fake.remove_node(node_name)
    until(JobStatus.RUNNING)
    first, second = engine.store.attempts(job.id)
    assert first.end_reason is AttemptEnd.PREEMPTED
    (new,) = second.instance_ids
    assert new != iid and fake.pod_of(new)["spec"]["nodeName"] != node_name


# -- spotd check-cloud -------------------------------------------------------------------


def test_check_cloud_passes_on_a_ready_cluster_and_names_the_pods_it_would_create(
    fake: KubeFake, provider: KubernetesProvider
) -> None:
    from spotd.core.contracts import CloudChecker

    assert isinstance(provider, CloudChecker)
    o = offering(provider, "p5-spot")
    found = provider.check_cloud(request(o, nodes=2))
    assert found.ok, [x for x in found.outcomes if not x.ok]
    names = [x.name for x in found.outcomes]
    assert names[:2] == ["credentials", "permissions"]
    assert {"pool p5-spot", "image", "quota in spotd", "boot script"} <= set(names)
    assert len(found.would_create) == 2 and all("p5-spot" in w for w in found.would_create)
    assert fake.pods == {}  # nothing was created
    assert provider.check_cloud(None).ok


def test_check_cloud_names_each_missing_permission_and_a_quota_without_room(
    fake: KubeFake, provider: KubernetesProvider
) -> None:
    fake.denied |= {(NAMESPACE, "pods/eviction", "create"), ("", "nodes", "list")}
    fake.quotas[NAMESPACE] = [{"metadata": {"name": "gpus"},
                               "status": {"hard": {"requests.nvidia.com/gpu": "8"},
                                          "used": {"requests.nvidia.com/gpu": "8"}}}]  # fmt: skip
    found = provider.check_cloud(request(offering(provider, "p5-spot")))
    failed = {x.name: x.detail for x in found.outcomes if not x.ok}
    assert set(failed) == {"permission create pods/eviction in spotd",
                           "permission list nodes (cluster-wide)", "quota in spotd"}  # fmt: skip
    assert "ResourceQuota spotd/gpus" in failed["quota in spotd"]


def test_check_cloud_of_an_unreachable_cluster_fails_on_credentials() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = KubernetesSettings(enabled=True, api_endpoint=f"http://127.0.0.1:{port}")
    found = KubernetesProvider(settings, boot_script=lambda r: "").check_cloud(None)
    assert [(x.name, x.ok) for x in found.outcomes] == [("credentials", False)]
