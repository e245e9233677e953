"""The GCP provider: Compute Engine Spot VMs priced from the Cloud Billing Catalog.

Every API call goes through :func:`~.errors.map_gcp_errors`, with no SDK
retry (``retry=None``): the engine retries by error class, so a throttle or
a 5xx surfaces at once as a retryable spotd error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.drill import drill_target
from spotd.core.errors import NotFoundError, ProviderError, invalid_request
from spotd.core.values import (
    CloudCheck,
    Instance,
    LaunchRequest,
    Market,
    Offering,
    PlacementObject,
    Pool,
)
from spotd.market.ttl import TtlCache

from . import check, naming, nics, placement, resources
from .clients import GcpClients, build_clients
from .drill import simulate_preemption
from .errors import PROVIDER, is_already_exists, map_gcp_errors
from .figures import NOTICE_SECONDS
from .machines import MachineType, list_request, shape_of, wanted_types
from .operations import wait_for
from .prices import PriceBook, list_skus_request
from .settings import GcpSettings, region_of

log = logging.getLogger(__name__)

"""Spot VMs get about 30 s between the preemption notice and the hard stop."""
PREEMPTED_OPERATION = "compute.instances.preempted"
SEEN_LIMIT = 4096

StartupScript = Callable[[LaunchRequest], str]


class GcpProvider:
    """Spot and on-demand GPU VMs in the configured zones of one project.

    Instance ids are ``zone/name``. Capacity is None: GCP publishes no spot
    capacity signal in generally available APIs (the Advice API's
    ``capacity`` is unverified), and a made-up one would mislead the policy.
    ``clock``'s monotonic seconds age the caches and bound the operations' waits.
    """

    name = PROVIDER

    def __init__(
        self,
        settings: GcpSettings,
        *,
        startup_script: StartupScript,
        credentials: Any | None = None,
        clients: GcpClients | None = None,
        clock: Clock = WALL,
    ) -> None:
        self._settings = settings
        self._startup_script = startup_script
        self._credentials = credentials
        self._built = clients
        self._lock = threading.Lock()
        monotonic = clock.monotonic
        self._monotonic = monotonic
        # One key each: the catalog and the zones' machine types are read whole.
        self._catalog: TtlCache[str, PriceBook] = TtlCache(
            settings.catalog_ttl_hours * 3600, monotonic
        )
        self._machines: TtlCache[str, dict[str, list[MachineType]]] = TtlCache(
            settings.machine_types_ttl_hours * 3600, monotonic
        )
        self._seen: dict[str, Instance] = {}
        self._timeout = settings.request_timeout_seconds
        self._policies = placement.GcpPolicies(settings, self._timeout, monotonic)

    def __repr__(self) -> str:
        return f"GcpProvider(project={self._settings.project!r}, zones={self._settings.zones})"

    # -- Provider protocol -------------------------------------------------

    def offerings(self) -> list[Offering]:
        """Every GPU machine type of the configured zones, priced from the catalog."""
        shapes = self._zone_shapes()
        book = self._price_book()
        return [
            self._offering(zone, shape, book)
            for zone, zone_shapes in shapes.items()
            for shape in zone_shapes
        ]

    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Insert ``request.nodes`` VMs in the pool's zone, all or none.

        A gang (nodes > 1) first gets its compact placement policy, and its
        VMs name it and carry their type's GPU NICs. Names and request ids
        derive from the client token, so a retry finds (409) or re-joins
        (same request id) what the first call made. When any node fails, the
        nodes created (and the policy) are deleted and the error raised.
        Nodes that join a running gang (``request.joins``, a node repair) name
        that gang's policy and get its GPU NICs; the policy is neither made nor,
        on a failure, deleted here: the gang's kept nodes are in it.
        """
        self._check(request)
        with invalid_request(PROVIDER, "launch"):
            script = self._startup_script(request)
        zone = request.offering.pool.zone
        clients = self._clients()
        gang = request.nodes > 1 or request.joins is not None
        url = placement.policy_url(clients.project, request) if gang else None
        own_policy = gang and request.joins is None
        # Every body is built (and so validated) before anything is created.
        bodies = [
            resources.insert_request(clients.project, self._settings, request, rank, script,
                                     policy_url=url)
            for rank in range(request.nodes)
        ]
        if own_policy:
            self._policies.ensure(clients, request)
        elif url is not None:
            self._policies.require(clients, url)
        created: list[str] = []
        try:
            operations = []
            for body in bodies:
                operations.append(self._insert(clients, body))
                created.append(body.instance_resource.name)
            for operation in operations:
                if operation is not None:
                    self._wait(clients, zone, operation)
            return self._launched(request, [resources.instance_id(zone, n) for n in created])
        except ProviderError:
            self._delete_quietly(clients, zone, created)
            if own_policy:
                self._delete_policy_quietly(clients, request)
            raise

    def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        """The spotd VMs among ``instance_ids``; unknown ids are left out.

        A VM GCE deleted after preempting it is reported PREEMPTED from its
        preemption operation.
        """
        clients = self._clients()
        preemptions = _Preemptions(self, clients)
        found: list[Instance] = []
        for iid in instance_ids:
            where = _valid_id(iid)
            if where is None:
                continue
            instance = self._describe_one(clients, preemptions, *where)
            if instance is not None:
                found.append(instance)
        self._remember(found)
        return found

    def list_instances(self, tags: Mapping[str, str]) -> list[Instance]:
        """spotd VMs in every zone of the project whose tags include ``tags``.

        Labels filter on the server; the exact tags (metadata) decide. VMs
        GCE already deleted (preempted with action DELETE) are not listed.
        """
        clients = self._clients()
        preemptions = _Preemptions(self, clients)
        request = compute_v1.AggregatedListInstancesRequest(
            project=clients.project, filter=naming.label_filter(tags) or None
        )
        found: list[Instance] = []
        with map_gcp_errors("listing instances"):
            pages = clients.instances.aggregated_list(
                request=request, retry=None, timeout=self._timeout
            )
            for scope, scoped in pages:
                zone = resources.last_segment(scope)
                for vm in scoped.instances:
                    if resources.is_spotd_vm(vm) and _has_tags(vm, tags):
                        found.append(self._to_instance(vm, zone, preemptions))
        found.sort(key=lambda i: (i.launched_at is None, i.launched_at or datetime.min, i.id))
        self._remember(found)
        return found

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Delete these VMs (no wait); ids unknown or already gone are ignored."""
        clients = self._clients()
        for iid in instance_ids:
            where = _valid_id(iid)
            if where is not None:
                self._delete(clients, *where)

    # -- PlacementHost and CloudChecker ------------------------------------------

    def list_placements(self, tags: Mapping[str, str]) -> list[PlacementObject]:
        """spotd's compact placement policies whose stored tags include ``tags``."""
        return self._policies.list(self._clients(), tags)

    def delete_placements(self, placements: Sequence[PlacementObject]) -> None:
        """Delete these policies; gone ones are ignored, one still in use raises."""
        self._policies.delete(self._clients(), placements)

    def check_cloud(self, request: LaunchRequest | None) -> CloudCheck:
        """Check credentials, permissions, quotas, image, and ``request``; create nothing.

        See :mod:`.check`: GCE has no dry run for inserts, so the bodies are
        built with the SDK's types and everything they name is read back.
        """
        try:
            clients = self._clients()
        except ProviderError as exc:
            return check.failed_credentials(exc)
        return check.GcpCloudCheck(self._settings, clients, self._startup_script).run(request)

    def logs(self, instance_id: str) -> str:
        """The VM's serial console (port 1) so far; "" for an unknown VM."""
        where = _valid_id(instance_id)
        if where is None:
            return ""
        clients = self._clients()
        zone, name = where
        try:
            with map_gcp_errors(f"serial output of {instance_id}"):
                output = clients.instances.get_serial_port_output(
                    request=compute_v1.GetSerialPortOutputInstanceRequest(
                        project=clients.project, zone=zone, instance=name, port=1
                    ),
                    retry=None, timeout=self._timeout,
                )  # fmt: skip
        except NotFoundError:
            return ""
        return str(output.contents)

    def drill(self, instance_id: str) -> None:
        """A drill (:class:`~spotd.core.contracts.Driller`): a simulated maintenance event
        preempts this Spot VM with GCE's own notice (:mod:`.drill`)."""
        where = _valid_id(instance_id)
        found = self.describe([instance_id]) if where is not None else []
        drill_target(PROVIDER, instance_id, found)
        assert where is not None  # a VM was found by it
        simulate_preemption(self._clients(), *where, timeout=self._timeout)

    # -- offerings -----------------------------------------------------------

    def _offering(self, zone: str, machine: MachineType, book: PriceBook) -> Offering:
        region = region_of(zone)
        shape = machine.shape
        return Offering(
            pool=Pool(PROVIDER, region, zone, machine.name),
            gpu=shape.gpu,
            gpus_per_node=shape.gpus_per_node,
            gpu_memory_gb=shape.gpu_memory_gb,
            interconnect=shape.interconnect,
            spot_price=book.vm_price(machine, region, Market.SPOT),
            on_demand_price=book.vm_price(machine, region, Market.ON_DEMAND),
            capacity=None,
            notice_seconds=NOTICE_SECONDS,
        )

    def _zone_shapes(self) -> dict[str, list[MachineType]]:
        return self._machines.get_or_load(PROVIDER, self._read_zone_shapes)

    def _read_zone_shapes(self) -> dict[str, list[MachineType]]:
        clients = self._clients()
        wanted = wanted_types(self._settings.machine_types, self._settings.attached_gpus)
        shapes: dict[str, list[MachineType]] = {}
        for zone in self._settings.zones:
            try:
                shapes[zone] = self._shapes_in(clients, zone, wanted)
            except NotFoundError:
                log.warning("gcp: zone %s not found in project: skipped", zone)
        return shapes

    def _shapes_in(
        self, clients: GcpClients, zone: str, wanted: frozenset[str]
    ) -> list[MachineType]:
        with map_gcp_errors(f"machine types of {zone}"):
            pages = clients.machine_types.list(
                request=list_request(clients.project, zone), retry=None, timeout=self._timeout
            )
            shapes = [shape_of(mt, self._settings.attached_gpus) for mt in pages
                      if mt.name in wanted]
        return sorted((s for s in shapes if s is not None), key=lambda s: s.name)

    def _price_book(self) -> PriceBook:
        try:
            return self._catalog.get_or_load(PROVIDER, self._read_price_book)
        except ProviderError as exc:
            stale = self._catalog.last(PROVIDER)
            if stale is None:
                raise
            # A stale catalog beats none: prices change rarely, offerings stay usable.
            log.warning("gcp: catalog refresh failed (%s); keeping the old prices", exc.code)
            return stale

    def _read_price_book(self) -> PriceBook:
        with map_gcp_errors("reading the Cloud Billing catalog"):
            pages = self._clients().catalog.list_skus(
                request=list_skus_request(), retry=None, timeout=self._timeout
            )
            book = PriceBook(pages)
        log.info("gcp: catalog read, %d prices", len(book))
        return book

    # -- launch ----------------------------------------------------------------

    def _check(self, request: LaunchRequest) -> None:
        pool = request.offering.pool
        problem = None
        if pool.provider != PROVIDER:
            problem = f"pool {pool} is not a gcp pool"
        elif request.nodes < 1:
            problem = f"nodes must be at least 1, got {request.nodes}"
        elif not self._settings.image:
            problem = "providers.gcp.image is not set"
        elif len(request.tags) >= naming.MAX_LABELS:
            problem = f"{len(request.tags)} tags: GCP allows at most {naming.MAX_LABELS - 1}"
        if problem is not None:
            raise ProviderError(f"gcp: {problem}", provider=PROVIDER, code="InvalidRequest")
        layout = nics.layout_of(pool.instance_type)
        if (request.nodes > 1 or request.joins is not None) and layout is not None:
            nics.gpu_subnets(self._settings, pool.zone, layout)  # raises when not configured

    def _delete_policy_quietly(self, clients: GcpClients, request: LaunchRequest) -> None:
        region = region_of(request.offering.pool.zone)
        name = placement.policy_name(request.client_token)
        doomed = PlacementObject(placement.placement_id(region, name), placement.KIND, region)
        try:
            self._policies.delete(clients, [doomed])
        except ProviderError as exc:
            # Still in use by VMs being deleted: the engine or the reaper deletes it later.
            log.warning("gcp: resource policy %s not deleted after a failed launch: %s",
                        doomed.id, exc.code)

    def _insert(self, clients: GcpClients, body: compute_v1.InsertInstanceRequest) -> Any | None:
        """Insert one node; its Operation, or None when the VM exists already."""
        name = body.instance_resource.name
        with map_gcp_errors(f"insert {body.zone}/{name}"):
            try:
                return clients.instances.insert_unary(
                    request=body, retry=None, timeout=self._timeout
                )
            except Exception as exc:
                if _already_exists(exc):
                    return None  # launched by an earlier call with this token
                raise

    def _wait(self, clients: GcpClients, zone: str, operation: Any) -> None:
        """Wait for an insert operation to finish; raise its error, if any."""
        def wait(name: str, seconds: float) -> Any:
            return clients.zone_operations.wait(
                project=clients.project, zone=zone, operation=name, retry=None, timeout=seconds
            )

        timeout = self._settings.operation_timeout_seconds
        wait_for(operation, wait, timeout_seconds=timeout, monotonic=self._monotonic)

    def _launched(self, request: LaunchRequest, ids: list[str]) -> list[Instance]:
        instances = self.describe(ids)
        if len(instances) != request.nodes:
            # A request id reused after its VM was deleted answers "done" with no VM.
            raise ProviderError(
                f"gcp: {len(instances)} of {request.nodes} VMs exist after the launch",
                provider=PROVIDER, code="LaunchIncomplete",
            )  # fmt: skip
        return instances

    def _delete_quietly(self, clients: GcpClients, zone: str, names: list[str]) -> None:
        for name in names:
            try:
                self._delete(clients, zone, name)
            except ProviderError as exc:
                log.error("gcp: could not delete %s/%s after a failed launch: %s",
                          zone, name, exc.code)

    def _delete(self, clients: GcpClients, zone: str, name: str) -> None:
        try:
            with map_gcp_errors(f"delete {zone}/{name}"):
                clients.instances.delete_unary(
                    project=clients.project, zone=zone, instance=name,
                    retry=None, timeout=self._timeout,
                )  # fmt: skip
        except NotFoundError:
            return

    # -- reading instances ---------------------------------------------------

    def _describe_one(
        self, clients: GcpClients, preemptions: _Preemptions, zone: str, name: str
    ) -> Instance | None:
        try:
            with map_gcp_errors(f"get {zone}/{name}"):
                vm = clients.instances.get(
                    project=clients.project, zone=zone, instance=name,
                    retry=None, timeout=self._timeout,
                )  # fmt: skip
        except NotFoundError:
            at = preemptions.of(zone).get(name)
            if at is None:
                return None
            known = self._seen.get(resources.instance_id(zone, name))
            return resources.gone_instance(zone, name, at, known)
        if not resources.is_spotd_vm(vm):
            return None  # never report (or let the reaper stop) a VM spotd did not start
        return self._to_instance(vm, zone, preemptions)

    def _to_instance(self, vm: Any, zone: str, preemptions: _Preemptions) -> Instance:
        preempted_at = None
        if str(vm.status) in resources.STOPPED_STATUSES:
            at = preemptions.of(zone).get(str(vm.name))
            started = resources.parse_time(vm.last_start_timestamp)
            # A preemption before the VM's last start belongs to an earlier run.
            if at is not None and (started is None or at >= started):
                preempted_at = at
        return resources.to_instance(vm, zone, preempted_at)

    def _preemptions_in(self, clients: GcpClients, zone: str) -> dict[str, datetime]:
        request = compute_v1.ListZoneOperationsRequest(
            project=clients.project, zone=zone,
            filter=f'operationType = "{PREEMPTED_OPERATION}"',
        )  # fmt: skip
        found: dict[str, datetime] = {}
        with map_gcp_errors(f"preemptions in {zone}"):
            pages = clients.zone_operations.list(request=request, retry=None,
                                                 timeout=self._timeout)
            for op in pages:
                if op.operation_type != PREEMPTED_OPERATION:
                    continue  # the filter is the server's; check it anyway
                when = resources.parse_time(op.end_time) or resources.parse_time(op.insert_time)
                if when is not None:
                    found[resources.last_segment(op.target_link)] = when
        return found

    def _remember(self, instances: list[Instance]) -> None:
        for instance in instances:
            self._seen[instance.id] = instance
        while len(self._seen) > SEEN_LIMIT:
            del self._seen[next(iter(self._seen))]

    def _clients(self) -> GcpClients:
        with self._lock:
            if self._built is None:
                self._built = build_clients(self._settings, self._credentials)
            return self._built


