"""A loopback fake of the Azure APIs the adapter calls: ARM compute and Retail Prices.

One threaded HTTP server on 127.0.0.1 answers, like Azure does:

ARM (``/subscriptions/{sub}/...``, paths matched case-insensitively, the
``api-version`` ignored):
- ``GET  providers/Microsoft.Compute/skus?$filter=location eq 'x'``: resource
  SKUs of that location, paged by ``nextLink``;
- ``PUT  resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}``:
  201 + ``Azure-AsyncOperation`` for a new VM (200 for an existing one);
- ``GET  .../virtualMachines/{name}[?$expand=instanceView]``, 404 ``ResourceNotFound``;
- ``GET  .../virtualMachines``: the resource group's VMs, paged by ``nextLink``;
- ``DELETE .../virtualMachines/{name}``: 202 + ``Location`` (204 when missing);
- ``GET  providers/Microsoft.Compute/locations/{loc}/operations/{id}``: the
  async status (``InProgress`` for ``async_polls`` polls, then ``Succeeded``
  or ``Failed`` with the injected error);
- ``GET  providers/Microsoft.Compute/locations/{loc}/operationResults/{id}``: 204;
- scale sets: ``PUT/GET/DELETE .../virtualMachineScaleSets/{name}`` (VMs made at
  the PUT, ``Creating`` until the async operation ends), ``PATCH
  .../virtualMachineScaleSets/{name}`` (tags, custom data, and a larger capacity
  adds VMs as a scale-out does), ``GET
  .../virtualMachineScaleSets`` (list), ``POST .../{name}/delete`` (delete
  instances), ``GET .../{name}/virtualMachines[?$expand=instanceView]`` and
  ``GET .../{name}/networkInterfaces`` (the network API's NIC list, with a
  private address per VM);
- ``POST .../virtualMachines/{name}/simulateEviction`` and ``POST
  .../virtualMachineScaleSets/{name}/virtualMachines/{id}/simulateEviction``: 204, and a
  Spot VM is evicted at once (409 ``OperationNotAllowed`` for any other);
- ``GET providers/Microsoft.Compute/locations/{loc}/usages`` (quotas),
  ``GET .../publishers/{p}/artifacttypes/vmimage/offers/{o}/skus/{s}/versions[/{v}]``
  (images), ``GET {scope}/providers/Microsoft.Authorization/permissions``;
- network reads: ``GET .../Microsoft.Network/virtualNetworks/{v}/subnets/{s}`` (a NAT
  gateway on it unless :attr:`FakeAzure.subnets` says otherwise) and
  ``GET .../Microsoft.Network/routeTables/{t}`` (:attr:`FakeAzure.route_tables`).

Every VM and scale set PUT body is read with the SDK's own models
(``VirtualMachine``, ``VirtualMachineScaleSet``) and refused (400
``InvalidRequestContent``) when any field is unknown to them, so a misspelt
field fails the launch; the parsed models are kept (:meth:`FakeAzure.set_model`).

Retail Prices: ``GET /api/retail/prices?$filter=...`` with ``armRegionName``
and ``armSkuName``, paged by ``NextPageLink`` (``price_page_size`` rows a page).

Levers: :meth:`FakeAzure.fail_next_put` (an error for the next VM or scale
set PUT, sent at once or through the async operation; a failed set keeps half
its VMs), :meth:`FakeAzure.short_next_set` (the next set "succeeds" with fewer
VMs), ``hold_sets`` (scale set operations never finish), :meth:`FakeAzure.evict`
(Azure takes a Spot VM back), :meth:`FakeAzure.fail_next_prices`, ``denied``
(actions the permissions list refuses), ``usages`` (quota figures),
``images`` (published images), and ``requests``, the record of every
request (the Authorization header reduced to its scheme).

EVERY PRICE HERE IS MADE UP. The numbers only have the shape of real ones
(spot well under on-demand, Windows above Linux, low priority lowest).
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from azure.mgmt.compute.models import (
    VirtualMachine,
    VirtualMachineScaleSet,
    VirtualMachineScaleSetUpdate,
)

JSON = dict[str, Any]

SUBSCRIPTION = "00000000-0000-0000-0000-00000000f00d"
RESOURCE_GROUP = "spotd-test"


@dataclass(frozen=True)
class SkuFixture:
    """One VM size in one region as the fake's SKU API lists it."""

    size: str
    region: str
    zones: tuple[str, ...] = ("1", "2", "3")
    gpus: int = 8
    spot: bool = True
    rdma: bool = True
    restricted_zones: tuple[str, ...] = ()
    region_restricted: bool = False


DEFAULT_SKUS: tuple[SkuFixture, ...] = (
    SkuFixture("Standard_ND96isr_H100_v5", "eastus", restricted_zones=("3",)),
    SkuFixture("Standard_ND96isr_H100_v5", "westus3"),
    SkuFixture("Standard_NC24ads_A100_v4", "eastus", gpus=1, rdma=False),
    SkuFixture("Standard_NC24ads_A100_v4", "westus3", zones=("1",), gpus=1, rdma=False),
    SkuFixture("Standard_ND96asr_v4", "eastus", zones=("1", "2")),
    SkuFixture("Standard_ND96asr_v4", "westus3", region_restricted=True),
    SkuFixture("Standard_NC40ads_H100_v5", "eastus", gpus=1, spot=False, rdma=False),
    SkuFixture("Standard_D4s_v5", "eastus", gpus=0, rdma=False),  # no GPU: left out
)

