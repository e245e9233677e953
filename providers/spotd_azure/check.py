"""``check-cloud`` for Azure: every check by a read-only call, nothing created.

- credentials: a token for ARM's scope can be got;
- permissions: ``Microsoft.Authorization/permissions`` (the caller's own
  actions at the resource group and at each subnet) against
  :mod:`.permissions`; the subscription-scope reads are proved by the calls below;
- the SKU: offered in the zone and not restricted (``resource_skus``), spot capable for spot;
- quota: ``usage.list(region)``, the size's family cores and, for spot,
  ``lowPriorityCores`` against vCPUs x nodes;
- the image: ``virtual_machine_images`` get (``latest``: list the newest);
- the request: the full scale set or VM body built with the SDK's models, the
  custom data rendered and size-checked. ARM offers no validate-only PUT for
  compute, so what only the create would find (capacity) is not checked.

Each failure is one outcome naming the permission, quota or value; nothing raises.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from azure.core.credentials import TokenCredential
from azure.core.rest import HttpRequest
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.compute.models import ResourceSku

from spotd.core.errors import ProviderError
from spotd.core.values import CheckOutcome, CloudCheck, LaunchRequest, Market

from .egress import subnet_egress
from .errors import map_azure_errors
from .permissions import GROUP_ACTIONS, SUBNET_ACTIONS, Permission, missing
from .scaleset import set_body, set_name, uses_scale_set
from .settings import AzureSettings
from .vms import PROVIDER, azure_zone, encode_custom_data, vm_body, vm_name

PERMISSIONS_API = "2022-04-01"
ARM_SCOPE = "https://management.azure.com/.default"
MAX_PAGES = 20
MAX_SET_NODES = 100
"""A scale set with one placement group holds at most 100 VMs."""

Render = Callable[[LaunchRequest], str]


def _ok(name: str, detail: str) -> CheckOutcome:
    return CheckOutcome(name=name, ok=True, detail=detail)


def _fail(name: str, detail: str) -> CheckOutcome:
    return CheckOutcome(name=name, ok=False, detail=detail)


def _caps(sku: ResourceSku) -> dict[str, str]:
    return {c.name: c.value for c in sku.capabilities or [] if c.name and c.value is not None}


class CloudCheckRun:
    """One run of the checks for one provider's settings (see the module's docstring)."""

    def __init__(self, settings: AzureSettings, compute: ComputeManagementClient,
                 render: Render) -> None:  # fmt: skip
        self._s = settings
        self._compute = compute
        self._render = render
        self._outcomes: list[CheckOutcome] = []

    def run(self, request: LaunchRequest | None) -> CloudCheck:
        """All checks; ``request`` adds those of one launch and what it would create."""
        if not self._credentials():
            return CloudCheck(PROVIDER, tuple(self._outcomes))
        self._permissions()
        would: tuple[str, ...] = ()
        if request is None:
            for region in self._s.regions:
                self._image(region)
            for region in self._s.regions:
                self._egress(region, {})
        else:
            region = request.offering.pool.region
            sku = self._sku(request)
            if sku is not None:
                self._quota(request, sku)
            self._image(region)
            would = self._request(request)
            self._egress(region, request.env)
        return CloudCheck(PROVIDER, tuple(self._outcomes), would)

    def _add(self, outcome: CheckOutcome) -> None:
        self._outcomes.append(outcome)

    def _call(self, name: str, what: str, action: str, call: Callable[[], Any]) -> Any:
        """Run a read; on failure add one outcome naming the action it needs, return None."""
        try:
            with map_azure_errors(what):
                return call()
        except ProviderError as exc:
            needs = f" (needs {action})" if exc.code in ("AuthorizationFailed", "HTTP403") else ""
            self._add(_fail(name, f"{exc}{needs}"))
            return None

    # -- credentials and permissions -------------------------------------------

    def _credentials(self) -> bool:
        # The client keeps the credential and scope it was built with.
        config = self._compute._config
        credential: TokenCredential | None = getattr(config, "credential", None)
        scopes = list(getattr(config, "credential_scopes", None) or [ARM_SCOPE])
        if credential is None:
            self._add(_fail("credentials", "the compute client has no credential"))
            return False
        try:
            with map_azure_errors("get a token"):
                credential.get_token(*scopes)
        except ProviderError as exc:
            self._add(_fail("credentials", f"no token for {scopes[0]}: {exc}"))
            return False
        self._add(_ok("credentials", f"a token for {scopes[0]}"))
        return True

    def _permissions(self) -> None:
        group = f"/subscriptions/{self._s.subscription_id}/resourceGroups/{self._s.resource_group}"
        self._check_scope(f"resource group {self._s.resource_group}", group, GROUP_ACTIONS)
        for region in self._s.regions:
            subnet = self._s.subnet_id.get(region)
            if subnet:
                self._check_scope(f"subnet of {region}", subnet, SUBNET_ACTIONS)

    def _check_scope(self, where: str, scope: str, actions: tuple[str, ...]) -> None:
        name = f"permissions on {where}"
        entries = self._call(name, f"list permissions on {where}",
                             "Microsoft.Authorization/permissions/read",
                             lambda: list(self._permission_pages(scope)))  # fmt: skip
        if entries is None:
            return
        lacking = missing(entries, actions)
        for action in lacking:
            self._add(_fail(f"permission {action}", f"not granted on {where}"))
        if not lacking:
            self._add(_ok(name, f"all {len(actions)} actions granted"))

    def _permission_pages(self, scope: str) -> Iterator[Permission]:
        url: str | None = (f"{scope.rstrip('/')}/providers/Microsoft.Authorization/permissions"
                           f"?api-version={PERMISSIONS_API}")  # fmt: skip
        first_host = None
        for _ in range(MAX_PAGES):
            if not url:
                return
            response = self._compute.send_request(HttpRequest("GET", url))
            response.raise_for_status()
            first_host = first_host or urlsplit(response.request.url).netloc
            body = response.json()
            for entry in body.get("value") or []:
                if isinstance(entry, dict):
                    yield entry
            url = body.get("nextLink")
            if url and urlsplit(url).netloc != first_host:
                return  # never send the token where a reply points off ARM's host

    # -- the launch's facts ----------------------------------------------------

    def _sku(self, request: LaunchRequest) -> ResourceSku | None:
        pool = request.offering.pool
        size, region, zone = pool.instance_type, pool.region, azure_zone(pool)
        name = f"sku {size} in {pool.zone}"
        skus = self._call(name, f"list SKUs in {region}", "Microsoft.Compute/skus/read",
                          lambda: list(self._compute.resource_skus.list(
                              filter=f"location eq '{region}'")))  # fmt: skip
        if skus is None:
            return None
        wanted = [s for s in skus if (s.resource_type or "").lower() == "virtualmachines"
                  and (s.name or "").lower() == size.lower()]  # fmt: skip
        sku: ResourceSku | None = wanted[0] if wanted else None
        if sku is None:
            self._add(_fail(name, f"{size} is not offered in {region}"))
            return None
        problem = self._restriction(sku, region, zone)
        if problem is None and request.market is Market.SPOT and \
                _caps(sku).get("LowPriorityCapable", "").lower() != "true":  # fmt: skip
            problem = f"{size} cannot run as Spot (LowPriorityCapable is not True)"
        self._add(_fail(name, problem) if problem else _ok(name, "offered, not restricted"))
        return sku

    @staticmethod
    def _restriction(sku: ResourceSku, region: str, zone: str | None) -> str | None:
        infos = [i for i in sku.location_info or [] if (i.location or "").lower() == region]
        zones = {z for i in infos for z in i.zones or []}
        if zone and zone not in zones:
            return f"not offered in zone {zone} (zones: {', '.join(sorted(zones)) or 'none'})"
        for r in sku.restrictions or []:
            kind = (r.type or "").lower()
            hit = kind == "location" or (kind == "zone" and zone in
                                         ((r.restriction_info.zones if r.restriction_info
                                           else None) or []))  # fmt: skip
            if hit:
                where = f"zone {zone}" if kind == "zone" else f"region {region}"
                # The SDK's enum: its value is ARM's code (NotAvailableForSubscription).
                reason = getattr(r.reason_code, "value", r.reason_code) or "no reason given"
                return f"restricted in {where}: {reason}"
        return None

    def _quota(self, request: LaunchRequest, sku: ResourceSku) -> None:
        region = request.offering.pool.region
        vcpus = int(float(_caps(sku).get("vCPUs", "0") or 0))
        need = vcpus * request.nodes
        usages = self._call(f"quota in {region}", f"list usages in {region}",
                            "Microsoft.Compute/locations/usages/read",
                            lambda: list(self._compute.usage.list(region)))  # fmt: skip
        if usages is None:
            return
        by_name = {(u.name.value or "").lower(): u for u in usages if u.name}
        names = ["lowPriorityCores"] if request.market is Market.SPOT \
            else [sku.family or "", "cores"]  # fmt: skip
        for quota in names:
            label = f"quota {quota} in {region}"
            usage = by_name.get(quota.lower())
            if usage is None:
                self._add(_fail(label, "not listed by usage.list"))
                continue
            free = int(usage.limit or 0) - int(usage.current_value or 0)
            detail = (
                f"{need} vCPUs needed ({request.nodes} x {vcpus}), {free} of {usage.limit} free"
            )
            self._add(_ok(label, detail) if free >= need else _fail(label, detail))

    def _image(self, region: str) -> None:
        image = self._s.image
        ref = "/".join(image.get(k, "") for k in ("publisher", "offer", "sku", "version"))
        name = f"image {ref} in {region}"
        images = self._compute.virtual_machine_images
        args = (region, image["publisher"], image["offer"], image["sku"])
        action = "Microsoft.Compute/locations/publishers/artifacttypes/offers/skus/versions/read"
        if image["version"].lower() == "latest":
            found = self._call(name, f"list {ref}", action, lambda: images.list(*args, top=1))
            if found is not None and not found:
                self._add(_fail(name, "no version of the image is published there"))
                return
        else:
            found = self._call(name, f"get {ref}", action,
                               lambda: images.get(*args, image["version"]))  # fmt: skip
        if found:
            self._add(_ok(name, "exists"))

    def _egress(self, region: str, env: Mapping[str, str]) -> None:
        """Can the VMs (never given a public address) reach daemon, index and store?"""
        subnet = self._s.subnet_id.get(region)
        if not subnet:
            return  # said by the request check, or the settings check at start-up
        try:
            self._add(subnet_egress(self._compute, subnet, env))
        except ProviderError as exc:
            self._add(_fail(f"egress subnet of {region}",
                            f"{exc} (needs Microsoft.Network/virtualNetworks/subnets/read)"))

    # -- the request -------------------------------------------------------------

    def _request(self, request: LaunchRequest) -> tuple[str, ...]:
        pool = request.offering.pool
        name = "request"
        if pool.region not in self._s.subnet_id:
            self._add(_fail(name, f"providers.azure.subnet_id has no subnet for {pool.region}"))
            return ()
        try:
            data = encode_custom_data(self._render(request))
        except ValueError as exc:
            self._add(_fail(name, f"custom data: {exc}"))
            return ()
        market = "spot, eviction Delete, max price -1" if request.market is Market.SPOT \
            else "on-demand"  # fmt: skip
        if uses_scale_set(request):
            if request.nodes > MAX_SET_NODES:
                self._add(_fail(name, f"{request.nodes} nodes: one placement group holds "
                                      f"at most {MAX_SET_NODES}"))  # fmt: skip
                return ()
            title = set_name(request.client_token)
            body: Any = set_body(self._s, pool, market=request.market, name=title,
                                 nodes=request.nodes, tags=request.tags,
                                 custom_data=data)  # fmt: skip
            would: tuple[str, ...] = (
                     f"scale set {title} ({request.nodes} x {pool.instance_type} in {pool.zone}, "
                     f"{market}, one placement group, accelerated networking); its VMs, "
                     "NICs and OS disks go with it",)  # fmt: skip
        else:
            names = [vm_name(request.client_token, r) for r in range(request.nodes)]
            body = vm_body(self._s, pool, market=request.market, name=names[0], tags=request.tags,
                           custom_data=data)  # fmt: skip
            would = tuple(f"VM {n} ({pool.instance_type} in {pool.zone}, {market}) with "
                          "its NIC and OS disk" for n in names)  # fmt: skip
        size = len(json.dumps(body.as_dict()))
        self._add(_ok(name, f"{type(body).__name__} built with the SDK's models ({size} bytes); "
                            "capacity is only known when it is created"))  # fmt: skip
        return would