class _Preemptions:
    """Preemption operations per zone, read at most once per describe/list call."""

    def __init__(self, provider: GcpProvider, clients: GcpClients) -> None:
        self._provider = provider
        self._clients = clients
        self._by_zone: dict[str, dict[str, datetime]] = {}

    def of(self, zone: str) -> dict[str, datetime]:
        if zone not in self._by_zone:
            self._by_zone[zone] = self._provider._preemptions_in(self._clients, zone)
        return self._by_zone[zone]


def _valid_id(instance_id: str) -> tuple[str, str] | None:
    """``(zone, name)`` of a well-formed GCP id, None for anything else."""
    where = resources.split_id(instance_id)
    if where is None:
        return None
    zone, name = where
    if zone.count("-") < 2 or not naming.NAME_PATTERN.fullmatch(name):
        return None
    return where


def _has_tags(vm: Any, tags: Mapping[str, str]) -> bool:
    return tags.items() <= resources.tags_of(vm).items()


def _already_exists(exc: Exception) -> bool:
    return isinstance(exc, gexc.GoogleAPICallError) and is_already_exists(exc)


def build_gcp_provider(
    settings: GcpSettings, *, startup_script: StartupScript, credentials: Any | None = None
) -> GcpProvider:
    """A GcpProvider on ``credentials``, else on Application Default Credentials.

    The clients (and ADC lookup) are built on first use, so a daemon starts
    even when credentials are missing; each call then raises AuthError.
    """
    return GcpProvider(settings, startup_script=startup_script, credentials=credentials)