# Made-up Linux pay-as-you-go prices, USD per hour.
MADE_UP_ON_DEMAND = {
    "Standard_ND96isr_H100_v5": 98.32,
    "Standard_NC24ads_A100_v4": 3.67,
    "Standard_ND96asr_v4": 27.20,
    "Standard_NC40ads_H100_v5": 6.98,
    "Standard_D4s_v5": 0.19,
}


def price_row(region: str, size: str, price: float, *, sku_suffix: str = "",
              windows: bool = False, kind: str = "Consumption",
              unit: str = "1 Hour", start: str = "2026-01-01T00:00:00Z") -> JSON:
    """One Retail Prices item, shaped like the real API's."""
    series = size.removeprefix("Standard_")
    return {
        "currencyCode": "USD", "retailPrice": price, "unitPrice": price,
        "armRegionName": region, "location": region, "armSkuName": size,
        "effectiveStartDate": start, "meterName": f"{series}{sku_suffix}",
        "productName": f"Virtual Machines {series} Series" + (" Windows" if windows else ""),
        "skuName": f"{series}{sku_suffix}", "serviceName": "Virtual Machines",
        "type": kind, "unitOfMeasure": unit, "isPrimaryMeterRegion": True,
    }


def made_up_prices(region: str, size: str, on_demand: float) -> list[JSON]:
    """Every meter kind of one size: only two rows are Linux spot and on-demand."""
    return [
        price_row(region, size, on_demand + 4.0, windows=True),
        price_row(region, size, round(on_demand * 0.2, 4), sku_suffix=" Low Priority"),
        price_row(region, size, round(on_demand * 0.35, 4), sku_suffix=" Spot", windows=True),
        price_row(region, size, on_demand),
        price_row(region, size, round(on_demand * 0.6, 4), kind="DevTestConsumption"),
        price_row(region, size, round(on_demand * 0.3, 4), sku_suffix=" Spot"),
        price_row(region, size, on_demand * 5000, kind="Reservation", unit="1 Year"),
    ]


def default_prices() -> list[JSON]:
    """The made-up catalogue of every default SKU in both regions."""
    return [row for region in ("eastus", "westus3") for size, od in MADE_UP_ON_DEMAND.items()
            for row in made_up_prices(region, size, od)]


@dataclass
class Failure:
    """An error the next VM PUT gets: at once (``status``) or from the async operation."""

    code: str
    status: int = 409
    via_operation: bool = False
    details: tuple[str, ...] = ()


@dataclass
class Recorded:
    """One request the fake served."""

    method: str
    path: str
    query: dict[str, str]
    body: JSON | None
    auth_scheme: str


@dataclass
class _Operation:
    vm: str
    polls_left: int
    error: JSON | None = None
    scale_set: bool = False
    keep: int | None = None
    """For a set: VMs left when it ends (fewer than asked: a shortfall)."""


@dataclass
class _ScaleSet:
    body: JSON
    members: dict[str, JSON] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    next_index: int = 0


@dataclass
class _State:
    vms: dict[str, JSON] = field(default_factory=dict)
    power: dict[str, str] = field(default_factory=dict)
    operations: dict[str, _Operation] = field(default_factory=dict)
    failures: deque[Failure] = field(default_factory=deque)
    price_failures: deque[int] = field(default_factory=deque)
    garbled: deque[bytes] = field(default_factory=deque)
    evicted: set[str] = field(default_factory=set)
    requests: list[Recorded] = field(default_factory=list)
    sets: dict[str, _ScaleSet] = field(default_factory=dict)
    shortfalls: deque[int] = field(default_factory=deque)
    set_models: dict[str, VirtualMachineScaleSet] = field(default_factory=dict)
    addresses_given: int = 0


ARM = r"/subscriptions/(?P<sub>[^/]+)"
VM_ROUTE = re.compile(
    ARM + r"/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/virtualMachines"
    r"(?:/(?P<name>[^/]+))?$", re.IGNORECASE)  # fmt: skip
SKU_ROUTE = re.compile(ARM + r"/providers/Microsoft\.Compute/skus$", re.IGNORECASE)
OP_ROUTE = re.compile(
    ARM + r"/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)/"
    r"(?P<kind>operations|operationResults)/(?P<op>[^/]+)$", re.IGNORECASE)  # fmt: skip
SET_ROUTE = re.compile(
    ARM + r"/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/virtualMachineScaleSets"
    r"(?:/(?P<name>[^/]+)(?:/(?P<part>virtualMachines|networkInterfaces|delete))?)?$",
    re.IGNORECASE)  # fmt: skip
EVICT_ROUTE = re.compile(
    ARM + r"/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Compute/(?:virtualMachineScaleSets/"
    r"(?P<set>[^/]+)/virtualMachines/(?P<index>[^/]+)|virtualMachines/(?P<name>[^/]+))"
    r"/simulateEviction$", re.IGNORECASE)  # fmt: skip
USAGE_ROUTE = re.compile(ARM + r"/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)/usages$",
                         re.IGNORECASE)  # fmt: skip
IMAGE_ROUTE = re.compile(
    ARM + r"/providers/Microsoft\.Compute/locations/(?P<loc>[^/]+)/publishers/(?P<pub>[^/]+)/"
    r"artifacttypes/vmimage/offers/(?P<offer>[^/]+)/skus/(?P<sku>[^/]+)/versions"
    r"(?:/(?P<version>[^/]+))?$", re.IGNORECASE)  # fmt: skip
