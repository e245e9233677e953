"""A loopback fake of the Compute Engine and Cloud Billing REST APIs.

It serves exactly the paths the GCP adapter's real SDK clients
(``compute_v1`` and ``billing_v1`` on the REST transport) call, with the
JSON shapes of the real APIs, paging included:

Paths below are under ``/compute/v1/projects/P`` (P = the fake's project):

- GET ``zones/Z/machineTypes``: list (paged)
- GET ``aggregated/machineTypes``: aggregated list (paged)
- POST ``zones/Z/instances``: insert (``requestId`` dedupe, 409 ``alreadyExists``)
- GET ``zones/Z/instances``: list (labels filter, paged)
- GET ``aggregated/instances``: aggregated list (labels filter, paged)
- GET ``zones/Z/instances/N``: get (each read moves a booting VM one step on)
- DELETE ``zones/Z/instances/N``: delete
- GET ``zones/Z/instances/N/serialPort``: serial port output
- POST ``zones/Z/instances/N/simulateMaintenanceEvent``: a Spot VM is preempted at once
- GET ``zones/Z/operations``: list (``operationType`` filter, paged)
- GET ``zones/Z/operations/O`` and POST ``.../O/wait``: get / wait (finish the operation)
- GET ``zones/Z/machineTypes/M``: get
- POST / GET ``regions/R/resourcePolicies``, GET / DELETE ``regions/R/resourcePolicies/N``
  (a delete while an instance names the policy: 400 ``resourceInUseByAnotherResource``)
- GET ``regions/R/operations/O`` and POST ``.../O/wait``
- GET ``regions/R`` (with its ``quotas``), GET ``regions/R/subnetworks[/S]``
- GET ``regions/R/routers`` (:attr:`GcpFake.routers`, with their Cloud NAT)
- GET ``/compute/v1/projects/IP/global/images/N`` and ``.../images/family/F`` (any project)

plus ``POST /v1/projects/P:testIamPermissions`` (Cloud Resource Manager) and the
billing catalog at GET ``/v1/services/S/skus`` (paged).

Inserted instances and resource policies are parsed back into
``compute_v1.Instance`` / ``compute_v1.ResourcePolicy`` with unknown fields
refused (400 ``invalid``), so a misspelt field fails like a real API would;
the NICs must name subnetworks the fake knows, MRDMA NICs only on a RoCE
network and no other NIC there, named resource policies must exist, and the
Hyperdisk-only families (A3 Ultra, A4, A4X) refuse a Persistent Disk boot disk.

Unknown query parameters (``$alt=json;enum-encoding=int``) are ignored.
Levers: :meth:`GcpFake.fail_next_insert` (by error kind, optionally after
some successful inserts), :meth:`GcpFake.fail_next` (any route, any HTTP
error), :meth:`GcpFake.preempt`, :attr:`GcpFake.denied` (permissions
testIamPermissions leaves out), :attr:`GcpFake.quotas`, :attr:`GcpFake.images`,
:attr:`GcpFake.zone_types` (a type not offered in a zone),
:attr:`GcpFake.hold_names` (inserts of these instance names are never
answered: a launching process can be killed mid-launch). Every request is
recorded in :attr:`GcpFake.requests`.

EVERY PRICE IN THIS FILE IS MADE UP. The SKUs only mimic the shape and the
description style of the real Compute Engine catalog.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from google.cloud import compute_v1
from google.protobuf.json_format import ParseError

PROJECT = "fake-project"
COMPUTE_SERVICE_ID = "6F81-5844-456A"
BASE = "https://www.googleapis.com/compute/v1"

# name -> (vCPUs, memory MB, accelerator type, GPUs); None = no GPUs
MACHINE_TYPES: dict[str, tuple[int, int, str | None, int]] = {
    "a2-highgpu-1g": (12, 87040, "nvidia-tesla-a100", 1),
    "a2-highgpu-8g": (96, 696320, "nvidia-tesla-a100", 8),
    "a2-ultragpu-8g": (96, 1392640, "nvidia-a100-80gb", 8),
    "a3-highgpu-8g": (208, 1916928, "nvidia-h100-80gb", 8),
    "a3-megagpu-8g": (208, 1916928, "nvidia-h100-mega-80gb", 8),
    "a3-ultragpu-8g": (224, 3022848, "nvidia-h200-141gb", 8),
    "g2-standard-4": (4, 16384, "nvidia-l4", 1),
    "g2-standard-96": (96, 393216, "nvidia-l4", 8),
    "n2-standard-8": (8, 32768, None, 0),
    "n1-standard-8": (8, 30720, None, 0),  # GPUs only attached (guest_accelerators)
    "e2-medium": (2, 4096, None, 0),
}

ZONE_TYPES: dict[str, list[str]] = {
    "us-central1-a": ["a2-highgpu-1g", "a2-highgpu-8g", "a2-ultragpu-8g", "a3-highgpu-8g",
                      "g2-standard-4", "n2-standard-8", "e2-medium", "n1-standard-8"],
    "us-central1-b": ["g2-standard-4", "g2-standard-96", "a3-megagpu-8g", "e2-medium"],
    "us-east4-a": ["a3-highgpu-8g", "a3-ultragpu-8g", "n2-standard-8"],
    "europe-west4-a": ["a2-highgpu-8g", "g2-standard-4"],
}

# Made-up USD prices: (location name, regions) -> (part description, group) -> (on-demand, spot)
LOCATIONS: dict[str, list[str]] = {
    "Americas": ["us-central1", "us-east4"],
    "Netherlands": ["europe-west4"],
}
PRICES: dict[str, dict[tuple[str, str], tuple[float, float]]] = {
    "Americas": {
        ("A2 Instance Core", "CPU"): (0.031611, 0.011),
        ("A2 Instance Ram", "RAM"): (0.004237, 0.0015),
        ("A3 Instance Core", "CPU"): (0.029563, 0.0102),
        ("A3 Instance Ram", "RAM"): (0.003962, 0.00139),
        ("G2 Instance Core", "CPU"): (0.024988, 0.0083),
        ("G2 Instance Ram", "RAM"): (0.002927, 0.00098),
        ("Nvidia Tesla A100 GPU", "GPU"): (2.933908, 1.1),
        ("Nvidia Tesla A100 80GB GPU", "GPU"): (3.92, 1.57),
        ("Nvidia H100 80GB GPU", "GPU"): (9.796, 3.3),
        ("Nvidia H100 80GB Mega GPU", "GPU"): (10.61, 3.72),
        ("Nvidia H200 141GB GPU", "GPU"): (11.27, 4.1),
        ("Nvidia L4 GPU", "GPU"): (0.56, 0.2),
    },
    "Netherlands": {
        ("A2 Instance Core", "CPU"): (0.034806, 0.0121),
        ("A2 Instance Ram", "RAM"): (0.004664, 0.00165),
        ("G2 Instance Core", "CPU"): (0.027486, 0.0091),
        ("G2 Instance Ram", "RAM"): (0.00322, 0.00108),
        ("Nvidia Tesla A100 GPU", "GPU"): (3.22, 1.21),
        ("Nvidia L4 GPU", "GPU"): (0.616, 0.22),
    },
}

# The fake's own catalog of the A3 fabrics: (NIC type of the fabric NICs, how many).
FABRIC_NICS: dict[str, tuple[str, int]] = {
    "a3-highgpu-8g": ("GVNIC", 4),
    "a3-megagpu-8g": ("GVNIC", 8),
    "a3-ultragpu-8g": ("MRDMA", 8),
}
REGIONS = ("us-central1", "us-east4", "europe-west4")
HYPERDISK_ONLY = ("a3-ultragpu-", "a4-highgpu-", "a4x-")
"""Machine type prefixes whose VMs take Hyperdisk only (GCE refuses Persistent Disk)."""
IMAGE_PROJECT = "fake-images"


def default_subnetworks() -> dict[tuple[str, str], dict[str, Any]]:
    """Per region: subnets gpu-0..7 on networks gpu-net-0..7, roce-0..7 on RoCE net roce-net."""
    subnets: dict[tuple[str, str], dict[str, Any]] = {}
    for region in REGIONS:
        for i in range(8):
            subnets[(region, f"gpu-{i}")] = {"network": f"gpu-net-{i}",
                                             "ipCidrRange": f"10.{100 + i}.0.0/16"}
            subnets[(region, f"roce-{i}")] = {"network": "roce-net",
                                              "ipCidrRange": f"10.{200 + i}.0.0/16"}
        subnets[(region, "default")] = {"network": "default", "ipCidrRange": "10.128.0.0/20"}
    return subnets


def gpu_networks_config(project: str = PROJECT) -> dict[str, Any]:
    """A ``[providers.gcp] gpu_networks`` value naming the fake's GPU subnets in every region."""
    def subnet(region: str, name: str, network: str) -> dict[str, str]:
        return {"network": f"projects/{project}/global/networks/{network}",
                "subnetwork": f"regions/{region}/subnetworks/{name}"}

    return {region: {"gvnic": [subnet(region, f"gpu-{i}", f"gpu-net-{i}") for i in range(8)],
                     "rdma": [subnet(region, f"roce-{i}", "roce-net") for i in range(8)]}
            for region in REGIONS}


