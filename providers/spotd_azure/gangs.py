"""Gangs in scale sets: launch all or nothing, read, stop, and the sets as placement objects.

See :mod:`.scaleset` for why a gang is a scale set. A launch PUTs the set with
``capacity = nodes`` and waits for the long-running operation; when it fails
or ends with fewer VMs than asked (a capacity shortfall), the set is deleted,
VMs and all, and the error raised: a gang is never left half-made.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute.models import (
    VirtualMachineScaleSet,
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