PERMISSIONS_ROUTE = re.compile(r"^(?P<scope>/subscriptions/.+)/providers/"
                               r"Microsoft\.Authorization/permissions$", re.IGNORECASE)  # fmt: skip
SUBNET_ROUTE = re.compile(
    ARM + r"/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Network/virtualNetworks/"
    r"(?P<vnet>[^/]+)/subnets/(?P<name>[^/]+)$", re.IGNORECASE)  # fmt: skip
ROUTE_TABLE_ROUTE = re.compile(
    ARM + r"/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.Network/routeTables/"
    r"(?P<name>[^/]+)$", re.IGNORECASE)  # fmt: skip
PRICES_ROUTE = "/api/retail/prices"

DEFAULT_IMAGES = frozenset({("microsoft-dsvm", "ubuntu-hpc", "2204", "2204.2026.1101")})
"""Published images: (publisher, offer, sku, version); the settings' default is among them."""


def default_usages() -> dict[str, tuple[int, int]]:
    """Quota name -> (current, limit) of every region: room for 4 ND96 nodes, spot or not."""
    return {"cores": (8, 1000), "lowPriorityCores": (0, 400),
            "standardNDSH100v5Family": (0, 400), "standardNDASv4Family": (0, 400),
            "standardNCADSA100v4Family": (0, 96)}  # fmt: skip


def unknown_fields(model: Any, path: str = "") -> list[str]:
    """Paths of the keys of an SDK model (read from JSON) that its class does not know.

    The models accept any key, so a misspelt field would pass silently; this
    walks the model by the SDK's own field table (``_attr_to_rest_field``,
    the only place the generated code keeps its schema).
    """
    fields = {rf._rest_name: attr for attr, rf in type(model)._attr_to_rest_field.items()}
    found = []
    for key in model:
        where = f"{path}.{key}" if path else key
        if key not in fields:
            found.append(where)
            continue
        value = getattr(model, fields[key])
        values = value if isinstance(value, list) else \
            list(value.values()) if isinstance(value, dict) else [value]  # fmt: skip
        for item in values:
            if hasattr(type(item), "_attr_to_rest_field"):
                found += unknown_fields(item, where)
    return found


