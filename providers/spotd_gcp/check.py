"""``spotd check-cloud`` for GCP: what a launch needs, checked without creating anything.

Compute Engine has no dry run for ``instances.insert`` or
``resourcePolicies.insert``, so the check builds the exact bodies a launch
would send (with the SDK's own types) and reads back, read-only, everything
they name:

- credentials: ``regions.get`` of the first configured region;
- permissions: ``projects.testIamPermissions`` (Cloud Resource Manager) with
  the list in :func:`required_permissions`;
- quotas: ``regions.get`` quotas (the GPU family's metric, ``PREEMPTIBLE_``
  first for Spot, and the CPU metric) against what the request needs;
- the image: ``images.get`` or ``images.getFromFamily``;
- the machine type offered in the zone: ``machineTypes.get``;
- the GPU NIC subnets: ``subnetworks.get``.

Capacity cannot be checked read-only: a stockout (``ZONE_RESOURCE_POOL_EXHAUSTED``)
shows only on a real insert. A machine type not offered in the zone is
reported as the capacity failure it will be.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from google.auth.transport.requests import AuthorizedSession
from google.cloud import compute_v1

from spotd.core.errors import NotFoundError, ProviderError, invalid_request
from spotd.core.values import CheckOutcome, CloudCheck, LaunchRequest, Market

from . import nics, placement, resources
from .clients import GcpClients
from .egress import region_egress
from .errors import PROVIDER, map_gcp_errors
from .settings import GcpSettings, region_of

GPU_QUOTAS: dict[str, str] = {
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
    "nvidia-b200": "NVIDIA_B200_GPUS",
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
}
"""Accelerator type -> its regional quota metric (Spot: the same with ``PREEMPTIBLE_``)."""

PREDEFINED_ROLE = "roles/compute.instanceAdmin.v1"

_IMAGE = re.compile(r"(?:.*/)?projects/([^/]+)/global/images/(family/)?([^/]+)$")

Outcome = CheckOutcome
StartupScript = Callable[[LaunchRequest], str]


def required_permissions(settings: GcpSettings, project: str) -> list[str]:
    """Every IAM permission spotd uses in the project (docs/providers-gcp.md lists them)."""
    perms = [
        "compute.instances.create", "compute.instances.delete", "compute.instances.get",
        "compute.instances.list", "compute.instances.getSerialPortOutput",
        "compute.instances.setMetadata", "compute.instances.setLabels",
        "compute.disks.create", "compute.subnetworks.use", "compute.subnetworks.get",
        "compute.machineTypes.get", "compute.machineTypes.list",
        "compute.zoneOperations.get", "compute.zoneOperations.list",
        "compute.regionOperations.get", "compute.regions.get",
        "compute.resourcePolicies.create", "compute.resourcePolicies.delete",
        "compute.resourcePolicies.list", "compute.resourcePolicies.use",
        "compute.resourcePolicies.get",
    ]  # fmt: skip
    if settings.external_ip:
        perms.append("compute.subnetworks.useExternalIp")
    else:
        # The egress check: Cloud NAT on the routers, Private Google Access on the subnets.
        perms += ["compute.routers.list", "compute.subnetworks.list"]
    image_project = _image_parts(settings.image, project)[0]
    if image_project == project:
        # A public image project grants this to everyone: only the own project's is tested.
        perms += ["compute.images.get", "compute.images.getFromFamily",
                  "compute.images.useReadOnly"]  # fmt: skip
    if settings.service_account:
        perms += ["compute.instances.setServiceAccount", "iam.serviceAccounts.actAs"]
    return perms


def failed_credentials(exc: ProviderError) -> CloudCheck:
    """The check when the clients cannot even be built (no ADC, no project)."""
    return CloudCheck(PROVIDER, (Outcome("credentials", False, str(exc)),))


def _image_parts(image: str, project: str) -> tuple[str, bool, str]:
    """``(project, is_family, name)`` of the configured source image."""
    match = _IMAGE.match(image)
    if match is None:
        return project, "/family/" in image, image.rsplit("/", 1)[-1]
    return match.group(1), bool(match.group(2)), match.group(3)


class GcpCloudCheck:
    """One run of the checks; never raises for a failing check."""

    def __init__(
        self, settings: GcpSettings, clients: GcpClients, startup_script: StartupScript
    ) -> None:
        self._settings = settings
        self._clients = clients
        self._script = startup_script
        self._timeout = settings.request_timeout_seconds
        self._regions: dict[str, Any] = {}

    def run(self, request: LaunchRequest | None) -> CloudCheck:
        """Every check (those of ``request`` too when given), and what it would create."""
        first = self._credentials()
        outcomes = [first]
        if not first.ok:
            return CloudCheck(PROVIDER, tuple(outcomes))
        outcomes += self._permissions()
        outcomes.append(self._image())
        would: list[str] = []
        if request is not None:
            machine = self._machine_type(request)
            outcomes.append(machine[0])
            if machine[1] is not None:
                outcomes += self._quotas(request, machine[1])
            subnets = self._gpu_subnets(request)
            outcomes += subnets
            if not any(o.name.startswith("gpu networks") for o in subnets):
                # Without its GPU networks the request cannot be built: said once, above.
                built, would = self._bodies(request)
                outcomes.append(built)
            outcomes.append(self._egress(request.offering.pool.region, request.env))
        else:
            outcomes += self._configured_subnets()
            if not self._settings.external_ip:
                regions = sorted({region_of(z) for z in self._settings.zones})
                outcomes += [self._egress(r, {}) for r in regions]
        return CloudCheck(PROVIDER, tuple(outcomes), tuple(would))

    # -- the checks ------------------------------------------------------------

    def _credentials(self) -> Outcome:
        region = region_of(self._settings.zones[0]) if self._settings.zones else "us-central1"
        try:
            self._region(region)
        except ProviderError as exc:
            return Outcome("credentials", False, f"{exc} (needs compute.regions.get)")
        return Outcome("credentials", True, f"project {self._clients.project} answers")

    def _permissions(self) -> list[Outcome]:
        wanted = required_permissions(self._settings, self._clients.project)
        url = (f"{self._clients.resource_manager_url}/v1/projects/"
               f"{self._clients.project}:testIamPermissions")  # fmt: skip
        try:
            with map_gcp_errors("projects.testIamPermissions"):
                session = AuthorizedSession(self._clients.credentials)  # type: ignore[no-untyped-call]
                answer = session.post(url, json={"permissions": wanted}, timeout=self._timeout)
            if answer.status_code != 200:
                raise ProviderError(f"HTTP {answer.status_code}: {answer.text[:200]}")
            granted = set(answer.json().get("permissions", []))
        except (ProviderError, ValueError) as exc:
            return [Outcome(
                "permissions", False,
                f"cannot test them: Cloud Resource Manager testIamPermissions failed ({exc}); "
                "enable cloudresourcemanager.googleapis.com or check the list by hand",
            )]  # fmt: skip
        return [
            Outcome(f"permission {p}", p in granted,
                    "granted" if p in granted else
                    f"missing in project {self._clients.project}: grant {PREDEFINED_ROLE} "
                    "or a custom role with it")
            for p in wanted
        ]  # fmt: skip

    def _image(self) -> Outcome:
        project, family, name = _image_parts(self._settings.image, self._clients.project)
        what = "compute.images.getFromFamily" if family else "compute.images.get"
        try:
            with map_gcp_errors(f"image {self._settings.image}"):
                if family:
                    image = self._clients.images.get_from_family(
                        project=project, family=name, retry=None, timeout=self._timeout)
                else:
                    image = self._clients.images.get(
                        project=project, image=name, retry=None, timeout=self._timeout)
        except NotFoundError:
            return Outcome("image", False, f"image {self._settings.image} not found "
                                           "(providers.gcp.image)")  # fmt: skip
        except ProviderError as exc:
            return Outcome("image", False, f"{exc} (needs {what})")
        return Outcome("image", True, f"{self._settings.image}: {image.name} ({image.status})")

    def _machine_type(self, request: LaunchRequest) -> tuple[Outcome, Any | None]:
        pool = request.offering.pool
        name = f"machine type {pool.instance_type} in {pool.zone}"
        try:
            with map_gcp_errors(name):
                found = self._clients.machine_types.get(
                    project=self._clients.project, zone=pool.zone,
                    machine_type=pool.instance_type, retry=None, timeout=self._timeout,
                )  # fmt: skip
        except NotFoundError:
            return Outcome(name, False, "capacity: not offered in this zone"), None
        except ProviderError as exc:
            return Outcome(name, False, f"{exc} (needs compute.machineTypes.get)"), None
        return Outcome(name, True, f"{found.guest_cpus} vCPUs, {found.memory_mb} MB"), found

    def _quotas(self, request: LaunchRequest, machine: Any) -> list[Outcome]:
        region = request.offering.pool.region
        try:
            quotas = {str(q.metric): q for q in self._region(region).quotas}
        except ProviderError as exc:
            return [Outcome(f"quotas in {region}", False, f"{exc} (needs compute.regions.get)")]
        spot = request.market is Market.SPOT
        accel = _accelerator(self._settings, request, machine)
        found = []
        if accel is not None:
            metric = GPU_QUOTAS.get(accel[0], f"{accel[0].upper().replace('-', '_')}_GPUS")
            found.append(_quota(quotas, metric, accel[1] * request.nodes, region, spot))
        family = request.offering.pool.instance_type.split("-", 1)[0].upper()
        cpu_metric = f"{family}_CPUS" if f"{family}_CPUS" in quotas else "CPUS"
        found.append(_quota(quotas, cpu_metric, int(machine.guest_cpus) * request.nodes,
                            region, spot))  # fmt: skip
        return found

    def _gpu_subnets(self, request: LaunchRequest) -> list[Outcome]:
        pool = request.offering.pool
        layout = nics.layout_of(pool.instance_type)
        if request.nodes < 2 or layout is None:
            return []
        try:
            subnets = nics.gpu_subnets(self._settings, pool.zone, layout)
        except ProviderError as exc:
            return [Outcome(f"gpu networks in {pool.zone}", False, str(exc))]
        return [self._subnet(s.subnetwork, s.network, pool.region) for _, s in subnets]

    def _configured_subnets(self) -> list[Outcome]:
        found = []
        for where, networks in sorted(self._settings.gpu_networks.items()):
            region = where if where.count("-") == 1 else region_of(where)
            for subnet in [*networks.gvnic, *networks.rdma]:
                found.append(self._subnet(subnet.subnetwork, subnet.network, region))
        return found

    def _subnet(self, subnet: str, network: str, region: str) -> Outcome:
        project, where, name = nics.subnet_path(subnet, self._clients.project, region)
        label = f"subnetwork {where}/{name}"
        try:
            with map_gcp_errors(label):
                found = self._clients.subnetworks.get(
                    project=project, region=where, subnetwork=name,
                    retry=None, timeout=self._timeout,
                )  # fmt: skip
        except NotFoundError:
            return Outcome(label, False, f"not found in project {project} "
                                         "(providers.gcp.gpu_networks)")  # fmt: skip
        except ProviderError as exc:
            return Outcome(label, False, f"{exc} (needs compute.subnetworks.get)")
        on = str(found.network).rsplit("/", 1)[-1]
        if on != network.rsplit("/", 1)[-1]:
            return Outcome(label, False, f"is on network {on}, config says {network}")
        return Outcome(label, True, f"on {on}, {found.ip_cidr_range}")

    def _bodies(self, request: LaunchRequest) -> tuple[Outcome, list[str]]:
        """Build the launch's bodies exactly as ``launch`` would, and round-trip them."""
        project = self._clients.project
        pool = request.offering.pool
        name = "launch request"
        try:
            with invalid_request(PROVIDER, "check"):
                script = self._script(request)
            url = placement.policy_url(project, request) if request.nodes > 1 else None
            bodies = [resources.instance_resource(self._settings, request, rank, script,
                                                    policy_url=url)
                      for rank in range(request.nodes)]  # fmt: skip
            policy = placement.resource_policy(request) if url else None
            for body in bodies:
                # The SDK's own parser refuses a field the API does not have.
                compute_v1.Instance.from_json(compute_v1.Instance.to_json(body),
                                              ignore_unknown_fields=False)  # fmt: skip
            if policy is not None:
                compute_v1.ResourcePolicy.from_json(compute_v1.ResourcePolicy.to_json(policy),
                                                    ignore_unknown_fields=False)  # fmt: skip
        except (ProviderError, ValueError) as exc:
            return Outcome(name, False, str(exc)), []
        would = []
        if policy is not None:
            would.append(f"resource policy regions/{policy.region}/resourcePolicies/"
                         f"{policy.name} (COLLOCATED, {request.nodes} VMs)")  # fmt: skip
        for body in bodies:
            disk = body.disks[0].initialize_params.disk_type.rsplit("/", 1)[-1]
            would.append(f"instance zones/{pool.zone}/instances/{body.name} "
                         f"({pool.instance_type}, {body.scheduling.provisioning_model}, "
                         f"{len(body.network_interfaces)} NICs, boot disk {disk})")  # fmt: skip
        detail = (f"{len(bodies)} Instance body(ies) built and valid; GCE has no dry run "
                  "for insert, so capacity shows only at launch")  # fmt: skip
        return Outcome(name, True, detail), would

    def _egress(self, region: str, env: Mapping[str, str]) -> Outcome:
        """Can nic0 reach the daemon, the package index and the checkpoint store?"""
        try:
            return region_egress(self._clients, self._settings.network, region, env,
                                 external_ip=self._settings.external_ip,
                                 timeout=self._timeout)  # fmt: skip
        except ProviderError as exc:
            return Outcome(f"egress in {region}", False,
                           f"{exc} (needs compute.routers.list, compute.subnetworks.list)")

    def _region(self, region: str) -> Any:
        if region not in self._regions:
            with map_gcp_errors(f"region {region}"):
                self._regions[region] = self._clients.regions.get(
                    project=self._clients.project, region=region,
                    retry=None, timeout=self._timeout,
                )  # fmt: skip
        return self._regions[region]


