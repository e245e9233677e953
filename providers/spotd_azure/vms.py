"""Azure VMs as spotd sees them: names, the create body, and states.

Instance ids are VM names, derived from the launch's client token and the
node's rank (``spotd-<16 hex of sha256(token)>-<rank>``): a retried launch
computes the same names, and ARM's PUT is idempotent by name, so nothing is
ever created twice. Names are 6 + 16 + 1 + rank digits, far under Azure's
64-character limit, and only ``[a-z0-9-]``.

The NIC of each VM is created by the compute API itself from a
``networkInterfaceConfigurations`` entry (``networkApiVersion`` set), with
``deleteOption: Delete`` on NIC and OS disk: deleting or evicting the VM
leaves nothing behind, and spotd needs no network SDK.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable, Mapping
from datetime import datetime

from azure.mgmt.compute.models import (
    BillingProfile,
    HardwareProfile,
    ImageReference,
    InstanceViewStatus,
    LinuxConfiguration,
    NetworkProfile,
    OSDisk,
    OSProfile,
    SshConfiguration,
    SshPublicKey,
    StorageProfile,
    SubResource,
    VirtualMachine,
    VirtualMachineNetworkInterfaceConfiguration,
    VirtualMachineNetworkInterfaceConfigurationProperties,
    VirtualMachineNetworkInterfaceIPConfiguration,
    VirtualMachineNetworkInterfaceIPConfigurationProperties,
    VirtualMachineProperties,
)

from spotd.core.values import Instance, InstanceState, Market, Pool

from .settings import AzureSettings

PROVIDER = "azure"
NAME_PREFIX = "spotd-"
NAME_RE = re.compile(r"^spotd-[0-9a-f]{16}-[0-9]{1,4}$")
NETWORK_API_VERSION = "2022-11-01"
"""Version of the network API the compute API uses to create the NICs."""
MAX_CUSTOM_DATA = 65535
"""Azure's limit on custom data, in bytes before base64."""


def vm_name(client_token: str, rank: int) -> str:
    """The VM name of node ``rank`` of the launch with ``client_token``."""
    digest = hashlib.sha256(client_token.encode()).hexdigest()[:16]
    return f"{NAME_PREFIX}{digest}-{rank}"


def is_ours(instance_id: str) -> bool:
    """Whether ``instance_id`` is a name spotd gives (so it is safe to put in a URL)."""
    return NAME_RE.match(instance_id) is not None


def zone_name(region: str, zone: str | None) -> str:
    """The pool's zone: ``eastus-1``, or the region itself where it has no zones."""
    return f"{region}-{zone}" if zone else region


def azure_zone(pool: Pool) -> str | None:
    """The Azure zone number of a pool, None for a regional (zoneless) pool."""
    return None if pool.zone == pool.region else pool.zone.removeprefix(f"{pool.region}-")


def encode_custom_data(text: str) -> str:
    """Custom data as the API wants it (base64), checked against Azure's size limit."""
    raw = text.encode()
    if len(raw) > MAX_CUSTOM_DATA:
        raise ValueError(f"custom data is {len(raw)} bytes, Azure takes at most {MAX_CUSTOM_DATA}")
    return base64.b64encode(raw).decode("ascii")


def _network(settings: AzureSettings, region: str, name: str) -> NetworkProfile:
    ip = VirtualMachineNetworkInterfaceIPConfiguration(
        name="ipconfig1",
        properties=VirtualMachineNetworkInterfaceIPConfigurationProperties(
            subnet=SubResource(id=settings.subnet_id[region]), primary=True
        ),
    )
    nic = VirtualMachineNetworkInterfaceConfiguration(
        name=f"{name}-nic",
        properties=VirtualMachineNetworkInterfaceConfigurationProperties(
            ip_configurations=[ip], primary=True, delete_option="Delete",
            enable_accelerated_networking=True,
        ),
    )  # fmt: skip
    return NetworkProfile(network_api_version=NETWORK_API_VERSION,
                          network_interface_configurations=[nic])  # fmt: skip


def linux_configuration(settings: AzureSettings) -> LinuxConfiguration:
    """SSH key login only for the admin user (VMs and scale sets alike)."""
    user = settings.admin_username
    key = SshPublicKey(path=f"/home/{user}/.ssh/authorized_keys", key_data=settings.ssh_public_key)
    return LinuxConfiguration(disable_password_authentication=True,
                              ssh=SshConfiguration(public_keys=[key]))  # fmt: skip