class FakeAzure:
    """The fake's server and state; use as a context manager or call :meth:`close`."""

    def __init__(
        self,
        *,
        skus: tuple[SkuFixture, ...] = DEFAULT_SKUS,
        prices: list[JSON] | None = None,
        price_page_size: int = 3,
        list_page_size: int = 2,
        async_polls: int = 1,
    ) -> None:
        self.skus = skus
        self.prices = default_prices() if prices is None else prices
        self.price_page_size = price_page_size
        self.list_page_size = list_page_size
        self.async_polls = async_polls
        self.missing_delete_status = 204
        self.hold_sets = False
        """Scale set operations stay InProgress (a launch held after its set exists)."""
        self.denied: set[str] = set()
        """Actions the caller's permissions list leaves out (``notActions``)."""
        self.usages: dict[str, tuple[int, int]] = default_usages()
        self.images: set[tuple[str, str, str, str]] = set(DEFAULT_IMAGES)
        self.subnets: dict[str, JSON] = {}
        """Subnet name -> its ``properties``; a subnet not here has a NAT gateway."""
        self.route_tables: dict[str, JSON] = {}
        """Route table name -> its ``properties`` (``routes``)."""
        self.state = _State()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.server.daemon_threads = True
        self.link_base: str | None = None
        """Where next-page links point; None for the fake itself."""
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """Base URL of the fake (ARM and Retail Prices alike)."""
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)

    def __enter__(self) -> FakeAzure:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- levers ------------------------------------------------------------------

    def fail_next_put(self, code: str, *, status: int = 409, via_operation: bool = False,
                      after: int = 0, details: tuple[str, ...] = ()) -> None:
        """Fail the VM PUT (or scale set PUT or PATCH) after the next ``after`` ones with
        ARM error ``code``.

        ``details`` are codes of inner errors (ARM nests the real cause there at times).
        """
        with self.lock:
            for _ in range(after):
                self.state.failures.append(Failure("", 0))
            self.state.failures.append(Failure(code, status, via_operation, details))

    def short_next_set(self, keep: int) -> None:
        """Let the next new scale set end Succeeded with only ``keep`` VMs."""
        with self.lock:
            self.state.shortfalls.append(keep)

    def set_model(self, name: str) -> VirtualMachineScaleSet | None:
        """The last PUT body of scale set ``name``, read with the SDK's model."""
        with self.lock:
            return self.state.set_models.get(name)

    def scale_set(self, name: str) -> JSON | None:
        """The stored scale set, as PUT plus what ARM adds."""
        with self.lock:
            held = self.state.sets.get(name)
            return json.loads(json.dumps(held.body)) if held else None

    def members(self, name: str) -> list[str]:
        """Ids (``<set>_<instanceId>``) of the VMs now in scale set ``name``."""
        with self.lock:
            held = self.state.sets.get(name)
            return [m["name"] for m in held.members.values()] if held else []

    def fail_next_prices(self, status: int) -> None:
        """Answer the next Retail Prices request with this HTTP status."""
        with self.lock:
            self.state.price_failures.append(status)

    def garble_next(self, replies: int = 1, body: bytes = b'{"value": [truncated') -> None:
        """Answer the next ``replies`` ARM requests 200 with ``body``: by default not
        JSON at all, or JSON of a shape the SDK cannot read."""
        with self.lock:
            self.state.garbled.extend([body] * replies)

    def take_garbled(self) -> bytes | None:
        """The body to answer this request with instead of the real one, if any."""
        with self.lock:
            return self.state.garbled.popleft() if self.state.garbled else None

    def evict(self, name: str) -> None:
        """Azure takes a Spot VM back: deleted (policy Delete) or deallocated."""
        with self.lock:
            set_name, _, index = name.rpartition("_")
            if set_name in self.state.sets:  # a VM of a scale set: it leaves the set
                held = self.state.sets[set_name]
                del held.members[index]
                held.body["sku"]["capacity"] = len(held.members)
                self.state.power.pop(name, None)
                self.state.evicted.add(name)
                return
            vm = self.state.vms[name]
            if vm["properties"].get("evictionPolicy") == "Deallocate":
                self.state.power[name] = "deallocated"
                return
            del self.state.vms[name]
            self.state.evicted.add(name)

    def simulate_eviction(self, name: str) -> tuple[int, JSON | None]:
        """``simulateEviction`` of a VM (or a scale set's ``set_index``): a Spot one is
        evicted at once (:meth:`evict`); any other is refused as Azure does (409)."""
        with self.lock:
            set_name, _, index = name.rpartition("_")
            held = self.state.sets.get(set_name)
            if held is not None:
                found = index in held.members
                priority = held.body["properties"]["virtualMachineProfile"].get("priority")
            else:
                vm = self.state.vms.get(name)
                found = vm is not None
                priority = vm["properties"].get("priority") if vm is not None else None
        if not found:
            return 404, _error("ResourceNotFound", f"The Resource '{name}' was not found.")
        if str(priority).lower() != "spot":
            return 409, _error("OperationNotAllowed", "Simulate eviction is only supported "
                               "for Spot virtual machines.")  # fmt: skip
        self.evict(name)
        return 204, None

    def vm(self, name: str) -> JSON | None:
        """The stored VM, as PUT plus what ARM adds."""
        with self.lock:
            return self.state.vms.get(name)

    def requests_of(self, method: str, fragment: str = "") -> list[Recorded]:
        """Recorded requests of ``method`` whose path contains ``fragment``."""
        with self.lock:
            return [r for r in self.state.requests
                    if r.method == method and fragment.lower() in r.path.lower()]

    # -- ARM ---------------------------------------------------------------------

    def list_skus(self, query: dict[str, str]) -> tuple[int, JSON]:
        match = re.search(r"location eq '([^']*)'", query.get("$filter", ""))
        region = match.group(1).lower() if match else None
        items = [_sku_json(s) for s in self.skus if region in (None, s.region)]
        return 200, self._page(items, query, "value", "nextLink", 3)

    def put_vm(self, rg: str, name: str, body: JSON) -> tuple[int, JSON, dict[str, str]]:
        unknown = unknown_fields(VirtualMachine(body))
        if unknown:
            return 400, _error("InvalidRequestContent", f"unknown fields {unknown}"), {}
        with self.lock:
            failure = self.state.failures.popleft() if self.state.failures else None
            if failure is not None and failure.code and not failure.via_operation:
                return failure.status, _error(failure.code, details=failure.details), {}
            if name in self.state.vms:
                self.state.vms[name]["tags"] = body.get("tags") or {}
                return 200, self.state.vms[name], {}
            vm = self._new_vm(rg, name, body)
            op_id = uuid.uuid4().hex
            error = (_error(failure.code, details=failure.details)["error"]
                     if failure and failure.code else None)  # fmt: skip
            self.state.operations[op_id] = _Operation(name, self.async_polls, error)
        location = vm["location"]
        op_url = f"{self.url}/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/" \
                 f"locations/{location}/operations/{op_id}"
        return 201, vm, {"Azure-AsyncOperation": op_url}

    def _new_vm(self, rg: str, name: str, body: JSON) -> JSON:
        vm: JSON = json.loads(json.dumps(body))
        vm.update(
            id=f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{rg}/providers/"
               f"Microsoft.Compute/virtualMachines/{name}",
            name=name, type="Microsoft.Compute/virtualMachines",
        )  # fmt: skip
        props = vm.setdefault("properties", {})
        props.update(provisioningState="Creating", vmId=str(uuid.uuid4()),
                     timeCreated=datetime.now(UTC).isoformat())  # fmt: skip
        self.state.vms[name] = vm
        self.state.power[name] = "starting"
        return vm

    def operation(self, op_id: str) -> tuple[int, JSON]:
        with self.lock:
            op = self.state.operations.get(op_id)
            if op is None:
                return 404, _error("NotFound")
            if op.scale_set:
                return self._set_operation(op_id, op)
            if op.polls_left > 0:
                op.polls_left -= 1
                return 200, {"status": "InProgress", "name": op_id}
            vm = self.state.vms.get(op.vm)
            if op.error is not None:
                if vm is not None:
                    vm["properties"]["provisioningState"] = "Failed"
                    self.state.power[op.vm] = "stopped"
                return 200, {"status": "Failed", "name": op_id, "error": op.error}
            if vm is not None:
                vm["properties"]["provisioningState"] = "Succeeded"
                self.state.power[op.vm] = "running"
            return 200, {"status": "Succeeded", "name": op_id}

    def get_vm(self, name: str, query: dict[str, str]) -> tuple[int, JSON]:
        with self.lock:
            vm = self.state.vms.get(name)
            if vm is None:
                return 404, _error("ResourceNotFound", f"The Resource '{name}' was not found.")
            answer = json.loads(json.dumps(vm))
            if query.get("$expand", "").lower() == "instanceview":
                answer["properties"]["instanceView"] = self._instance_view(name)
            return 200, answer

    def _instance_view(self, name: str) -> JSON:
        provisioning = self.state.vms[name]["properties"]["provisioningState"].lower()
        power = self.state.power.get(name, "unknown")
        return {"statuses": [
            {"code": f"ProvisioningState/{provisioning}", "level": "Info"},
            {"code": f"PowerState/{power}", "level": "Info"},
        ]}  # fmt: skip

    def list_vms(self, query: dict[str, str]) -> tuple[int, JSON]:
        with self.lock:
            items = [json.loads(json.dumps(v)) for v in self.state.vms.values()]
        return 200, self._page(items, query, "value", "nextLink", self.list_page_size)

    def delete_vm(self, name: str) -> tuple[int, JSON | None, dict[str, str]]:
        with self.lock:
            vm = self.state.vms.pop(name, None)
            self.state.power.pop(name, None)
        if vm is None:
            status = self.missing_delete_status
            return status, (_error("ResourceNotFound") if status == 404 else None), {}
        location = f"{self.url}/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/" \
                   f"locations/{vm['location']}/operationResults/{uuid.uuid4().hex}"
        return 202, None, {"Location": location}

    # -- scale sets --------------------------------------------------------------

    def _operation_url(self, location: str, op_id: str) -> str:
        return (f"{self.url}/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/"
                f"locations/{location}/operations/{op_id}")  # fmt: skip

    def put_set(self, rg: str, name: str, body: JSON) -> tuple[int, JSON, dict[str, str]]:
        model = VirtualMachineScaleSet(body)
        unknown = unknown_fields(model)
        if unknown:
            return 400, _error("InvalidRequestContent", f"unknown fields {unknown}"), {}
        with self.lock:
            self.state.set_models[name] = model
            failure = self.state.failures.popleft() if self.state.failures else None
            if failure is not None and failure.code and not failure.via_operation:
                return failure.status, _error(failure.code, details=failure.details), {}
            held = self.state.sets.get(name)
            if held is not None:
                held.body["tags"] = body.get("tags") or {}
                if held.body["properties"]["provisioningState"] == "Succeeded":
                    return 200, held.body, {}
            else:
                held = self._new_set(rg, name, body)
            op_id = uuid.uuid4().hex
            error = (_error(failure.code, details=failure.details)["error"]
                     if failure and failure.code else None)  # fmt: skip
            keep = self.state.shortfalls.popleft() if self.state.shortfalls else None
            self.state.operations[op_id] = _Operation(name, self.async_polls, error,
                                                      scale_set=True, keep=keep)  # fmt: skip
            answer = json.loads(json.dumps(held.body))
        return 201, answer, {"Azure-AsyncOperation": self._operation_url(body["location"], op_id)}

    def _new_set(self, rg: str, name: str, body: JSON) -> _ScaleSet:
        stored: JSON = json.loads(json.dumps(body))
        set_id = (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{rg}/providers/"
                  f"Microsoft.Compute/virtualMachineScaleSets/{name}")  # fmt: skip
        stored.update(id=set_id, name=name, type="Microsoft.Compute/virtualMachineScaleSets")
        stored["properties"].update(provisioningState="Creating", uniqueId=str(uuid.uuid4()),
                                    timeCreated=datetime.now(UTC).isoformat())  # fmt: skip
        held = self.state.sets[name] = _ScaleSet(stored)
        self._add_members(held, int(stored["sku"]["capacity"]))
        return held

    def _add_members(self, held: _ScaleSet, count: int) -> None:
        """``count`` new VMs (creating) in ``held``, from its model now."""
        stored, name, set_id = held.body, held.body["name"], held.body["id"]
        for _ in range(count):
            index = str(held.next_index)
            held.next_index += 1
            held.members[index] = {
                "instanceId": index, "name": f"{name}_{index}",
                "id": f"{set_id}/virtualMachines/{index}",
                "location": stored["location"], "zones": stored.get("zones"),
                "tags": stored.get("tags") or {}, "sku": dict(stored["sku"]),
                "properties": {"provisioningState": "Creating", "latestModelApplied": True,
                               "timeCreated": datetime.now(UTC).isoformat(),
                               "vmId": str(uuid.uuid4())},
            }  # fmt: skip
            self.state.addresses_given += 1
            given = self.state.addresses_given
            held.addresses[index] = f"10.1.{given // 250}.{given % 250 + 4}"
            self.state.power[f"{name}_{index}"] = "starting"

    def patch_set(self, name: str, body: JSON) -> tuple[int, JSON, dict[str, str]]:
        """PATCH of a scale set: new tags, a new capacity (a larger one adds VMs from the
        set's model, as ARM scales out), a new custom data for the VMs made from now on."""
        unknown = unknown_fields(VirtualMachineScaleSetUpdate(body))
        if unknown:
            return 400, _error("InvalidRequestContent", f"unknown fields {unknown}"), {}
        with self.lock:
            held = self.state.sets.get(name)
            if held is None:
                return 404, _error("ResourceNotFound", f"The Resource '{name}' was not found."), {}
            failure = self.state.failures.popleft() if self.state.failures else None
            if failure is not None and failure.code and not failure.via_operation:
                return failure.status, _error(failure.code, details=failure.details), {}
            error = (_error(failure.code, details=failure.details)["error"]
                     if failure and failure.code else None)  # fmt: skip
            if "tags" in body:
                held.body["tags"] = body["tags"] or {}
            custom = (body.get("properties", {}).get("virtualMachineProfile", {})
                      .get("osProfile", {}).get("customData"))  # fmt: skip
            if custom is not None:
                held.body["properties"]["virtualMachineProfile"]["osProfile"]["customData"] = custom
            self.state.set_models[name] = VirtualMachineScaleSet(held.body)
            wanted = int((body.get("sku") or {}).get("capacity", len(held.members)))
            if wanted <= len(held.members):
                return 200, json.loads(json.dumps(held.body)), {}
            before = len(held.members)
            self._add_members(held, wanted - before)
            held.body["properties"]["provisioningState"] = "Updating"
            op_id = uuid.uuid4().hex
            # A failed scale-out takes back the VMs it added, and only those.
            self.state.operations[op_id] = _Operation(
                name, self.async_polls, error, scale_set=True,
                keep=before if error is not None else None)  # fmt: skip
            answer = json.loads(json.dumps(held.body))
        return 200, answer, {"Azure-AsyncOperation": self._operation_url(answer["location"], op_id)}

    def _set_operation(self, op_id: str, op: _Operation) -> tuple[int, JSON]:
        """Called with the lock held."""
        held = self.state.sets.get(op.vm)
        if self.hold_sets or op.polls_left > 0:
            op.polls_left = max(0, op.polls_left - 1)
            return 200, {"status": "InProgress", "name": op_id}
        if held is None:
            return 200, {"status": "Failed", "name": op_id, "error": _error("NotFound")["error"]}
        keep = len(held.members) // 2 if op.error is not None and op.keep is None else op.keep
        for index in list(held.members)[keep:] if keep is not None else []:
            del held.members[index]
            self.state.power.pop(f"{op.vm}_{index}", None)
        for index, member in held.members.items():
            member["properties"]["provisioningState"] = "Succeeded"
            self.state.power[f"{op.vm}_{index}"] = "running"
        held.body["sku"]["capacity"] = len(held.members)
        if op.error is not None:
            held.body["properties"]["provisioningState"] = "Failed"
            return 200, {"status": "Failed", "name": op_id, "error": op.error}
        held.body["properties"]["provisioningState"] = "Succeeded"
        return 200, {"status": "Succeeded", "name": op_id}

    def get_set(self, name: str) -> tuple[int, JSON]:
        body = self.scale_set(name)
        if body is None:
            return 404, _error("ResourceNotFound", f"The Resource '{name}' was not found.")
        return 200, body

    def list_sets(self, query: dict[str, str]) -> tuple[int, JSON]:
        with self.lock:
            items = [json.loads(json.dumps(s.body)) for s in self.state.sets.values()]
        return 200, self._page(items, query, "value", "nextLink", self.list_page_size)

    def delete_set(self, name: str) -> tuple[int, JSON | None, dict[str, str]]:
        with self.lock:
            held = self.state.sets.pop(name, None)
            for index in held.members if held else []:
                self.state.power.pop(f"{name}_{index}", None)
        if held is None:
            status = self.missing_delete_status
            return status, (_error("ResourceNotFound") if status == 404 else None), {}
        return 202, None, {"Location": self._result_url(held.body["location"])}

    def _result_url(self, location: str) -> str:
        return (f"{self.url}/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/"
                f"locations/{location}/operationResults/{uuid.uuid4().hex}")  # fmt: skip

    def delete_members(self, name: str, body: JSON) -> tuple[int, JSON | None, dict[str, str]]:
        with self.lock:
            held = self.state.sets.get(name)
            if held is None:
                return 404, _error("ResourceNotFound"), {}
            for index in body.get("instanceIds") or []:
                held.members.pop(str(index), None)
                self.state.power.pop(f"{name}_{index}", None)
            held.body["sku"]["capacity"] = len(held.members)
            location = held.body["location"]
        return 202, None, {"Location": self._result_url(location)}

    def list_members(self, name: str, query: dict[str, str]) -> tuple[int, JSON]:
        with self.lock:
            held = self.state.sets.get(name)
            if held is None:
                return 404, _error("ResourceNotFound")
            items = []
            for index, member in held.members.items():
                answer = json.loads(json.dumps(member))
                if query.get("$expand", "").lower() == "instanceview":
                    power = self.state.power.get(f"{name}_{index}", "unknown")
                    provisioning = member["properties"]["provisioningState"].lower()
                    answer["properties"]["instanceView"] = {"statuses": [
                        {"code": f"ProvisioningState/{provisioning}", "level": "Info"},
                        {"code": f"PowerState/{power}", "level": "Info"},
                    ]}  # fmt: skip
                items.append(answer)
        return 200, self._page(items, query, "value", "nextLink", self.list_page_size)

    def list_nics(self, name: str, query: dict[str, str]) -> tuple[int, JSON]:
        """The network API's NICs of a scale set's VMs (one each, accelerated)."""
        with self.lock:
            held = self.state.sets.get(name)
            if held is None:
                return 404, _error("ResourceNotFound")
            items = [{
                "id": f"{m['id']}/networkInterfaces/{name}-nic", "name": f"{name}-nic",
                "properties": {
                    "virtualMachine": {"id": m["id"]}, "primary": True,
                    "enableAcceleratedNetworking": True,
                    "ipConfigurations": [{"name": "ipconfig1", "properties": {
                        "privateIPAddress": held.addresses[i], "primary": True}}],
                },
            } for i, m in held.members.items()]  # fmt: skip
        return 200, self._page(items, query, "value", "nextLink", self.list_page_size)

    # -- quotas, images, permissions ---------------------------------------------

    def list_usages(self) -> tuple[int, JSON]:
        with self.lock:
            usages = dict(self.usages)
        return 200, {"value": [
            {"name": {"value": n, "localizedValue": n}, "currentValue": c, "limit": lim,
             "unit": "Count"} for n, (c, lim) in usages.items()
        ]}  # fmt: skip

    def image(self, loc: str, pub: str, offer: str, sku: str,
              version: str | None) -> tuple[int, Any]:  # fmt: skip
        with self.lock:
            wanted = (pub.lower(), offer.lower(), sku.lower())
            versions = sorted(v for p, o, s, v in self.images if (p, o, s) == wanted)
        base = (f"/Subscriptions/{SUBSCRIPTION}/Providers/Microsoft.Compute/Locations/{loc}/"
                f"Publishers/{pub}/ArtifactTypes/VMImage/Offers/{offer}/Skus/{sku}/"
                "Versions")  # fmt: skip
        if version is None:
            return 200, [{"name": v, "location": loc, "id": f"{base}/{v}"} for v in versions]
        if version not in versions:
            return 404, _error("ImageNotFound", f"image version {version} not found")
        return 200, {"name": version, "location": loc, "id": f"{base}/{version}",
                     "properties": {"osImage": {"operatingSystem": "Linux"}}}  # fmt: skip

    def subnet(self, path: str, name: str) -> tuple[int, JSON]:
        group = path.partition("/providers/")[0]
        nat = {"id": f"{group}/providers/Microsoft.Network/natGateways/nat"}
        props = self.subnets.get(name, {"addressPrefix": "10.0.0.0/24", "natGateway": nat})
        return 200, {"id": path, "name": name, "properties": props}

    def route_table(self, path: str, name: str) -> tuple[int, JSON]:
        if name not in self.route_tables:
            return 404, _error("ResourceNotFound", f"route table {name} not found")
        return 200, {"id": path, "name": name, "properties": self.route_tables[name]}

    def permissions(self) -> tuple[int, JSON]:
        with self.lock:
            denied = sorted(self.denied)
        return 200, {"value": [{"actions": ["*"], "notActions": denied,
                                "dataActions": [], "notDataActions": []}]}  # fmt: skip

    # -- Retail Prices -----------------------------------------------------------

    def retail_prices(self, query: dict[str, str]) -> tuple[int, JSON | None]:
        with self.lock:
            if self.state.price_failures:
                return self.state.price_failures.popleft(), None
        text = query.get("$filter", "")
        region = re.search(r"armRegionName eq '([^']*)'", text)
        size = re.search(r"armSkuName eq '([^']*)'", text)
        rows = [
            r for r in self.prices
            if "serviceName eq 'Virtual Machines'" in text
            and (region is None or r["armRegionName"] == region.group(1))
            and (size is None or r["armSkuName"] == size.group(1))
        ]  # fmt: skip
        return 200, self._page(rows, query, "Items", "NextPageLink", self.price_page_size)

    def _page(self, items: list[JSON], query: dict[str, str], key: str, link: str,
              size: int) -> JSON:
        skip = int(query.get("$skip", "0"))
        page: JSON = {key: items[skip:skip + size]}
        if skip + size < len(items):
            rest = "&".join(f"{quote(k)}={quote(v)}" for k, v in query.items()
                            if k not in ("$skip", "__path"))  # fmt: skip
            page[link] = f"{self.link_base or self.url}{query['__path']}?{rest}&$skip={skip + size}"
        else:
            page[link] = None
        if key == "Items":
            page["Count"] = len(page[key])
        return page

    def record(self, rec: Recorded) -> None:
        with self.lock:
            self.state.requests.append(rec)


