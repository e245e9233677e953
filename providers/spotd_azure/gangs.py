"""Gangs in scale sets: launch all or nothing, read, stop, and the sets as placement objects.

See :mod:`.scaleset` for why a gang is a scale set. A launch PUTs the set with
``capacity = nodes`` and waits for the long-running operation; when it fails
or ends with fewer VMs than asked (a capacity shortfall), the set is deleted,
VMs and all, and the error raised: a gang is never left half-made. Nodes that
join a running gang (a node repair) scale its set out (:meth:`ScaleSets.join`).
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute.models import (
    Sku,
    VirtualMachineScaleSet,
    VirtualMachineScaleSetUpdate,
    VirtualMachineScaleSetUpdateOSProfile,
    VirtualMachineScaleSetUpdateProperties,
    VirtualMachineScaleSetUpdateVMProfile,
    VirtualMachineScaleSetVM,
    VirtualMachineScaleSetVMInstanceRequiredIDs,
)

from spotd.core.errors import CapacityError, NotFoundError, ProviderError
from spotd.core.values import Instance, PlacementObject

from .addresses import Addresses
from .errors import delete_each, map_azure_errors
from .scaleset import (
    SetFacts,
    facts_of,
    is_set,
    member_id,
    member_of,
    set_of_placement,
    split_member,
)
from .seen import SeenVms
from .vms import PROVIDER

log = logging.getLogger(__name__)

SHORTFALL_CODE = "ScaleSetShortOfCapacity"
"""Our code for a set whose create succeeded with fewer VMs than asked."""


JOIN_TAG = "spotd-join"
"""Tag of a scale set that nodes joined after its launch (a node repair): the join's
token hash and the indexes of the VMs the set had before, ``<hash>:<i>,<i>...``. Only the
last join is kept: an earlier one's attempt has ended, and nothing retries it."""


def join_mark(client_token: str) -> str:
    """The hash a join's client token is known by in :data:`JOIN_TAG`."""
    return hashlib.sha256(client_token.encode()).hexdigest()[:16]


def join_tag(mark: str, before: frozenset[str]) -> tuple[str, str]:
    """The :data:`JOIN_TAG` entry of a join: its mark and the set's VMs before it."""
    return JOIN_TAG, f"{mark}:{','.join(sorted(before, key=int))}"


def joined_before(tags: Mapping[str, str] | None, mark: str) -> frozenset[str] | None:
    """The VM indexes the set had before the join ``mark``; None when it did not join."""
    found, _, indexes = (tags or {}).get(JOIN_TAG, "").partition(":")
    if found != mark:
        return None
    return frozenset(i for i in indexes.split(",") if i)


def _index(instance: Instance) -> str:
    parts = split_member(instance.id)
    return parts[1] if parts is not None else ""


