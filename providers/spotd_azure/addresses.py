"""Private addresses of spotd's VMs, read from their NICs with azure-mgmt-network.

The compute API returns a VM's NIC by reference only, never its address
(neither the model nor the instance view carries one), so the network API is
asked: one ``GET`` per VM, or for a scale set one list of all its VMs' NICs
(``.../virtualMachineScaleSets/{name}/networkInterfaces``). A VM keeps its
private address for its whole life, so each is asked once and cached.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from azure.mgmt.network import NetworkManagementClient
from azure.mgmt.network.models import NetworkInterface

from spotd.core.errors import NotFoundError

from .errors import map_azure_errors


def primary_address(nic: NetworkInterface) -> str | None:
    """The private address of the NIC's primary IP configuration (else the first)."""
    configs = list((nic.properties.ip_configurations if nic.properties else None) or [])
    configs.sort(key=lambda c: not (c.properties and c.properties.primary))
    for config in configs:
        address = config.properties.private_ip_address if config.properties else None
        if address:
            return str(address)
    return None


def _owner_index(nic: NetworkInterface) -> str | None:
    """The scale set instance id of the VM a NIC belongs to (``.../virtualMachines/{id}``)."""
    vm = nic.properties.virtual_machine if nic.properties else None
    vm_id = (vm.id if vm else None) or ""
    return vm_id.rstrip("/").rsplit("/", 1)[-1] or None


class Addresses:
    """Cached private addresses of VMs, keyed by spotd instance id; thread-safe."""

    def __init__(self, network: NetworkManagementClient | None, resource_group: str) -> None:
        self._network = network
        self._rg = resource_group
        self._known: dict[str, str] = {}
        self._lock = threading.Lock()

    def known(self, instance_id: str) -> str | None:
        """The cached address of ``instance_id``, None when not asked yet."""
        with self._lock:
            return self._known.get(instance_id)

    def of_vm(self, instance_id: str, nic_ids: Iterable[str]) -> str | None:
        """The address of a single VM from its first NIC (by resource id); None if unknown."""
        if (cached := self.known(instance_id)) is not None or self._network is None:
            return cached
        for nic_id in nic_ids:
            name = nic_id.rstrip("/").rsplit("/", 1)[-1]
            try:
                with map_azure_errors(f"get NIC {name}"):
                    nic = self._network.network_interfaces.get(self._rg, name)
            except NotFoundError:
                continue  # the NIC is not created yet (or already deleted)
            address = primary_address(nic)
            if address:
                return self._keep(instance_id, address)
        return None

    def of_set(self, set_name: str, ids: Mapping[str, str]) -> dict[str, str]:
        """Addresses of a scale set's VMs: ``ids`` maps VM instance id -> spotd instance id."""
        found = {i: a for i in ids.values() if (a := self.known(i)) is not None}
        if len(found) == len(ids) or self._network is None:
            return found
        try:
            with map_azure_errors(f"list NICs of {set_name}"):
                operations = self._network.network_interfaces
                nics = list(operations.list_virtual_machine_scale_set_network_interfaces(
                    self._rg, set_name))  # fmt: skip
        except NotFoundError:
            return found
        for nic in nics:
            index = _owner_index(nic)
            address = primary_address(nic)
            if index is not None and index in ids and address:
                found[ids[index]] = self._keep(ids[index], address)
        return found

    def forget(self, instance_ids: Iterable[str]) -> None:
        """Drop the addresses of VMs that are gone (their address may be reused)."""
        with self._lock:
            for instance_id in instance_ids:
                self._known.pop(instance_id, None)

    def _keep(self, instance_id: str, address: str) -> str:
        with self._lock:
            self._known[instance_id] = address
        return address