def _error(code: str, message: str | None = None, details: tuple[str, ...] = ()) -> JSON:
    error: JSON = {"code": code, "message": message or f"fake ARM error {code}"}
    if details:
        error["details"] = [{"code": d, "message": f"fake inner error {d}"} for d in details]
    return {"error": error}


def _sku_json(s: SkuFixture) -> JSON:
    caps = [("vCPUs", "96" if s.gpus >= 8 else "24"), ("MemoryGB", "1900"),
            ("LowPriorityCapable", str(s.spot)), ("RdmaEnabled", str(s.rdma)),
            ("AcceleratedNetworkingEnabled", "True")]
    if s.gpus:
        caps.append(("GPUs", str(s.gpus)))
    restrictions: list[JSON] = []
    if s.restricted_zones:
        restrictions.append({"type": "Zone", "values": [s.region],
                             "restrictionInfo": {"locations": [s.region],
                                                 "zones": list(s.restricted_zones)},
                             "reasonCode": "NotAvailableForSubscription"})  # fmt: skip
    if s.region_restricted:
        restrictions.append({"type": "Location", "values": [s.region],
                             "restrictionInfo": {"locations": [s.region]},
                             "reasonCode": "NotAvailableForSubscription"})  # fmt: skip
    return {
        "resourceType": "virtualMachines", "name": s.size, "tier": "Standard",
        "family": sku_family(s.size),
        "size": s.size.removeprefix("Standard_"), "locations": [s.region],
        "locationInfo": [{"location": s.region, "zones": list(s.zones), "zoneDetails": []}],
        "capabilities": [{"name": n, "value": v} for n, v in caps],
        "restrictions": restrictions,
    }


