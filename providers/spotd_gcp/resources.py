"""Translating between spotd's launch requests / instances and GCE's Instance resource.

State mapping (GCE ``status`` -> :class:`~spotd.core.values.InstanceState`):

- PROVISIONING, STAGING, REPAIRING -> PENDING (not running the job yet)
- RUNNING -> RUNNING (GCE's API gives no advance notice of a preemption;
  the 30 s warning is only on the VM's metadata server, so never NOTICE)
- STOPPING, STOPPED, SUSPENDING, SUSPENDED, TERMINATED -> PREEMPTED when a
  ``compute.instances.preempted`` zone operation for the VM exists, else
  TERMINATED (spotd itself only ever deletes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from google.cloud import compute_v1

from spotd.core.errors import InvalidRequestError
from spotd.core.values import Instance, InstanceState, LaunchRequest, Market, Pool

from . import machines, nics
from .naming import LAUNCH_LABEL, instance_name, labels_for, request_id
from .settings import GcpSettings, region_of

PROVIDER = "gcp"
TAGS_KEY = "spotd-tags"
"""Metadata key holding the exact spotd tags as JSON (labels are lossy)."""
RANK_KEY = "spotd-node-rank"
NODES_KEY = "spotd-nodes"
STARTUP_KEY = "startup-script"

MIN_RUN_SECONDS = 30
MAX_RUN_SECONDS = 120 * 24 * 3600
"""GCE's bounds of ``max_run_duration``: 30 s to 120 days."""

STOPPED_STATUSES = frozenset({"STOPPING", "STOPPED", "SUSPENDING", "SUSPENDED", "TERMINATED"})


def scheduling(
    market: Market, termination_action: str, max_run_seconds: int | None = None
) -> compute_v1.Scheduling:
    """Spot: SPOT with the termination action; on-demand: standard, no live migration.

    ``max_run_seconds`` becomes ``max_run_duration``: GCE then ends the VM with
    the termination action after that long, whatever spotd does.
    """
    if market is Market.SPOT:
        sched = compute_v1.Scheduling(
            provisioning_model="SPOT",
            instance_termination_action=termination_action,
            on_host_maintenance="TERMINATE",
            automatic_restart=False,
        )
    else:
        # GPU VMs cannot live-migrate: TERMINATE on maintenance is required for them too.
        sched = compute_v1.Scheduling(
            provisioning_model="STANDARD", on_host_maintenance="TERMINATE"
        )
    if max_run_seconds is not None:
        if not MIN_RUN_SECONDS <= max_run_seconds <= MAX_RUN_SECONDS:
            raise InvalidRequestError(
                f"gcp: max_run_seconds {max_run_seconds} is outside GCE's "
                f"{MIN_RUN_SECONDS}..{MAX_RUN_SECONDS} s", provider=PROVIDER,
            )  # fmt: skip
        sched.max_run_duration = compute_v1.Duration(seconds=max_run_seconds)
        # A limit needs an action, on-demand VMs too.
        sched.instance_termination_action = termination_action
    return sched


def instance_resource(
    settings: GcpSettings, request: LaunchRequest, rank: int, startup_script: str,
    *, policy_url: str | None = None,
) -> compute_v1.Instance:
    """The Instance body of node ``rank`` of ``request``.

    A gang (``policy_url`` set) gets its compact placement policy and, for an
    A3/A4 type, the GPU NICs of :mod:`.nics`. Accelerator-optimized types
    (A2, A3, A4, G2) come with their GPUs; a general-purpose type named in
    ``attached_gpus`` gets them as ``guest_accelerators``.
    """
    zone = request.offering.pool.zone
    machine = request.offering.pool.instance_type
    metadata = {
        STARTUP_KEY: startup_script,
        TAGS_KEY: json.dumps(dict(request.tags), sort_keys=True),
        RANK_KEY: str(rank),
        NODES_KEY: str(request.nodes),
    }
    return compute_v1.Instance(
        name=instance_name(request.client_token, rank),
        machine_type=f"zones/{zone}/machineTypes/{machine}",
        labels=labels_for(request.tags, request.client_token),
        metadata=compute_v1.Metadata(
            items=[compute_v1.Items(key=k, value=v) for k, v in metadata.items()]
        ),
        scheduling=scheduling(request.market, settings.termination_action,
                              request.max_run_seconds),
        disks=[_boot_disk(settings, zone, machine)],
        network_interfaces=nics.network_interfaces(settings, zone, machine,
                                                   gang=policy_url is not None),
        guest_accelerators=_accelerators(settings, zone, machine),
        resource_policies=[policy_url] if policy_url else [],
        service_accounts=_service_accounts(settings),
    )  # fmt: skip


def insert_request(
    project: str, settings: GcpSettings, request: LaunchRequest, rank: int, startup_script: str,
    *, policy_url: str | None = None,
) -> compute_v1.InsertInstanceRequest:
    """The insert call of node ``rank``, with its deterministic request id."""
    return compute_v1.InsertInstanceRequest(
        project=project,
        zone=request.offering.pool.zone,
        instance_resource=instance_resource(settings, request, rank, startup_script,
                                            policy_url=policy_url),
        request_id=request_id(request.client_token, rank),
    )


