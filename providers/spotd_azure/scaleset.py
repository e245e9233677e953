"""Scale sets for multi-node InfiniBand gangs: names, the create body, and their VMs.

Azure Spot VMs cannot join an availability set (``AzureSpotVMNotSupportedInAvailabilitySet``),
so a spot ND gang is one Uniform scale set with ``singlePlacementGroup: true``:
every VM of a single placement group sits on one InfiniBand fabric. The set
is named after the launch's client token (``spotd-<16 hex>-ss``), so a retried
launch PUTs the same name and ARM creates nothing twice.

A VM of the set is the instance ``<set name>_<instanceId>``: what the VM's
metadata service calls it (``compute/name``), so the on-VM agent finds its own
id without being told, only ``[a-z0-9_-]`` (safe in a URL), and unique in the
resource group because the set's name is.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from azure.mgmt.compute.models import (
    ApiEntityReference,
    BillingProfile,
    ImageReference,
    Sku,
    UpgradePolicy,
    VirtualMachineScaleSet,
    VirtualMachineScaleSetIPConfiguration,
    VirtualMachineScaleSetIPConfigurationProperties,
    VirtualMachineScaleSetNetworkConfiguration,
    VirtualMachineScaleSetNetworkConfigurationProperties,
    VirtualMachineScaleSetNetworkProfile,
    VirtualMachineScaleSetOSDisk,
    VirtualMachineScaleSetOSProfile,
    VirtualMachineScaleSetProperties,
    VirtualMachineScaleSetStorageProfile,
    VirtualMachineScaleSetVM,
    VirtualMachineScaleSetVMProfile,
)

from spotd.core.network import Fabric
from spotd.core.values import Instance, LaunchRequest, Market, PlacementObject, Pool

from .settings import AzureSettings
from .vms import (
    NAME_PREFIX,
    PROVIDER,
    SPOT_MAX_PRICE,
    azure_zone,
    is_spot_priority,
    linux_configuration,
    power_state,
    state_from,
    zone_name,
)

PLACEMENT_KIND = "vm-scale-set"
SET_SUFFIX = "-ss"
SET_RE = re.compile(r"^spotd-[0-9a-f]{16}-ss$")
MEMBER_RE = re.compile(r"^(?P<set>spotd-[0-9a-f]{16}-ss)_(?P<index>[0-9]{1,6})$")


def uses_scale_set(request: LaunchRequest) -> bool:
    """Whether a launch goes into a scale set: a gang of an InfiniBand size.

    Only an InfiniBand gang gains from one placement group; single nodes and
    Ethernet gangs keep plain VMs (no extra object to create and delete).
    """
    return request.nodes > 1 and request.offering.interconnect.fabric is Fabric.INFINIBAND


def joined_set(request: LaunchRequest) -> str | None:
    """The scale set a launch's nodes join: that of the running gang it joins (a node
    repair), when its kept nodes are members of the set the gang's first launch made;
    None for a new gang, or one of plain VMs (its new nodes are plain VMs too)."""
    if request.joins is None:
        return None
    name = set_name(request.joins.client_token)
    kept = {parts[0] for i in request.joins.instance_ids if (parts := split_member(i))}
    return name if name in kept else None


def set_name(client_token: str) -> str:
    """The scale set of the launch with ``client_token``."""
    digest = hashlib.sha256(client_token.encode()).hexdigest()[:16]
    return f"{NAME_PREFIX}{digest}{SET_SUFFIX}"


def is_set(name: str) -> bool:
    """Whether ``name`` is a scale set name spotd gives."""
    return SET_RE.match(name) is not None


def member_id(set_name_: str, instance_id: str) -> str:
    """The spotd instance id of VM ``instance_id`` of a scale set."""
    return f"{set_name_}_{instance_id}"


def split_member(instance_id: str) -> tuple[str, str] | None:
    """(set name, VM instance id) of a scale set member id, None for any other id."""
    match = MEMBER_RE.match(instance_id)
    return (match["set"], match["index"]) if match else None


def placement_id(region: str, name: str) -> str:
    """The PlacementObject id of a scale set: region and name (unique in the provider)."""
    return f"{region}/{name}"


def set_of_placement(placement: PlacementObject) -> str | None:
    """The scale set name a PlacementObject stands for; None when it is not one of ours."""
    name = placement.id.rsplit("/", 1)[-1]
    return name if placement.kind == PLACEMENT_KIND and is_set(name) else None


def _network(
    settings: AzureSettings, region: str, name: str
) -> VirtualMachineScaleSetNetworkProfile:
    ip = VirtualMachineScaleSetIPConfiguration(
        name="ipconfig1",
        properties=VirtualMachineScaleSetIPConfigurationProperties(
            subnet=ApiEntityReference(id=settings.subnet_id[region]), primary=True
        ),
    )
    # Accelerated networking (SR-IOV) for the Ethernet side; the InfiniBand
    # HCAs of an ND size come with the size itself and need no NIC entry.
    nic = VirtualMachineScaleSetNetworkConfiguration(
        name=f"{name}-nic",
        properties=VirtualMachineScaleSetNetworkConfigurationProperties(
            ip_configurations=[ip], primary=True, enable_accelerated_networking=True
        ),
    )
    return VirtualMachineScaleSetNetworkProfile(network_interface_configurations=[nic])


def set_body(
    settings: AzureSettings,
    pool: Pool,
    *,
    market: Market,
    name: str,
    nodes: int,
    tags: Mapping[str, str],
    custom_data: str,
) -> VirtualMachineScaleSet:
    """The PUT body of a gang's scale set: ``nodes`` VMs in one placement group."""
    storage = VirtualMachineScaleSetStorageProfile(
        image_reference=ImageReference(**settings.image),
        # A Uniform set's OS disks belong to its VMs: deleted with them.
        os_disk=VirtualMachineScaleSetOSDisk(create_option="FromImage"),
    )
    os_profile = VirtualMachineScaleSetOSProfile(
        # Azure appends a 6-character index to the prefix for each VM.
        computer_name_prefix=name.removesuffix(SET_SUFFIX),
        admin_username=settings.admin_username,
        custom_data=custom_data,
        linux_configuration=linux_configuration(settings),
    )
    profile = VirtualMachineScaleSetVMProfile(
        storage_profile=storage,
        os_profile=os_profile,
        network_profile=_network(settings, pool.region, name),
    )
    if market is Market.SPOT:
        profile.priority = "Spot"
        profile.eviction_policy = "Delete"
        profile.billing_profile = BillingProfile(max_price=SPOT_MAX_PRICE)
    else:
        profile.priority = "Regular"
    properties = VirtualMachineScaleSetProperties(
        orchestration_mode="Uniform",
        # One placement group = one InfiniBand fabric (at most 100 VMs).
        single_placement_group=True,
        # Exactly ``nodes`` VMs: extra ones would join the gang's fabric and bill.
        overprovision=False,
        platform_fault_domain_count=1,
        upgrade_policy=UpgradePolicy(mode="Manual"),
        virtual_machine_profile=profile,
    )
    zone = azure_zone(pool)
    return VirtualMachineScaleSet(
        location=pool.region, tags=dict(tags), zones=[zone] if zone else None,
        sku=Sku(name=pool.instance_type, tier="Standard", capacity=nodes),
        properties=properties,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class SetFacts:
    """What every VM of one scale set shares: where, what, on which terms, tags."""

    name: str
    pool: Pool
    market: Market
    tags: Mapping[str, str]
    provisioning: str

    @property
    def placement(self) -> PlacementObject:
        """The scale set as the gang's placement object."""
        return PlacementObject(id=placement_id(self.pool.region, self.name), kind=PLACEMENT_KIND,
                               region=self.pool.region, tags=dict(self.tags))  # fmt: skip


def facts_of(vmss: VirtualMachineScaleSet) -> SetFacts:
    """The shared facts of a scale set read from ARM."""
    region = (vmss.location or "").lower()
    zones = vmss.zones or []
    props = vmss.properties
    profile = props.virtual_machine_profile if props else None
    market = Market.SPOT if is_spot_priority(profile.priority if profile else None) \
        else Market.ON_DEMAND  # fmt: skip
    size = (vmss.sku.name if vmss.sku else None) or ""
    pool = Pool(PROVIDER, region, zone_name(region, zones[0] if zones else None), size)
    return SetFacts(name=vmss.name or "", pool=pool, market=market, tags=dict(vmss.tags or {}),
                    provisioning=((props.provisioning_state if props else None) or ""))  # fmt: skip


def member_of(facts: SetFacts, vm: VirtualMachineScaleSetVM, address: str | None) -> Instance:
    """The spotd instance of one VM of a scale set (read with its instance view).

    Tags are the set's: they are what spotd gave, and a member's own tags
    are a copy of them.
    """
    props = vm.properties
    view = props.instance_view if props else None
    state = state_from(power_state(view.statuses if view else None),
                       props.provisioning_state if props else None, facts.market)  # fmt: skip
    return Instance(
        id=member_id(facts.name, vm.instance_id or ""), pool=facts.pool, market=facts.market,
        state=state, tags=dict(facts.tags), launched_at=props.time_created if props else None,
        private_address=address,
    )  # fmt: skip