class ScaleSets:
    """The scale set half of the adapter (the VM half is in :mod:`.adapter`)."""

    def __init__(self, compute: ComputeManagementClient, resource_group: str, seen: SeenVms,
                 addresses: Addresses) -> None:  # fmt: skip
        self._compute = compute
        self._rg = resource_group
        self._seen = seen
        self._addresses = addresses

    # -- launch ----------------------------------------------------------------

    def launch(self, body: VirtualMachineScaleSet, name: str, nodes: int) -> list[Instance]:
        """Create (or find) scale set ``name`` with ``nodes`` VMs; all or none.

        A set that already exists and finished is returned as it is (a retried
        launch); one still creating or failed is PUT again, which ARM treats
        as the same request.
        """
        existing = self._get(name)
        if existing is None or facts_of(existing).provisioning.lower() != "succeeded":
            try:
                with map_azure_errors(f"create {name}"):
                    poller = self._compute.virtual_machine_scale_sets.begin_create_or_update(
                        self._rg, name, body
                    )
                with map_azure_errors(f"create {name}"):
                    existing = poller.result()
            except ProviderError:
                self.roll_back(name)
                raise
        members = self.members(name)
        if len([m for m in members if not m.ended]) < nodes:
            self.roll_back(name)
            raise CapacityError(
                f"azure create {name}: {SHORTFALL_CODE}: {len(members)} of {nodes} VMs",
                provider=PROVIDER, code=SHORTFALL_CODE,
            )  # fmt: skip
        return members

    def join(self, name: str, client_token: str, nodes: int, custom_data: str) -> list[Instance]:
        """Scale the running gang's set ``name`` out by ``nodes`` VMs (a node repair), which
        boot with ``custom_data``; the new VMs, all or none.

        Idempotent by ``client_token``: one PATCH marks the set with the token's hash and
        the members it had before (:data:`JOIN_TAG`) as it raises the capacity, so a
        retried join reads back which VMs it added, and adds only those still missing.
        """
        vmss = self._get(name)
        if vmss is None:
            raise NotFoundError(f"azure: scale set {name} of the running gang is gone",
                                provider=PROVIDER, code="ResourceNotFound")  # fmt: skip
        mark = join_mark(client_token)
        members = self.members(name)
        before = joined_before(vmss.tags, mark)
        if before is None:
            before = frozenset(_index(m) for m in members)
            # On top of the set's capacity, not of its live VMs: a lost VM whose delete is
            # still under way counts in it until the delete takes it off.
            base = vmss.sku.capacity if vmss.sku and vmss.sku.capacity is not None else None
            if base is None:
                base = sum(1 for m in members if not m.ended)
            try:
                self._scale(vmss, name, base + nodes, join_tag(mark, before), custom_data)
            except ProviderError:
                self._drop_added(name, before)
                raise
            members = self.members(name)
        added = [m for m in members if _index(m) not in before and not m.ended]
        if len(added) < nodes:
            self._drop_added(name, before)
            raise CapacityError(
                f"azure scale out {name}: {SHORTFALL_CODE}: {len(added)} of {nodes} VMs",
                provider=PROVIDER, code=SHORTFALL_CODE,
            )  # fmt: skip
        return added[:nodes]

    def _drop_added(self, name: str, before: frozenset[str]) -> None:
        """Delete the VMs a failed join added to set ``name`` (not in ``before``): the kept
        ones stay, and the whole gang restarts."""
        try:
            self.terminate([m.id for m in self.members(name) if _index(m) not in before])
        except ProviderError as exc:
            log.warning("azure: VMs of a failed join to %s not deleted (the reaper stops "
                        "them): %s", name, exc)

    def _scale(self, vmss: VirtualMachineScaleSet, name: str, capacity: int,
               mark: tuple[str, str], custom_data: str) -> None:  # fmt: skip
        """One PATCH: the join's mark, the set's new capacity and its new VMs' custom data."""
        sku = vmss.sku or Sku()
        update = VirtualMachineScaleSetUpdate(
            tags={**(vmss.tags or {}), mark[0]: mark[1]},
            sku=Sku(name=sku.name, tier=sku.tier, capacity=capacity),
            properties=VirtualMachineScaleSetUpdateProperties(
                virtual_machine_profile=VirtualMachineScaleSetUpdateVMProfile(
                    os_profile=VirtualMachineScaleSetUpdateOSProfile(custom_data=custom_data))),
        )  # fmt: skip
        with map_azure_errors(f"scale out {name}"):
            poller = self._compute.virtual_machine_scale_sets.begin_update(self._rg, name, update)
        with map_azure_errors(f"scale out {name}"):
            poller.result()

    def roll_back(self, name: str) -> None:
        """Delete a failed gang's scale set (its VMs with it) and wait; log what stays."""
        try:
            with map_azure_errors(f"delete {name}"):
                self._compute.virtual_machine_scale_sets.begin_delete(self._rg, name).result()
        except NotFoundError:
            pass
        except ProviderError as exc:
            log.warning("azure: could not delete scale set %s of a failed launch: %s", name, exc)

    # -- reading ---------------------------------------------------------------

    def members(self, name: str) -> list[Instance]:
        """Every VM of scale set ``name`` now (none when the set is gone)."""
        vmss = self._get(name)
        if vmss is None:
            return []
        facts = facts_of(vmss)
        with map_azure_errors(f"list VMs of {name}"):
            vms = list(self._compute.virtual_machine_scale_set_vms.list(
                self._rg, name, expand="instanceView"))  # fmt: skip
        return self._instances(facts, vms)

    def _instances(self, facts: SetFacts,
                   vms: Sequence[VirtualMachineScaleSetVM]) -> list[Instance]:  # fmt: skip
        ids = {vm.instance_id or "": member_id(facts.name, vm.instance_id or "") for vm in vms}
        addresses = self._addresses.of_set(facts.name, ids)
        found = []
        for vm in vms:
            instance_id = ids[vm.instance_id or ""]
            found.append(self._seen.saw(member_of(facts, vm, addresses.get(instance_id))))
        return found

    def describe(self, instance_ids: Sequence[str]) -> dict[str, Instance]:
        """The members among ``instance_ids``, read one set at a time; gone ones as seen."""
        by_set: dict[str, list[str]] = defaultdict(list)
        for instance_id in instance_ids:
            if (parts := split_member(instance_id)) is not None:
                by_set[parts[0]].append(instance_id)
        found: dict[str, Instance] = {}
        for name, wanted in by_set.items():
            present = {i.id: i for i in self.members(name)}
            for instance_id in wanted:
                instance = present.get(instance_id) or self._seen.gone(instance_id)
                if instance is not None:
                    found[instance_id] = instance
            self._addresses.forget(i for i in wanted if i not in present)
        return found

    def sets(self, tags: Mapping[str, str]) -> list[SetFacts]:
        """spotd's scale sets in the resource group whose tags include ``tags``."""
        with map_azure_errors(f"list scale sets in {self._rg}"):
            listed = list(self._compute.virtual_machine_scale_sets.list(self._rg))
        return [
            facts_of(s) for s in listed
            if s.name and is_set(s.name) and tags.items() <= (s.tags or {}).items()
        ]  # fmt: skip

    def listed(self, tags: Mapping[str, str]) -> list[Instance]:
        """The VMs now in spotd's scale sets with ``tags``."""
        return [i for s in self.sets(tags) for i in self.members(s.name)]

    def _get(self, name: str) -> VirtualMachineScaleSet | None:
        try:
            with map_azure_errors(f"get {name}"):
                return self._compute.virtual_machine_scale_sets.get(self._rg, name)
        except NotFoundError:
            return None

    # -- stopping --------------------------------------------------------------

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Ask ARM to delete these members, one request per set; do not wait.

        Sets already gone are ignored; the first error is raised after every set was tried.
        """
        by_set: dict[str, list[str]] = defaultdict(list)
        for instance_id in instance_ids:
            if (parts := split_member(instance_id)) is not None:
                by_set[parts[0]].append(parts[1])
                self._seen.deleting(instance_id)
        sets = self._compute.virtual_machine_scale_sets

        def members(name: str, indexes: list[str]) -> Callable[[], object]:
            ids = VirtualMachineScaleSetVMInstanceRequiredIDs(instance_ids=indexes)
            return lambda: sets.begin_delete_instances(self._rg, name, ids, polling=False)

        delete_each((f"VMs {indexes} of {name}", members(name, indexes))
                    for name, indexes in by_set.items())  # fmt: skip

    # -- placements ------------------------------------------------------------

    def placements(self, tags: Mapping[str, str]) -> list[PlacementObject]:
        """The scale sets with ``tags`` as placement objects, leaving out those being deleted."""
        return [s.placement for s in self.sets(tags) if s.provisioning.lower() != "deleting"]

    def delete(self, placements: Sequence[PlacementObject]) -> None:
        """Ask ARM to delete these scale sets (and so their VMs); do not wait.

        Ones gone or not ours are ignored; the first error is raised after
        every one was tried. A set whose delete is under way is no longer
        listed by :meth:`placements`.
        """
        sets = self._compute.virtual_machine_scale_sets
        names = [n for n in map(set_of_placement, placements) if n is not None]
        delete_each((name, partial(sets.begin_delete, self._rg, name, polling=False))
                    for name in names)  # fmt: skip