def _boot_disk(settings: GcpSettings, zone: str, machine: str) -> compute_v1.AttachedDisk:
    disk = machines.boot_disk_type(machine, settings.boot_disk_type)
    return compute_v1.AttachedDisk(
        boot=True,
        auto_delete=True,
        initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=settings.image,
            disk_size_gb=settings.boot_disk_gb,
            disk_type=f"zones/{zone}/diskTypes/{disk}",
        ),
    )


def _accelerators(
    settings: GcpSettings, zone: str, machine: str
) -> list[compute_v1.AcceleratorConfig]:
    attached = settings.attached_gpus.get(machine)
    if attached is None:
        return []  # built in (A2, A3, A4, G2): the API takes the machine type alone
    return [compute_v1.AcceleratorConfig(
        accelerator_type=f"zones/{zone}/acceleratorTypes/{attached.accelerator}",
        accelerator_count=attached.count,
    )]  # fmt: skip


def _service_accounts(settings: GcpSettings) -> list[compute_v1.ServiceAccount]:
    if settings.service_account is None:
        return []
    return [compute_v1.ServiceAccount(email=settings.service_account, scopes=[
        "https://www.googleapis.com/auth/cloud-platform"])]


def is_spotd_vm(vm: Any) -> bool:
    """Whether spotd launched this VM (it carries the token label)."""
    return LAUNCH_LABEL in dict(vm.labels)


def tags_of(vm: Any) -> dict[str, str]:
    """The exact spotd tags of a VM (from metadata), or its labels when absent."""
    for item in vm.metadata.items:
        if item.key == TAGS_KEY:
            try:
                loaded = json.loads(item.value)
            except ValueError:
                break
            if isinstance(loaded, dict):
                return {str(k): str(v) for k, v in loaded.items()}
    labels = dict(vm.labels)
    labels.pop(LAUNCH_LABEL, None)
    return labels


def instance_id(zone: str, name: str) -> str:
    """spotd's id of a VM: ``zone/name`` (so describe knows where to look)."""
    return f"{zone}/{name}"


def split_id(instance_id: str) -> tuple[str, str] | None:
    """``(zone, name)`` of an id, None when it is not a GCP id."""
    zone, sep, name = instance_id.partition("/")
    if not sep or not zone or not name or "/" in name:
        return None
    return zone, name


def last_segment(url: str) -> str:
    """``.../zones/us-central1-a`` -> ``us-central1-a``."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def parse_time(text: str) -> datetime | None:
    """An RFC 3339 timestamp of the API, None when empty or malformed."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def to_instance(vm: Any, zone: str, preempted_at: datetime | None) -> Instance:
    """The spotd view of a GCE VM; ``preempted_at`` set when GCE preempted it."""
    status = str(vm.status)
    market = Market.SPOT if vm.scheduling.provisioning_model == "SPOT" else Market.ON_DEMAND
    state = _state(status, preempted_at is not None)
    ended_at = None
    if state in (InstanceState.PREEMPTED, InstanceState.TERMINATED):
        ended_at = preempted_at or parse_time(vm.last_stop_timestamp)
    return Instance(
        id=instance_id(zone, vm.name),
        pool=Pool(PROVIDER, region_of(zone), zone, last_segment(vm.machine_type)),
        market=market,
        state=state,
        tags=tags_of(vm),
        launched_at=parse_time(vm.creation_timestamp),
        ended_at=ended_at,
        private_address=_private_address(vm),
    )


def _private_address(vm: Any) -> str | None:
    """nic0's internal address, where the gang's peers reach the node."""
    interfaces = list(vm.network_interfaces)
    return str(interfaces[0].network_i_p) or None if interfaces else None


def _state(status: str, preempted: bool) -> InstanceState:
    if status == "RUNNING":
        return InstanceState.RUNNING
    if status in STOPPED_STATUSES:
        return InstanceState.PREEMPTED if preempted else InstanceState.TERMINATED
    return InstanceState.PENDING


def gone_instance(
    zone: str, name: str, preempted_at: datetime, known: Instance | None
) -> Instance:
    """A VM GCE deleted after preempting it (termination action DELETE).

    The API keeps nothing of it but the preemption operation: pool and tags
    come from the last time this provider saw it, else the type is unknown.
    """
    pool = known.pool if known else Pool(PROVIDER, region_of(zone), zone, "unknown")
    tags: Mapping[str, str] = known.tags if known else {}
    return Instance(
        id=instance_id(zone, name), pool=pool, market=Market.SPOT,
        state=InstanceState.PREEMPTED, tags=dict(tags),
        launched_at=known.launched_at if known else None, ended_at=preempted_at,
        private_address=known.private_address if known else None,
    )  # fmt: skip