def default_quotas() -> dict[str, dict[str, tuple[float, float]]]:
    """Generous made-up quotas: metric -> (limit, usage) per region."""
    metrics = ["CPUS", "A2_CPUS", "A3_CPUS", "NVIDIA_A100_GPUS", "NVIDIA_A100_80GB_GPUS",
               "NVIDIA_H100_GPUS", "NVIDIA_H100_MEGA_GPUS", "NVIDIA_H200_GPUS", "NVIDIA_L4_GPUS",
               "NVIDIA_T4_GPUS"]
    table = {m: (2000.0, 0.0) for m in metrics}
    table.update({f"PREEMPTIBLE_{m}": (1000.0, 8.0) for m in metrics if m.endswith("GPUS")})
    return {region: dict(table) for region in REGIONS}


ERROR_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                404: "NOT_FOUND", 409: "ALREADY_EXISTS", 429: "RESOURCE_EXHAUSTED",
                500: "INTERNAL", 503: "UNAVAILABLE"}

# Error kinds of the contract suite (and more) -> how the fake fails an insert.
# ("http", status, reason) answers the insert with an error; ("operation", code, http)
# accepts it and fails its operation, which is how GCE reports a stockout.
INSERT_FAILURES: dict[str, tuple[str, str | int, str | int]] = {
    "capacity": ("operation", "ZONE_RESOURCE_POOL_EXHAUSTED", 503),
    "capacity-details": ("operation", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", 503),
    "stockout": ("operation", "STOCKOUT", 503),
    "quota": ("operation", "QUOTA_EXCEEDED", 403),
    "quota-http": ("http", 403, "quotaExceeded"),
    "throttle": ("http", 429, "rateLimitExceeded"),
    "rate-403": ("http", 403, "rateLimitExceeded"),
    "auth": ("http", 401, "required"),
    "forbidden": ("http", 403, "forbidden"),
    "server": ("http", 500, "backendError"),
    "unavailable": ("http", 503, "backendError"),
    "bad-request": ("http", 400, "invalid"),
}


def _money(usd: float) -> dict[str, Any]:
    nanos = round(usd * 1e9)
    return {"currencyCode": "USD", "units": str(nanos // 10**9), "nanos": nanos % 10**9}


def _sku(n: int, description: str, group: str, usage: str, regions: list[str],
         unit: str, *tiers: float) -> dict[str, Any]:
    rates = [{"startUsageAmount": i * 100, "unitPrice": _money(p)} for i, p in enumerate(tiers)]
    return {
        "name": f"services/{COMPUTE_SERVICE_ID}/skus/FAKE-{n:04d}",
        "skuId": f"FAKE-{n:04d}",
        "description": description,
        "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": "Compute",
                     "resourceGroup": group, "usageType": usage},
        "serviceRegions": regions,
        "pricingInfo": [{"summary": "", "pricingExpression": {
            "usageUnit": unit, "displayQuantity": 1, "tieredRates": rates}}],
    }


def build_skus() -> list[dict[str, Any]]:
    """Made-up SKUs: on-demand and spot for each part, plus decoys that must not match."""
    skus: list[dict[str, Any]] = []
    counter = itertools.count(1)
    for location, parts in PRICES.items():
        regions = LOCATIONS[location]
        for (what, group), (on_demand, spot) in parts.items():
            unit = "GiBy.h" if group == "RAM" else "h"
            skus.append(_sku(next(counter), f"{what} running in {location}", group, "OnDemand",
                             regions, unit, on_demand))
            spot_text = (f"{what} attached to Spot Preemptible VMs running in {location}"
                         if group == "GPU" else f"Spot Preemptible {what} running in {location}")
            skus.append(_sku(next(counter), spot_text, group, "Preemptible", regions, unit,
                             0.0, spot))  # two tiers: the adapter must take the last
    decoys = [
        ("Commitment v1: A2 Cpu in Americas for 1 Year", "CPU", "Commit1Yr", "h", 0.02),
        ("Nvidia Tesla A100 GPU running in Americas", "GPU", "Commit1Yr", "h", 1.9),
        ("DWS Defined Duration Nvidia H100 80GB GPU running in Americas", "GPU", "OnDemand",
         "h", 0.01),
        ("N1 Predefined Instance Core running in Americas", "N1Standard", "OnDemand", "h", 0.03),
        ("Nvidia L4 Virtual Workstation GPU running in Americas", "GPU", "OnDemand", "h", 0.01),
        ("Storage PD Capacity", "PDStandard", "OnDemand", "GiBy.mo", 0.04),
    ]
    for description, group, usage, unit, price in decoys:
        skus.append(_sku(next(counter), description, group, usage, ["us-central1", "us-east4"],
                         unit, price))
    return skus


def now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


@dataclass
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    query: dict[str, str]
    body: dict[str, Any] | None
    headers: dict[str, str]
    """Header names in lower case."""


@dataclass
class _Failure:
    method: str
    path: re.Pattern[str]
    skip: int
    kind: str  # "http" or "operation"
    status: int
    reason: str


class HttpError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


@dataclass
class GcpFake:
    """State and levers of the fake; :meth:`start` serves it on 127.0.0.1."""

    project: str = PROJECT
    page_size: int = 3
    """Items per page when the client sets no ``maxResults`` (small, to force paging)."""
    sku_page_size: int = 5
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    request_ids: dict[str, tuple[str, str]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    skus: list[dict[str, Any]] = field(default_factory=build_skus)
    zone_types: dict[str, list[str]] = field(default_factory=lambda: dict(ZONE_TYPES))
    serial_output: str = "spotd-agent: started\n"
    policies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    subnetworks: dict[tuple[str, str], dict[str, Any]] = field(
        default_factory=default_subnetworks)
    roce_networks: set[str] = field(default_factory=lambda: {"roce-net"})
    routers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Region -> its Cloud Routers as the API gives them (``network``, ``nats``)."""
    images: dict[tuple[str, str], dict[str, Any]] = field(default_factory=lambda: {
        (IMAGE_PROJECT, "family/gpu"): {"name": "gpu-v20261201", "family": "gpu"},
        (IMAGE_PROJECT, "gpu-v20261201"): {"name": "gpu-v20261201", "family": "gpu"},
    })
    """(project, name or ``family/F``) -> image."""
    quotas: dict[str, dict[str, tuple[float, float]]] = field(default_factory=default_quotas)
    denied: set[str] = field(default_factory=set)
    """Permissions testIamPermissions does not grant."""
    hold_names: set[str] = field(default_factory=set)
    """Instance names whose insert is held (never answered) until :meth:`stop`."""
    _released: threading.Event = field(default_factory=threading.Event)
    _failures: list[_Failure] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1000))
    _server: ThreadingHTTPServer | None = None

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> str:
        """Serve on a free loopback port; returns the base URL (``http://127.0.0.1:N``)."""
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self.url

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._released.set()  # let held requests end
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- levers --------------------------------------------------------------

    def add_cloud_nat(self, region: str, network: str = "default") -> None:
        """A Cloud Router of ``network`` in ``region`` with one NAT for all its subnets."""
        self.routers.setdefault(region, []).append({
            "name": f"router-{network}",
            "network": f"{BASE}/projects/{self.project}/global/networks/{network}",
            "nats": [{"name": "nat-all",
                      "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES"}],
        })  # fmt: skip

    def fail_next_insert(self, kind: str, *, after: int = 0) -> None:
        """Fail the insert after ``after`` more successful ones, as ``kind`` (INSERT_FAILURES)."""
        how, a, b = INSERT_FAILURES[kind]
        pattern = re.compile(r"/zones/[^/]+/instances$")
        with self._lock:
            if how == "operation":
                self._failures.append(_Failure("POST", pattern, after, how, int(b), str(a)))
            else:
                self._failures.append(_Failure("POST", pattern, after, how, int(a), str(b)))

    def fail_next(self, method: str, path_regex: str, status: int, reason: str) -> None:
        """Answer the next ``method`` request whose path matches with this HTTP error."""
        with self._lock:
            self._failures.append(
                _Failure(method, re.compile(path_regex), 0, "http", status, reason))

    def preempt(self, zone: str, name: str) -> None:
        """Preempt a VM as GCE does: stop it, log a ``compute.instances.preempted``
        operation, and delete it when its termination action is DELETE."""
        with self._lock:
            vm = self.instances[(zone, name)]
            vm["status"] = "TERMINATED"
            vm["lastStopTimestamp"] = now_text()
            op = self._new_operation(zone, name, "compute.instances.preempted", done=True)
            op["statusMessage"] = "Instance was preempted."
            if vm.get("scheduling", {}).get("instanceTerminationAction") == "DELETE":
                del self.instances[(zone, name)]

    def held(self, method: str, path: str, body: dict[str, Any] | None) -> bool:
        """Whether this request is an insert to hold (then wait until the fake stops)."""
        if method != "POST" or not re.search(r"/zones/[^/]+/instances$", path):
            return False
        with self._lock:
            hold = body is not None and str(body.get("name")) in self.hold_names
        if hold:
            self._released.wait()
        return hold

    def fabric_of(self, zone: str, name: str) -> tuple[set[str], int]:
        """The placement ids (``region/name``) and fabric NICs a VM was created with."""
        with self._lock:
            vm = self.instances[(zone, name)]
        machine = vm["machineType"].rsplit("/", 1)[-1]
        nic_type, _ = FABRIC_NICS.get(machine, ("GVNIC", 0))
        fabric = sum(1 for nic in vm.get("networkInterfaces", [])[1:]
                     if nic.get("nicType") == nic_type)
        placements = {f"{p.split('/regions/', 1)[1].split('/')[0]}/{p.rsplit('/', 1)[-1]}"
                      for p in vm.get("resourcePolicies", [])}
        return placements, fabric

    def recorded(self, method: str, path_part: str) -> list[Recorded]:
        """Requests received with this method whose path contains ``path_part``."""
        with self._lock:
            return [r for r in self.requests if r.method == method and path_part in r.path]

    # -- request handling ----------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, str],
               body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        with self._lock:
            failure = self._take_failure(method, path)
            if failure is not None and failure.kind == "http":
                raise HttpError(failure.status, failure.reason, f"injected {failure.reason}")
            return self._route(method, path, query, body, failure)

    def _take_failure(self, method: str, path: str) -> _Failure | None:
        for failure in self._failures:
            if failure.method == method and failure.path.search(path):
                if failure.skip > 0:
                    failure.skip -= 1
                    return None
                self._failures.remove(failure)
                return failure
        return None

    def _route(self, method: str, path: str, query: dict[str, str],
               body: dict[str, Any] | None, failure: _Failure | None) -> tuple[int, dict[str, Any]]:
        if m := re.fullmatch(r"/v1/services/([^/]+)/skus", path):
            return 200, self._skus(m.group(1), query)
        if m := re.fullmatch(r"/v1/projects/([^/]+):testIamPermissions", path):
            return 200, self._test_permissions(m.group(1), body)
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)/(.*)", path)
        if m is None:
            raise HttpError(404, "notFound", f"no route {method} {path}")
        if image := re.fullmatch(r"global/images/((?:family/)?[^/]+)", m.group(2)):
            return 200, self._image(m.group(1), image.group(1))
        if m.group(1) != self.project:
            raise HttpError(404, "notFound", f"The resource 'projects/{m.group(1)}' was not found")
        rest = m.group(2)
        for pattern, verb, handler in self._routes():
            hit = re.fullmatch(pattern, rest)
            if hit and verb == method:
                return 200, handler(*hit.groups(), query=query, body=body, failure=failure)
        raise HttpError(404, "notFound", f"no route {method} {path}")

    def _routes(self) -> list[tuple[str, str, Any]]:
        z = r"zones/([^/]+)"
        r = r"regions/([^/]+)"
        return [
            (rf"{z}/machineTypes", "GET", self._machine_types),
            (r"aggregated/machineTypes", "GET", self._aggregated_machine_types),
            (rf"{z}/instances", "POST", self._insert),
            (rf"{z}/instances", "GET", self._list_instances),
            (r"aggregated/instances", "GET", self._aggregated_instances),
            (rf"{z}/instances/([^/]+)", "GET", self._get_instance),
            (rf"{z}/instances/([^/]+)", "DELETE", self._delete_instance),
            (rf"{z}/instances/([^/]+)/serialPort", "GET", self._serial),
            (rf"{z}/instances/([^/]+)/simulateMaintenanceEvent", "POST", self._maintenance),
            (rf"{z}/operations", "GET", self._list_operations),
            (rf"{z}/operations/([^/]+)", "GET", self._get_operation),
            (rf"{z}/operations/([^/]+)/wait", "POST", self._get_operation),
            (rf"{z}/machineTypes/([^/]+)", "GET", self._get_machine_type),
            (rf"{r}/resourcePolicies", "POST", self._insert_policy),
            (rf"{r}/resourcePolicies", "GET", self._list_policies),
            (rf"{r}/resourcePolicies/([^/]+)", "GET", self._get_policy),
            (rf"{r}/resourcePolicies/([^/]+)", "DELETE", self._delete_policy),
            (rf"{r}/operations/([^/]+)", "GET", self._get_region_operation),
            (rf"{r}/operations/([^/]+)/wait", "POST", self._get_region_operation),
            (rf"{r}/subnetworks/([^/]+)", "GET", self._get_subnetwork),
            (rf"{r}/subnetworks", "GET", self._list_subnetworks),
            (rf"{r}/routers", "GET", self._list_routers),
            (r"regions/([^/]+)", "GET", self._get_region),
        ]

    # -- machine types -------------------------------------------------------

    def _machine_type(self, zone: str, name: str) -> dict[str, Any]:
        cpus, memory, accel, count = MACHINE_TYPES[name]
        item: dict[str, Any] = {
            "kind": "compute#machineType", "id": str(abs(hash(name)) % 10**12), "name": name,
            "guestCpus": cpus, "memoryMb": memory, "zone": zone,
            "selfLink": f"{BASE}/projects/{self.project}/zones/{zone}/machineTypes/{name}",
        }
        if accel is not None:
            item["accelerators"] = [{"guestAcceleratorType": accel,
                                     "guestAcceleratorCount": count}]
        return item

    def _machine_types(self, zone: str, **kw: Any) -> dict[str, Any]:
        if zone not in self.zone_types:
            raise HttpError(404, "notFound", f"The resource 'zones/{zone}' was not found")
        items = [self._machine_type(zone, n) for n in self.zone_types[zone]]
        return self._page(items, kw["query"], "items")

    def _aggregated_machine_types(self, **kw: Any) -> dict[str, Any]:
        flat = [(z, self._machine_type(z, n)) for z, ns in self.zone_types.items() for n in ns]
        return self._aggregated_page(flat, kw["query"], "machineTypes")

    # -- instances -----------------------------------------------------------

    def _insert(self, zone: str, *, query: dict[str, str], body: dict[str, Any] | None,
                failure: _Failure | None) -> dict[str, Any]:
        assert body is not None
        name = body["name"]
        rid = query.get("requestId", "")
        if rid and rid in self.request_ids:
            return self.operations[self.request_ids[rid]]  # GCE answers a repeat with the first
        if zone not in self.zone_types:
            raise HttpError(400, "invalid", f"Invalid value for field 'zone': '{zone}'")
        self._validate_instance(zone, body)
        if failure is not None:  # an operation failure: accepted, then fails
            op = self._new_operation(zone, name, "insert", done=True)
            op["error"] = {"errors": [{"code": failure.reason,
                                       "message": f"injected {failure.reason}"}]}
            op["httpErrorStatusCode"] = failure.status
        elif (zone, name) in self.instances:
            raise HttpError(409, "alreadyExists",
                            f"The resource 'projects/{self.project}/zones/{zone}/instances/"
                            f"{name}' already exists")
        else:
            self.instances[(zone, name)] = self._new_vm(zone, body)
            op = self._new_operation(zone, name, "insert", done=False)
        if rid:
            self.request_ids[rid] = (zone, op["name"])
        return op

    def _validate_instance(self, zone: str, body: dict[str, Any]) -> None:
        """Refuse what GCE would: unknown fields, unknown subnets or policies, bad NICs."""
        try:
            compute_v1.Instance.from_json(json.dumps(body), ignore_unknown_fields=False)
        except ParseError as exc:
            raise HttpError(400, "invalid", f"Invalid JSON payload received. {exc}") from exc
        region = zone.rsplit("-", 1)[0]
        machine = body.get("machineType", "").rsplit("/", 1)[-1]
        for disk in body.get("disks", []):
            kind = disk.get("initializeParams", {}).get("diskType", "").rsplit("/", 1)[-1]
            if machine.startswith(HYPERDISK_ONLY) and not kind.startswith("hyperdisk-"):
                raise HttpError(400, "invalid", f"[{kind}] disk type cannot be used by "
                                f"[{machine}] machine type")
        for i, nic in enumerate(body.get("networkInterfaces", [])):
            network = nic.get("network", "").rsplit("/", 1)[-1]
            if "subnetwork" in nic:
                key = (region, nic["subnetwork"].rsplit("/", 1)[-1])
                if key not in self.subnetworks or f"/regions/{region}/" not in "/" + nic[
                        "subnetwork"]:
                    raise HttpError(400, "invalid", f"nic{i}: subnetwork "
                                    f"'{nic['subnetwork']}' not found in {region}")
                network = network or self.subnetworks[key]["network"]
            rdma = nic.get("nicType") == "MRDMA"
            if rdma != (network in self.roce_networks):
                raise HttpError(400, "invalid", f"nic{i}: MRDMA NICs go on RoCE networks only,"
                                " and only MRDMA NICs go there")
        for url in body.get("resourcePolicies", []):
            where = re.search(r"regions/([^/]+)/resourcePolicies/([^/]+)$", url)
            if where is None or (where.group(1), where.group(2)) not in self.policies:
                raise HttpError(400, "invalid", f"resource policy '{url}' not found")
            if where.group(1) != region:
                raise HttpError(400, "invalid", "a resource policy must be in the VM's region")

    def _new_vm(self, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        vm: dict[str, Any] = json.loads(json.dumps(body))
        for nic in vm.get("networkInterfaces", []):
            n = next(self._ids)
            nic["networkIP"] = f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}"
        machine = vm["machineType"].rsplit("/", 1)[-1]
        vm.update({
            "kind": "compute#instance", "id": str(next(self._ids)), "status": "PROVISIONING",
            "zone": f"{BASE}/projects/{self.project}/zones/{zone}",
            "machineType": f"{BASE}/projects/{self.project}/zones/{zone}/machineTypes/{machine}",
            "selfLink": f"{BASE}/projects/{self.project}/zones/{zone}/instances/{vm['name']}",
            "creationTimestamp": now_text(),
        })
        return vm

    def _get_instance(self, zone: str, name: str, **kw: Any) -> dict[str, Any]:
        vm = self._vm(zone, name)
        # Each read moves a booting VM on one step: PROVISIONING -> STAGING -> RUNNING.
        step = {"PROVISIONING": "STAGING", "STAGING": "RUNNING"}
        if vm["status"] in step:
            vm["status"] = step[vm["status"]]
            if vm["status"] == "RUNNING":
                vm["lastStartTimestamp"] = now_text()
        return vm

    def _vm(self, zone: str, name: str) -> dict[str, Any]:
        vm = self.instances.get((zone, name))
        if vm is None:
            raise HttpError(404, "notFound", f"The resource 'projects/{self.project}/zones/"
                                             f"{zone}/instances/{name}' was not found")
        return vm

    def _delete_instance(self, zone: str, name: str, **kw: Any) -> dict[str, Any]:
        self._vm(zone, name)
        del self.instances[(zone, name)]
        return self._new_operation(zone, name, "delete", done=True)

    def _maintenance(self, zone: str, name: str, **kw: Any) -> dict[str, Any]:
        """A simulated maintenance event: a Spot VM is preempted (:meth:`preempt`) at once;
        any other VM is left running, as a live migration would."""
        vm = self._vm(zone, name)
        op = self._new_operation(zone, name, "compute.instances.simulateMaintenanceEvent",
                                 done=True)  # fmt: skip
        if vm.get("scheduling", {}).get("provisioningModel") == "SPOT":
            self.preempt(zone, name)
        return op

    def _serial(self, zone: str, name: str, **kw: Any) -> dict[str, Any]:
        self._vm(zone, name)
        return {"kind": "compute#serialPortOutput", "contents": self.serial_output,
                "start": "0", "next": str(len(self.serial_output))}

    def _matching(self, filter_text: str) -> list[tuple[str, dict[str, Any]]]:
        clauses = re.findall(r'\(labels\.([a-z0-9_-]+) = "([a-z0-9_-]*)"\)', filter_text)
        leftover = re.sub(r'\(labels\.[a-z0-9_-]+ = "[a-z0-9_-]*"\)', "", filter_text)
        if leftover.strip():
            raise HttpError(400, "invalid", f"Invalid value for field 'filter': '{filter_text}'")
        return [
            (zone, vm) for (zone, _), vm in sorted(self.instances.items())
            if all(vm.get("labels", {}).get(k) == v for k, v in clauses)
        ]

    def _list_instances(self, zone: str, **kw: Any) -> dict[str, Any]:
        found = [vm for z, vm in self._matching(kw["query"].get("filter", "")) if z == zone]
        return self._page(found, kw["query"], "items")

    def _aggregated_instances(self, **kw: Any) -> dict[str, Any]:
        return self._aggregated_page(self._matching(kw["query"].get("filter", "")), kw["query"],
                                     "instances")

    # -- operations ----------------------------------------------------------

    def _new_operation(self, zone: str, name: str, kind: str, *, done: bool,
                       scope: str = "zones", target: str = "instances") -> dict[str, Any]:
        """An operation on ``name`` in a zone (or, with ``scope="regions"``, a region)."""
        op_name = f"operation-{next(self._ids)}"
        now = now_text()
        where = f"{BASE}/projects/{self.project}/{scope}/{zone}"
        op: dict[str, Any] = {
            "kind": "compute#operation", "id": str(next(self._ids)), "name": op_name,
            "operationType": kind, "status": "DONE" if done else "RUNNING",
            "zone" if scope == "zones" else "region": where,
            "targetLink": f"{where}/{target}/{name}",
            "insertTime": now, "progress": 100 if done else 0,
            "selfLink": f"{where}/operations/{op_name}",
        }
        if done:
            op["endTime"] = now
        self.operations[(zone, op_name)] = op
        return op

    def _get_operation(self, zone: str, op_name: str, **kw: Any) -> dict[str, Any]:
        op = self.operations.get((zone, op_name))
        if op is None:
            raise HttpError(404, "notFound", f"operation {op_name} not found")
        if op["status"] != "DONE":
            op.update(status="DONE", progress=100, endTime=now_text())
        return op

    def _list_operations(self, zone: str, **kw: Any) -> dict[str, Any]:
        filter_text = kw["query"].get("filter", "")
        m = re.fullmatch(r'\s*operationType = "([^"]+)"\s*', filter_text)
        if filter_text and m is None:
            raise HttpError(400, "invalid", f"Invalid value for field 'filter': '{filter_text}'")
        ops = [op for (z, _), op in self.operations.items()
               if z == zone and (m is None or op["operationType"] == m.group(1))]
        return self._page(ops, kw["query"], "items")

    def _get_machine_type(self, zone: str, name: str, **kw: Any) -> dict[str, Any]:
        if name not in self.zone_types.get(zone, []):
            raise HttpError(404, "notFound", f"The resource 'projects/{self.project}/zones/"
                                             f"{zone}/machineTypes/{name}' was not found")
        return self._machine_type(zone, name)

    # -- resource policies, regions, subnetworks, images, IAM -----------------

    def _insert_policy(self, region: str, *, query: dict[str, str],
                       body: dict[str, Any] | None, failure: _Failure | None) -> dict[str, Any]:
        assert body is not None
        try:
            compute_v1.ResourcePolicy.from_json(json.dumps(body), ignore_unknown_fields=False)
        except ParseError as exc:
            raise HttpError(400, "invalid", f"Invalid JSON payload received. {exc}") from exc
        rid = query.get("requestId", "")
        if rid and rid in self.request_ids:
            return self.operations[self.request_ids[rid]]
        name = body["name"]
        if (region, name) in self.policies:
            raise HttpError(409, "alreadyExists", f"The resource 'projects/{self.project}/"
                            f"regions/{region}/resourcePolicies/{name}' already exists")
        policy: dict[str, Any] = json.loads(json.dumps(body))
        policy.update({
            "kind": "compute#resourcePolicy", "id": str(next(self._ids)), "status": "READY",
            "region": f"{BASE}/projects/{self.project}/regions/{region}",
            "selfLink": f"{BASE}/projects/{self.project}/regions/{region}/resourcePolicies/"
                        f"{name}",
            "creationTimestamp": now_text(),
        })
        self.policies[(region, name)] = policy
        op = self._new_operation(region, name, "insert", done=False, scope="regions",
                                 target="resourcePolicies")
        if rid:
            self.request_ids[rid] = (region, op["name"])
        return op

    def _list_policies(self, region: str, **kw: Any) -> dict[str, Any]:
        if region not in self.quotas:
            raise HttpError(404, "notFound", f"The resource 'regions/{region}' was not found")
        found = [p for (r, _), p in sorted(self.policies.items()) if r == region]
        return self._page(found, kw["query"], "items")

    def _policy(self, region: str, name: str) -> dict[str, Any]:
        policy = self.policies.get((region, name))
        if policy is None:
            raise HttpError(404, "notFound", f"The resource 'projects/{self.project}/regions/"
                                             f"{region}/resourcePolicies/{name}' was not found")
        return policy

    def _get_policy(self, region: str, name: str, **kw: Any) -> dict[str, Any]:
        return self._policy(region, name)

    def _delete_policy(self, region: str, name: str, **kw: Any) -> dict[str, Any]:
        self._policy(region, name)
        suffix = f"regions/{region}/resourcePolicies/{name}"
        users = [n for (_, n), vm in self.instances.items()
                 if any(p.endswith(suffix) for p in vm.get("resourcePolicies", []))]
        if users:
            raise HttpError(400, "resourceInUseByAnotherResource",
                            f"The resource_policy resource '{suffix}' is already being used "
                            f"by '{users[0]}'")
        del self.policies[(region, name)]
        return self._new_operation(region, name, "delete", done=True, scope="regions",
                                   target="resourcePolicies")

    def _get_region_operation(self, region: str, op_name: str, **kw: Any) -> dict[str, Any]:
        return self._get_operation(region, op_name)

    def _get_region(self, region: str, **kw: Any) -> dict[str, Any]:
        if region not in self.quotas:
            raise HttpError(404, "notFound", f"The resource 'regions/{region}' was not found")
        quotas = [{"metric": m, "limit": limit, "usage": usage}
                  for m, (limit, usage) in sorted(self.quotas[region].items())]
        return {"kind": "compute#region", "name": region, "status": "UP", "quotas": quotas,
                "selfLink": f"{BASE}/projects/{self.project}/regions/{region}"}

    def _get_subnetwork(self, region: str, name: str, **kw: Any) -> dict[str, Any]:
        subnet = self.subnetworks.get((region, name))
        if subnet is None:
            raise HttpError(404, "notFound", f"The resource 'projects/{self.project}/regions/"
                                             f"{region}/subnetworks/{name}' was not found")
        return {"kind": "compute#subnetwork", "name": name, "ipCidrRange": subnet["ipCidrRange"],
                "network": f"{BASE}/projects/{self.project}/global/networks/{subnet['network']}",
                "region": f"{BASE}/projects/{self.project}/regions/{region}",
                "privateIpGoogleAccess": bool(subnet.get("privateIpGoogleAccess", False))}

    def _list_subnetworks(self, region: str, **kw: Any) -> dict[str, Any]:
        items = [self._get_subnetwork(r, n) for r, n in sorted(self.subnetworks) if r == region]
        return self._page(items, kw["query"], "items")

    def _list_routers(self, region: str, **kw: Any) -> dict[str, Any]:
        items = [{"kind": "compute#router", "region": region, **router}
                 for router in self.routers.get(region, [])]  # fmt: skip
        return self._page(items, kw["query"], "items")

    def _image(self, project: str, name: str) -> dict[str, Any]:
        image = self.images.get((project, name))
        if image is None:
            raise HttpError(404, "notFound", f"The resource 'projects/{project}/global/images/"
                                             f"{name}' was not found")
        return {"kind": "compute#image", "status": "READY", **image,
                "selfLink": f"{BASE}/projects/{project}/global/images/{image['name']}"}

    def _test_permissions(self, project: str, body: dict[str, Any] | None) -> dict[str, Any]:
        if project != self.project:
            raise HttpError(403, "forbidden", f"no access to project {project}")
        asked = (body or {}).get("permissions", [])
        granted = [p for p in asked if p not in self.denied]
        return {"permissions": granted} if granted else {}

    # -- billing ---------------------------------------------------------------

    def _skus(self, service: str, query: dict[str, str]) -> dict[str, Any]:
        if service != COMPUTE_SERVICE_ID:
            raise HttpError(404, "notFound", f"service {service} not found")
        size = int(query.get("pageSize") or self.sku_page_size)
        start = int(query.get("pageToken") or 0)
        end = start + size
        return {"skus": self.skus[start:end],
                "nextPageToken": str(end) if end < len(self.skus) else ""}

    # -- paging ----------------------------------------------------------------

    def _window(self, total: int, query: dict[str, str]) -> tuple[int, int, str]:
        size = int(query.get("maxResults") or self.page_size)
        start = int(query.get("pageToken") or 0)
        end = min(start + size, total)
        return start, end, str(end) if end < total else ""

    def _page(self, items: list[dict[str, Any]], query: dict[str, str],
              key: str) -> dict[str, Any]:
        start, end, token = self._window(len(items), query)
        page: dict[str, Any] = {key: items[start:end]}
        if token:
            page["nextPageToken"] = token
        return page

    def _aggregated_page(self, flat: list[tuple[str, dict[str, Any]]], query: dict[str, str],
                         key: str) -> dict[str, Any]:
        start, end, token = self._window(len(flat), query)
        items: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for zone, item in flat[start:end]:
            items.setdefault(f"zones/{zone}", {key: []})[key].append(item)
        page: dict[str, Any] = {"items": items}
        if token:
            page["nextPageToken"] = token
        return page


class _Handler(BaseHTTPRequestHandler):
    owner: GcpFake
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each answer waits ~40 ms for a delayed ACK

    def log_message(self, format: str, *args: Any) -> None:
        return  # keep test output clean

    def _serve(self, method: str) -> None:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw.strip() else None
        self.owner.requests.append(Recorded(method, parts.path, query, body,
                                            {k.lower(): v for k, v in self.headers.items()}))
        if self.owner.held(method, parts.path, body):
            self.close_connection = True
            return  # released only when the fake stops: the caller sees no answer
        try:
            status, payload = self.owner.handle(method, parts.path, query, body)
        except HttpError as err:
            status = err.status
            payload = {"error": {
                "code": err.status, "message": err.message,
                "errors": [{"message": err.message, "domain": "global", "reason": err.reason}],
                "status": ERROR_STATUS.get(err.status, "UNKNOWN"),
            }}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")