def _os_profile(settings: AzureSettings, name: str, custom_data: str) -> OSProfile:
    return OSProfile(computer_name=name, admin_username=settings.admin_username,
                     custom_data=custom_data,
                     linux_configuration=linux_configuration(settings))  # fmt: skip


SPOT_MAX_PRICE = -1.0
"""-1: never evicted for price; pay the spot price, at most the on-demand one."""


def vm_body(
    settings: AzureSettings,
    pool: Pool,
    *,
    market: Market,
    name: str,
    tags: Mapping[str, str],
    custom_data: str,
) -> VirtualMachine:
    """The PUT body of one node: size, image, NIC, custom data, and spot terms."""
    image = ImageReference(**settings.image)
    storage = StorageProfile(
        image_reference=image,
        os_disk=OSDisk(create_option="FromImage", delete_option="Delete"),
    )
    properties = VirtualMachineProperties(
        hardware_profile=HardwareProfile(vm_size=pool.instance_type),
        storage_profile=storage,
        os_profile=_os_profile(settings, name, custom_data),
        network_profile=_network(settings, pool.region, name),
    )
    if market is Market.SPOT:
        properties.priority = "Spot"
        properties.eviction_policy = "Delete"
        properties.billing_profile = BillingProfile(max_price=SPOT_MAX_PRICE)
    else:
        properties.priority = "Regular"
    zone = azure_zone(pool)
    return VirtualMachine(
        location=pool.region, tags=dict(tags), zones=[zone] if zone else None,
        properties=properties,
    )  # fmt: skip


def power_state(statuses: Iterable[InstanceViewStatus] | None) -> str:
    """The ``PowerState/<x>`` code's x (lower case) among ``statuses``, "" when none is."""
    for status in statuses or []:
        code = (status.code or "").lower()
        if code.startswith("powerstate/"):
            return code.removeprefix("powerstate/")
    return ""


def is_spot_priority(priority: str | None) -> bool:
    """Spot for Spot (and the retired Low) priority."""
    return (priority or "Regular").lower() in ("spot", "low")


def market_of(vm: VirtualMachine) -> Market:
    """Spot for Spot (and the retired Low) priority, on-demand otherwise."""
    priority = vm.properties.priority if vm.properties else None
    return Market.SPOT if is_spot_priority(priority) else Market.ON_DEMAND


def state_from(power: str, provisioning: str | None, market: Market) -> InstanceState:
    """The instance state of a VM (single or in a scale set) from its power and provisioning.

    spotd never stops or deallocates VMs (it deletes them), so a Spot VM
    deallocating or deallocated was evicted: PREEMPTED. Deleting, stopped or
    deallocated otherwise: TERMINATED. Running: RUNNING. A failed create
    that is not running: TERMINATED. Anything else (creating, starting,
    no instance view yet): PENDING.
    """
    provisioning = (provisioning or "").lower()
    if market is Market.SPOT and power in ("deallocating", "deallocated"):
        return InstanceState.PREEMPTED
    if provisioning == "deleting" or power in ("stopping", "stopped", "deallocating",
                                               "deallocated"):  # fmt: skip
        return InstanceState.TERMINATED
    if power == "running":
        return InstanceState.RUNNING
    if provisioning == "failed":
        return InstanceState.TERMINATED
    return InstanceState.PENDING


def state_of(vm: VirtualMachine) -> InstanceState:
    """The instance state read from the VM's instance view and provisioning state."""
    props = vm.properties
    view = props.instance_view if props else None
    return state_from(power_state(view.statuses if view else None),
                      props.provisioning_state if props else None, market_of(vm))  # fmt: skip


def pool_of(vm: VirtualMachine) -> Pool:
    """The pool a VM runs in, from its location, zone and size."""
    region = (vm.location or "").lower()
    zones = vm.zones or []
    hardware = vm.properties.hardware_profile if vm.properties else None
    size = str(hardware.vm_size) if hardware and hardware.vm_size else ""
    return Pool(PROVIDER, region, zone_name(region, zones[0] if zones else None), size)


def created_at(vm: VirtualMachine) -> datetime | None:
    """When Azure created the VM (``timeCreated``), None when not told."""
    return vm.properties.time_created if vm.properties else None


def instance_of(vm: VirtualMachine, state: InstanceState | None = None) -> Instance:
    """The spotd instance of a VM read with its instance view."""
    return Instance(
        id=vm.name or "", pool=pool_of(vm), market=market_of(vm),
        state=state or state_of(vm), tags=dict(vm.tags or {}), launched_at=created_at(vm),
    )  # fmt: skip