def _accelerator(
    settings: GcpSettings, request: LaunchRequest, machine: Any
) -> tuple[str, int] | None:
    listed = list(machine.accelerators)
    if listed:
        return str(listed[0].guest_accelerator_type), int(listed[0].guest_accelerator_count)
    attached = settings.attached_gpus.get(request.offering.pool.instance_type)
    return (attached.accelerator, attached.count) if attached else None


def _quota(quotas: dict[str, Any], metric: str, need: int, region: str, spot: bool) -> Outcome:
    """One quota outcome; Spot VMs use the ``PREEMPTIBLE_`` quota when the project has one."""
    preemptible = quotas.get(f"PREEMPTIBLE_{metric}")
    if spot and preemptible is not None and float(preemptible.limit) > 0:
        metric = f"PREEMPTIBLE_{metric}"
    quota = quotas.get(metric)
    name = f"quota {metric} in {region}"
    if quota is None:
        return Outcome(name, False, f"need {need}, the region has no {metric} quota: "
                                    "request one")  # fmt: skip
    free = float(quota.limit) - float(quota.usage)
    if free < need:
        return Outcome(name, False, f"need {need}, {free:g} free of {float(quota.limit):g}: "
                                    f"request an increase of {metric} in {region}")  # fmt: skip
    return Outcome(name, True, f"need {need}, {free:g} free of {float(quota.limit):g}")
