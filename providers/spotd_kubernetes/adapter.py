"""The Kubernetes provider: a cluster's GPU node pools, one pod per node of an attempt.

Every API call goes through :func:`~.errors.map_kubernetes_errors`. Instance ids are
``namespace/pod``. spotd reads and deletes only pods it labelled (``spotd-managed``
and ``spotd-owner``); a pod it saw that is gone (evicted, its node deleted) is
reported PREEMPTED from memory, one it deleted TERMINATED.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from spotd.core.agent_wire import IMAGE
from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.drill import drill_target
from spotd.core.errors import (
    CapacityError,
    InvalidRequestError,
    ProviderError,
    invalid_request,
)
from spotd.core.values import (
    CloudCheck,
    Instance,
    InstanceState,
    LaunchRequest,
    Market,
    Offering,
    Pool,
)

from . import check, nodes, pods
from .calls import Calls
from .figures import LAUNCH_LABEL, NAME
from .quota import check_quotas, need_of
from .settings import KubernetesSettings

log = logging.getLogger(__name__)

BootScript = Callable[[LaunchRequest], str]
TEAM_VARIABLE = "SPOTD_TEAM"
"""The launch request's variable naming the job's team (its pods' namespace)."""
SEEN_LIMIT = 4096


class KubernetesProvider:
    """GPU pods on one cluster's node pools. ``clock`` bounds the wait for the scheduler
    and dates pods found gone; ``sleep`` waits between two looks at a launch's pods."""

    name = NAME

    def __init__(
        self, settings: KubernetesSettings, *, boot_script: BootScript,
        api: Any | None = None, clock: Clock = WALL,
        sleep: Callable[[float], object] | None = None,
    ) -> None:  # fmt: skip
        self._settings = settings
        self._boot_script = boot_script
        self._calls = Calls(settings, api)
        self._clock = clock
        self._sleep = sleep or threading.Event().wait
        self._pools: dict[Pool, nodes.PoolFacts] = {}
        self._seen: dict[str, Instance] = {}
        self._stopped: set[str] = set()

    def __repr__(self) -> str:
        return f"KubernetesProvider(context={self._settings.context!r})"

    # -- Provider protocol -------------------------------------------------

    def offerings(self) -> list[Offering]:
        """One offering per GPU node pool (and zone), priced from the settings; a market
        of a cloud-backed pool with no price there is linked to its cloud's provider
        (:func:`.nodes.price_link`), which the market cache prices it from."""
        listed = self._calls.nodes()
        facts = [f for n in listed if (f := nodes.node_facts(n, self._settings)) is not None]
        offerings = []
        pools: dict[Pool, nodes.PoolFacts] = {}
        leaving = {f.name for f in facts if f.leaving}
        for pool in nodes.group(facts):
            offering = self._offering(pool, leaving)
            if offering.pool in pools:
                # A pool of nodes of several shapes (Karpenter): one offering per shape.
                shape = f"{pool.name}:{pool.first.gpus}x{pool.first.gpu}"
                offering = replace(offering, pool=replace(offering.pool, instance_type=shape))
            pools[offering.pool] = pool
            offerings.append(offering)
        self._pools = pools
        return offerings

    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Create one pod per node in the pool, all placed by the scheduler or none.

        Pod names derive from the client token: a retry finds the pods of the first
        call. Pods the scheduler finds no node for (the pool is full) are deleted and
        the launch raises CapacityError, at once or, with ``wait_for_autoscaler``,
        after ``schedule_timeout_seconds``.
        """
        pool = self._pool_for(request)
        namespace = self._settings.namespace_of(request.env.get(TEAM_VARIABLE))
        existing = self._launched(namespace, request.client_token)
        if len(existing) >= request.nodes:
            return self._instances(existing)
        check_quotas(self._calls.core(), namespace,
                     need_of(pool.first.gpus, request.nodes - len(existing)),
                     self._settings.request_timeout_seconds)
        with invalid_request(NAME, "launch"):
            script = self._boot_script(_bare(request))
        if not (request.env.get(IMAGE) or self._settings.image):
            raise InvalidRequestError(f"{NAME}: the job names no image and "
                                      "providers.kubernetes.image is not set", provider=NAME)
        bodies = [pods.pod_body(self._settings, request, pool, rank=rank, namespace=namespace,
                                script=script) for rank in range(request.nodes)]  # fmt: skip
        try:
            for body in bodies:
                self._calls.create(namespace, body)
            return self._instances(self._await_scheduling(namespace, request))
        except ProviderError:
            self._delete_quietly([f"{namespace}/{b['metadata']['name']}" for b in bodies])
            raise

    def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        """spotd's pods among ``instance_ids``; unknown ids and foreign pods are left out."""
        found: list[Instance] = []
        for iid in instance_ids:
            ref = pods.PodRef.parse(iid)
            pod = self._calls.pod(ref) if ref is not None else None
            if pod is None:
                gone = self._gone(iid)
                if gone is not None:
                    found.append(gone)
            elif pods.is_ours(pod):
                found.append(self._instances([pod])[0])
        return found

    def list_instances(self, tags: Mapping[str, str]) -> list[Instance]:
        """spotd's pods in its namespaces whose tags include ``tags``."""
        selector = pods.tag_selector(tags)
        listed: list[Any] = []
        for namespace in self._settings.namespaces():
            listed += self._calls.pods(namespace, selector)
        mine = [p for p in listed if pods.is_ours(p) and tags.items() <= pods.tags_of(p).items()]
        return sorted(self._instances(mine), key=lambda i: i.id)

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Delete these pods (their grace period is the job's notice); ids unknown, gone
        or of pods spotd did not create are ignored."""
        for iid in instance_ids:
            ref = pods.PodRef.parse(iid)
            pod = self._calls.pod(ref) if ref is not None else None
            if ref is None or pod is None:
                continue
            if not pods.is_ours(pod):
                log.warning("%s: pod %s is not spotd's: not deleted", NAME, iid)
                continue
            self._stopped.add(iid)
            self._calls.delete(ref)

    def logs(self, instance_id: str) -> str:
        """The pod's output (the agent's and the job's); "" for an unknown pod."""
        ref = pods.PodRef.parse(instance_id)
        if ref is None:
            return ""
        return self._calls.log(ref)

    def check_cloud(self, request: LaunchRequest | None) -> CloudCheck:
        """Check credentials, RBAC, the job's pool, image and quota; create nothing
        (:mod:`.check`). The pools priced from a cloud's provider go with it, for the
        daemon to check it runs that provider."""
        try:
            offered = self.offerings()
        except ProviderError as exc:
            return check.failed_credentials(exc)
        namespace = self._settings.namespace_of(request.env.get(TEAM_VARIABLE)) \
            if request is not None else self._settings.namespace
        runner = check.KubernetesCheck(self._settings, self._calls, self._pools,
                                       lambda r: self._boot_script(_bare(r)))
        linked = tuple(o for o in offered if o.price_link is not None)
        return replace(runner.run(request, namespace), linked=linked)

    def drill(self, instance_id: str) -> None:
        """A drill (:class:`~spotd.core.contracts.Driller`): evict the spot pod through the
        Eviction API, as a drain would; its SIGTERM and grace period are the notice."""
        instance = drill_target(NAME, instance_id, self.describe([instance_id]))
        ref = pods.PodRef.parse(instance.id)
        assert ref is not None  # describe found it by this id
        self._calls.evict(ref)

    # -- offerings and pools ----------------------------------------------------

    def _offering(self, pool: nodes.PoolFacts, leaving: set[str]) -> Offering:
        node = pool.first
        price = self._settings.pools.get(pool.name)
        on_demand = price.price_per_gpu_hour if price else 0.0
        spot = price.spot_price_per_gpu_hour if price else None
        spot = on_demand if spot is None else spot
        gone = sum(1 for n in pool.nodes if n in leaving)
        return Offering(
            pool=Pool(NAME, node.region or "cluster", node.zone, pool.name),
            gpu=node.gpu, gpus_per_node=node.gpus, gpu_memory_gb=node.memory_gb,
            interconnect=nodes.interconnect_of(pool, self._settings),
            spot_price=spot * node.gpus if pool.spot is not None else None,
            on_demand_price=on_demand * node.gpus if pool.on_demand else None,
            capacity=1 - gone / len(pool.nodes) if gone else None,
            notice_seconds=self._settings.notice_seconds,
            price_link=nodes.price_link(pool, self._settings),
        )  # fmt: skip

    def _pool_for(self, request: LaunchRequest) -> nodes.PoolFacts:
        pool = request.offering.pool
        if pool.provider != NAME or request.nodes < 1:
            raise InvalidRequestError(f"{NAME}: cannot launch {request.nodes} node(s) in {pool}",
                                      provider=NAME)  # fmt: skip
        if pool not in self._pools:
            self.offerings()
        facts = self._pools.get(pool)
        if facts is None:
            raise CapacityError(f"{NAME}: no GPU node of pool {pool} is left",
                                provider=NAME, code="PoolGone")  # fmt: skip
        sold = facts.spot is not None if request.market is Market.SPOT else facts.on_demand
        if not sold:
            raise InvalidRequestError(f"{NAME}: pool {pool} has no {request.market} nodes",
                                      provider=NAME)  # fmt: skip
        return facts

    # -- launching -------------------------------------------------------------------

    def _await_scheduling(self, namespace: str, request: LaunchRequest) -> list[Any]:
        """The launch's pods once the scheduler has bound them all; CapacityError when it
        cannot (at once, or at the deadline when waiting for an autoscaler)."""
        deadline = self._clock.monotonic() + self._settings.schedule_timeout_seconds
        while True:
            found = self._launched(namespace, request.client_token)
            refused = [m for p in found if (m := pods.unschedulable(p)) is not None]
            bound = [p for p in found if p.spec.node_name]
            if len(bound) >= request.nodes:
                return found
            late = self._clock.monotonic() >= deadline
            if (refused and not self._settings.wait_for_autoscaler) or late:
                why = refused[0] if refused else "not scheduled in time"
                raise CapacityError(f"{NAME}: {len(bound)} of {request.nodes} pod(s) placed in "
                                    f"{request.offering.pool}: {why}", provider=NAME,
                                    code="Unschedulable")  # fmt: skip
            self._sleep(self._settings.schedule_poll_seconds)

    def _launched(self, namespace: str, client_token: str) -> list[Any]:
        selector = f"{LAUNCH_LABEL}={pods.token_hash(client_token)}"
        found = [p for p in self._calls.pods(namespace, selector) if pods.is_ours(p)]
        return sorted(found, key=lambda p: p.metadata.name)

    # -- reading and deleting pods ------------------------------------------------

    def _instances(self, listed: Sequence[Any]) -> list[Instance]:
        node_names = {p.spec.node_name for p in listed if p.spec and p.spec.node_name}
        states = {name: self._calls.node_state(name) for name in node_names}
        found = []
        for pod in listed:
            node = states.get(pod.spec.node_name) if pod.spec else None
            iid = pods.PodRef(pod.metadata.namespace, pod.metadata.name).id
            found.append(pods.to_instance(
                pod, node_gone=node == "gone", node_leaving=node == "leaving",
                ours=iid in self._stopped))  # fmt: skip
        self._remember(found)
        return found

    def _gone(self, instance_id: str) -> Instance | None:
        known = self._seen.get(instance_id)
        if known is None or known.ended:
            return known
        state = InstanceState.TERMINATED if instance_id in self._stopped \
            else InstanceState.PREEMPTED
        gone = replace(known, state=state, ended_at=self._clock.now())
        self._seen[instance_id] = gone
        return gone

    def _delete_quietly(self, instance_ids: list[str]) -> None:
        for iid in instance_ids:
            ref = pods.PodRef.parse(iid)
            try:
                if ref is not None:
                    self._stopped.add(iid)
                    self._calls.delete(ref)
            except ProviderError as exc:
                log.error("%s: could not delete %s after a failed launch: %s", NAME, iid, exc.code)

    def _remember(self, instances: list[Instance]) -> None:
        for instance in instances:
            self._seen[instance.id] = instance
        while len(self._seen) > SEEN_LIMIT:
            del self._seen[next(iter(self._seen))]



def _bare(request: LaunchRequest) -> LaunchRequest:
    """The request as the boot script gets it: the pod runs the job's image itself, so
    the agent must not start another container."""
    return replace(request, env={k: v for k, v in request.env.items() if k != IMAGE})


def build_kubernetes_provider(
    settings: KubernetesSettings, *, boot_script: BootScript
) -> KubernetesProvider:
    """A provider on the cluster the settings name; its client (and the credentials)
    load on first use, so a daemon starts even when they are missing."""
    return KubernetesProvider(settings, boot_script=boot_script)