def sku_family(size: str) -> str:
    """The quota family of a size as the SKU API names it (made up but shaped like Azure's)."""
    families = {"Standard_ND96isr_H100_v5": "standardNDSH100v5Family",
                "Standard_ND96asr_v4": "standardNDASv4Family",
                "Standard_NC24ads_A100_v4": "standardNCADSA100v4Family"}  # fmt: skip
    plain = size.removeprefix("Standard_").replace("_", "")
    return families.get(size, f"standard{plain}Family")


def _handler_for(fake: FakeAzure) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

        def do_GET(self) -> None:
            self._serve("GET")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            body = self._body()
            auth = self.headers.get("Authorization", "")
            fake.record(Recorded(method, parts.path, dict(query), body, auth.split(" ")[0]))
            query["__path"] = parts.path
            if parts.path == PRICES_ROUTE:
                status, answer = fake.retail_prices(query)
                self._send(status, answer, {})
                return
            if not auth.startswith("Bearer "):
                self._send(401, _error("AuthenticationFailed"), {})
                return
            if (garbled := fake.take_garbled()) is not None:
                self._send_raw(200, garbled)
                return
            self._send(*self._arm(method, parts.path, query, body))

        def _arm(self, method: str, path: str, query: dict[str, str],
                 body: JSON | None) -> tuple[int, Any, dict[str, str]]:
            if SKU_ROUTE.match(path) and method == "GET":
                return (*fake.list_skus(query), {})
            if PERMISSIONS_ROUTE.match(path) and method == "GET":
                return (*fake.permissions(), {})
            if USAGE_ROUTE.match(path) and method == "GET":
                return (*fake.list_usages(), {})
            if (sn := SUBNET_ROUTE.match(path)) and method == "GET":
                return (*fake.subnet(path, sn["name"]), {})
            if (rt := ROUTE_TABLE_ROUTE.match(path)) and method == "GET":
                return (*fake.route_table(path, rt["name"]), {})
            if (img := IMAGE_ROUTE.match(path)) and method == "GET":
                return (*fake.image(img["loc"], img["pub"], img["offer"], img["sku"],
                                    img["version"]), {})  # fmt: skip
            if (ev := EVICT_ROUTE.match(path)) and method == "POST":
                name = ev["name"] or f"{ev['set']}_{ev['index']}"
                return (*fake.simulate_eviction(name), {})
            if (ss := SET_ROUTE.match(path)) is not None:
                return self._scale_set(method, ss, query, body)
            if (op := OP_ROUTE.match(path)) and method == "GET":
                if op["kind"].lower() == "operationresults":
                    return 204, None, {}
                return (*fake.operation(op["op"]), {})
            vm = VM_ROUTE.match(path)
            if vm is None:
                return 404, _error("NotFound", f"no route {method} {path}"), {}
            name = vm["name"]
            if name is None and method == "GET":
                return (*fake.list_vms(query), {})
            if name is not None and method == "PUT":
                return fake.put_vm(vm["rg"], name, body or {})
            if name is not None and method == "GET":
                return (*fake.get_vm(name, query), {})
            if name is not None and method == "DELETE":
                return fake.delete_vm(name)
            return 405, _error("MethodNotAllowed"), {}

        def _scale_set(self, method: str, route: re.Match[str], query: dict[str, str],
                       body: JSON | None) -> tuple[int, Any, dict[str, str]]:  # fmt: skip
            name, part = route["name"], (route["part"] or "").lower()
            calls: dict[tuple[str, str], Any] = {
                ("GET", "virtualmachines"): lambda: (*fake.list_members(name, query), {}),
                ("GET", "networkinterfaces"): lambda: (*fake.list_nics(name, query), {}),
                ("POST", "delete"): lambda: fake.delete_members(name, body or {}),
                ("PUT", ""): lambda: fake.put_set(route["rg"], name, body or {}),
                ("PATCH", ""): lambda: fake.patch_set(name, body or {}),
                ("GET", ""): lambda: (*fake.get_set(name), {}),
                ("DELETE", ""): lambda: fake.delete_set(name),
            }
            if name is None:
                if method == "GET":
                    return (*fake.list_sets(query), {})
                return 405, _error("MethodNotAllowed"), {}
            call = calls.get((method, part))
            return call() if call else (405, _error("MethodNotAllowed"), {})

        def _body(self) -> JSON | None:
            length = int(self.headers.get("Content-Length") or 0)
            if not length:
                return None
            loaded = json.loads(self.rfile.read(length))
            return loaded if isinstance(loaded, dict) else None

        def _send(self, status: int, body: Any, headers: dict[str, str]) -> None:
            self._send_raw(status, b"" if body is None else json.dumps(body).encode(), headers)

        def _send_raw(self, status: int, data: bytes, headers: dict[str, str] | None = None,
                      ) -> None:
            headers = headers or {}
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

    return Handler


def sku_names(skus: tuple[SkuFixture, ...]) -> Iterator[str]:
    """The sizes of a SKU fixture, once each."""
    yield from dict.fromkeys(s.size for s in skus)
