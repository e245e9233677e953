"""The Azure provider: GPU VMs from azure-mgmt-compute, prices from the Retail Prices API.

See ``docs/providers-azure.md`` for the APIs called, the RBAC permissions
and the settings. Every SDK call runs inside :func:`map_azure_errors`, so the
methods raise only :class:`~spotd.core.errors.ProviderError` subclasses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial

from azure.core.credentials import TokenCredential
from azure.core.polling import LROPoller
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute.models import VirtualMachine
from azure.mgmt.network import NetworkManagementClient

from spotd.core.drill import drill_target
from spotd.core.errors import NotFoundError, ProviderError, invalid_request
from spotd.core.values import CloudCheck, Instance, LaunchRequest, Offering, PlacementObject, Pool

from .addresses import Addresses
from .check import CloudCheckRun
from .clients import compute_client, default_credential, network_client
from .errors import delete_each, map_azure_errors
from .figures import NOTICE_SECONDS
from .gangs import ScaleSets
from .offerings import offerings_of
from .prices import RetailPrices
from .scaleset import joined_set, set_body, set_name, split_member, uses_scale_set
from .seen import SeenVms
from .settings import AzureSettings, check_launchable
from .skus import places
from .vms import (
    PROVIDER,
    encode_custom_data,
    instance_of,
    is_ours,
    vm_body,
    vm_name,
)

log = logging.getLogger(__name__)

CustomData = Callable[[LaunchRequest], str]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class AzureProvider:
    """Spot and on-demand GPU VMs in the regions of :class:`AzureSettings`.

    ``custom_data`` renders the bootstrap script that starts spotd's agent on
    a node; it is called once per node with ``SPOTD_NODE_RANK`` and
    ``SPOTD_INSTANCE_ID`` added to the request's env. A gang of an
    InfiniBand size goes into one scale set (see :mod:`.scaleset`) whose VMs
    share one script, rendered once without those two: the agent reads its
    id from the metadata service and its rank from the gang's roster.
    ``compute``, ``network`` (for private addresses; None: no addresses) and
    ``prices`` are the clients to use (see :func:`build_azure_provider`).

    Offerings carry no capacity signal (see :func:`offerings_of`) and a
    30-second notice.
    """

    name = PROVIDER

    def __init__(
        self,
        settings: AzureSettings,
        *,
        custom_data: CustomData,
        compute: ComputeManagementClient,
        prices: RetailPrices,
        network: NetworkManagementClient | None = None,
    ) -> None:
        self._settings = settings
        self._custom_data = custom_data
        self._compute = compute
        self._network = network
        self._prices = prices
        self._rg = settings.resource_group
        self._seen = SeenVms()
        self._addresses = Addresses(network, self._rg)
        self._sets = ScaleSets(compute, self._rg, self._seen, self._addresses)

    def __repr__(self) -> str:
        return f"AzureProvider(resource_group={self._rg!r}, regions={self._settings.regions!r})"

    # -- offerings -------------------------------------------------------------

    def offerings(self) -> list[Offering]:
        """GPU sizes deployable per region and zone, with Linux spot and on-demand prices."""
        found: list[Offering] = []
        for region in self._settings.regions:
            with map_azure_errors(f"list SKUs in {region}"):
                skus = list(self._compute.resource_skus.list(filter=f"location eq '{region}'"))
            for place in places(skus, region, self._settings.size_list()):
                found += offerings_of(place, self._prices.prices(region, place.size))
        return found

    # -- launch ----------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Create ``request.nodes`` VMs in the offering's zone, all or none.

        A multi-node InfiniBand gang is one scale set (see :mod:`.gangs`);
        other launches are single VMs. Names come from the client token, so
        a repeated request finds the VMs of the first (read before any write)
        and creates only those missing. When any node fails, every node of the
        launch is deleted (waiting for the deletes) and the first error is raised.
        Nodes that join a running gang (``request.joins``, a node repair) of a scale
        set are new members of that set: the same placement group and fabric.
        """
        pool = self._check(request)
        joined = joined_set(request)
        if joined is not None:
            return self._join_set(request, joined)
        if uses_scale_set(request):
            return self._launch_set(request, pool)
        names = [vm_name(request.client_token, rank) for rank in range(request.nodes)]
        existing = self._existing(names)
        missing = [n for n in names if n not in existing]
        if missing:
            bodies = {n: self._body(request, pool, n, names.index(n)) for n in missing}
            try:
                created = self._create(bodies)
            except ProviderError:
                self._roll_back(names)
                raise
            existing.update(created)
        for vm in existing.values():
            self._seen.saw(instance_of(vm))
        return self.describe(names)

    def _check(self, request: LaunchRequest) -> Pool:
        pool = request.offering.pool
        problem = None
        if pool.provider != PROVIDER:
            problem = f"pool {pool} is not an Azure pool"
        elif pool.region not in self._settings.subnet_id:
            problem = f"no subnet configured for region {pool.region}"
        elif request.nodes < 1:
            problem = f"nodes must be at least 1, got {request.nodes}"
        if problem:
            raise ProviderError(f"azure launch: {problem}", provider=PROVIDER,
                                code="InvalidParameter")  # fmt: skip
        return pool

    def _body(self, request: LaunchRequest, pool: Pool, name: str, rank: int) -> VirtualMachine:
        node = replace(request, env={**request.env, "SPOTD_NODE_RANK": str(rank),
                                     "SPOTD_INSTANCE_ID": name})  # fmt: skip
        with invalid_request(PROVIDER, "launch"):
            data = encode_custom_data(self._custom_data(node))
        return vm_body(self._settings, pool, market=request.market, name=name, tags=request.tags,
                       custom_data=data)  # fmt: skip

    def _launch_set(self, request: LaunchRequest, pool: Pool) -> list[Instance]:
        name = set_name(request.client_token)
        with invalid_request(PROVIDER, "launch"):
            data = encode_custom_data(self._custom_data(request))
        body = set_body(self._settings, pool, market=request.market, name=name,
                        nodes=request.nodes, tags=request.tags, custom_data=data)  # fmt: skip
        return self._sets.launch(body, name, request.nodes)

    def _join_set(self, request: LaunchRequest, name: str) -> list[Instance]:
        """New members of the running gang's scale set ``name``, booting as ``request``'s."""
        with invalid_request(PROVIDER, "launch"):
            data = encode_custom_data(self._custom_data(request))
        return self._sets.join(name, request.client_token, request.nodes, data)

    def _existing(self, names: Sequence[str]) -> dict[str, VirtualMachine]:
        found = {}
        for name in names:
            vm = self._get(name, expand=None)
            if vm is not None:
                found[name] = vm
        return found

    def _create(self, bodies: Mapping[str, VirtualMachine]) -> dict[str, VirtualMachine]:
        """PUT every VM, then wait for all; raise the first error after all settled."""
        pollers: dict[str, LROPoller[VirtualMachine]] = {}
        first: ProviderError | None = None
        for name, body in bodies.items():
            try:
                with map_azure_errors(f"create {name}"):
                    pollers[name] = self._compute.virtual_machines.begin_create_or_update(
                        self._rg, name, body
                    )
            except ProviderError as exc:
                first = exc
                break  # create no more; wait for those started, then roll back
        created = {}
        for name, poller in pollers.items():
            try:
                with map_azure_errors(f"create {name}"):
                    created[name] = poller.result()
            except ProviderError as exc:
                first = first or exc
        if first is not None:
            raise first
        return created

    def _roll_back(self, names: Sequence[str]) -> None:
        """Delete every VM of a failed launch and wait; log what could not be deleted."""
        pollers = {}
        for name in names:
            try:
                with map_azure_errors(f"delete {name}"):
                    pollers[name] = self._compute.virtual_machines.begin_delete(self._rg, name)
            except NotFoundError:
                continue
            except ProviderError as exc:
                log.warning("azure: could not delete %s of a failed launch: %s", name, exc)
        for name, poller in pollers.items():
            try:
                with map_azure_errors(f"delete {name}"):
                    poller.result()
            except NotFoundError:
                continue
            except ProviderError as exc:
                log.warning("azure: deleting %s of a failed launch failed: %s", name, exc)
        self._seen.forget(names)

    # -- reading ---------------------------------------------------------------

    def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        """The state of these VMs, in order; ids never ours or unknown and gone are left out."""
        members = self._sets.describe([i for i in instance_ids if split_member(i)])
        found = []
        for name in instance_ids:
            instance = members.get(name) or (self._read(name) if is_ours(name) else None)
            if instance is not None:
                found.append(instance)
        return found

    def list_instances(self, tags: Mapping[str, str]) -> list[Instance]:
        """spotd's VMs in the resource group whose tags include ``tags``, ended ones too.

        Ended includes VMs this process saw that are gone (evicted or deleted).
        """
        with map_azure_errors(f"list VMs in {self._rg}"):
            listed = list(self._compute.virtual_machines.list(self._rg))
        names = [
            vm.name for vm in listed
            if vm.name and is_ours(vm.name) and tags.items() <= (vm.tags or {}).items()
        ]  # fmt: skip
        members = self._sets.listed(tags)
        known = set(names) | {i.id for i in members}
        found = members + self.describe(names + self._seen.known_except(known, tags))
        return sorted(found, key=lambda i: (i.launched_at or _EPOCH, i.id))

    def _read(self, name: str) -> Instance | None:
        vm = self._get(name, expand="instanceView")
        if vm is None:
            self._addresses.forget([name])
            return self._seen.gone(name)
        nics = vm.properties.network_profile.network_interfaces or [] \
            if vm.properties and vm.properties.network_profile else []  # fmt: skip
        address = self._addresses.of_vm(name, [n.id for n in nics if n.id])
        return self._seen.saw(replace(instance_of(vm), private_address=address))

    def _get(self, name: str, *, expand: str | None) -> VirtualMachine | None:
        try:
            with map_azure_errors(f"get {name}"):
                return self._compute.virtual_machines.get(self._rg, name, expand=expand)
        except NotFoundError:
            return None

    # -- stopping --------------------------------------------------------------

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Ask ARM to delete these VMs (with their NIC and disk); do not wait.

        Ids not ours and VMs already gone are ignored. The first error is
        raised after every id was tried.
        """
        first: ProviderError | None = None
        try:
            self._sets.terminate(instance_ids)
        except ProviderError as exc:
            first = exc
        ours = list(filter(is_ours, instance_ids))
        for name in ours:
            self._seen.deleting(name)
        vms = self._compute.virtual_machines
        try:
            delete_each((name, partial(vms.begin_delete, self._rg, name, polling=False))
                        for name in ours)  # fmt: skip
        except ProviderError as exc:
            first = first or exc
        if first is not None:
            raise first

    # -- placements and checks ----------------------------------------------

    def list_placements(self, tags: Mapping[str, str]) -> list[PlacementObject]:
        """spotd's scale sets in the resource group whose tags include ``tags``.

        Sets whose delete is under way are left out: they are going.
        """
        return self._sets.placements(tags)

    def delete_placements(self, placements: Sequence[PlacementObject]) -> None:
        """Ask ARM to delete these scale sets with their VMs; gone ones are ignored."""
        self._sets.delete(placements)

    def check_cloud(self, request: LaunchRequest | None) -> CloudCheck:
        """Credentials, permissions, quotas, SKU, image and the request; creates nothing."""
        return CloudCheckRun(self._settings, self._compute, self._custom_data).run(request)

    def logs(self, instance_id: str) -> str:
        """Always "": Azure keeps no job output; the on-VM agent ships it."""
        return ""

    def drill(self, instance_id: str) -> None:
        """A drill (:class:`~spotd.core.contracts.Driller`): Azure's simulated eviction of
        this Spot VM, or scale-set VM, which gets the ``Preempt`` scheduled event and is
        evicted when its notice is over."""
        drill_target(PROVIDER, instance_id, self.describe([instance_id]))
        member = split_member(instance_id)
        with map_azure_errors(f"simulate eviction of {instance_id}"):
            if member is not None:
                self._compute.virtual_machine_scale_set_vms.simulate_eviction(self._rg, *member)
            else:
                self._compute.virtual_machines.simulate_eviction(self._rg, instance_id)

    def close(self) -> None:
        """Close the SDK and HTTP clients."""
        self._compute.close()
        if self._network is not None:
            self._network.close()
        self._prices.close()


def build_azure_provider(
    settings: AzureSettings,
    *,
    custom_data: CustomData,
    credential: TokenCredential | None = None,
) -> AzureProvider:
    """The Azure provider for ``settings``; raises ConfigError when they cannot launch.

    ``credential`` defaults to ``DefaultAzureCredential`` (nothing is read
    from spotd's configuration).
    """
    check_launchable(settings)
    credential = credential or default_credential()
    compute = compute_client(settings, credential)
    network = network_client(settings, credential)
    prices = RetailPrices(settings.prices_url)
    return AzureProvider(settings, custom_data=custom_data, compute=compute, prices=prices,
                         network=network)  # fmt: skip


__all__ = ["NOTICE_SECONDS", "AzureProvider", "CustomData", "build_azure_provider"]
