"""Run the real boto3 clients offline: moto for EC2, botocore hooks for what moto lacks.

moto 5.2.5 serves instances, type offerings and instance types. It answers
spot price history with one useless fixed price, raises NotImplementedError
for spot placement scores and does not serve the Price List API. Those three
are answered here from canned data by ``before-call`` hooks on the session the
adapter's clients are made from, so request building, paging and the client's
parameter handling stay boto3's own. Service quotas are answered the same way
(moto has none for EC2). moto stores Fault Injection Service templates and
experiments but runs none: an ``after-call`` hook on ``StartExperiment`` does what
its spot interruption action does to its target instances (:meth:`FakeAws.interrupt`).

moto 5.2.5 has no placement groups at all (NotImplementedError) and ignores
``Placement.GroupName``; it also folds the ``NetworkInterfaces`` of a launch
into at most two plain interfaces. :func:`moto_placement_groups` teaches
moto's EC2 responses the three placement group calls (with DryRun, tags,
``Duplicate``, ``Unknown`` and ``InUse`` as EC2 answers them) and records,
per instance, the group and the interfaces it was launched with. It patches
moto's response class, so :class:`MotoLoopback` serves it too, to a child process.

:class:`MotoLoopback` serves the in-process mock over HTTP on 127.0.0.1, for a
child process (moto's own ``ThreadedMotoServer`` needs ``moto[server]``, that
is Flask, which this environment does not have): each request is handed to
the same ``BotocoreStubber`` the in-process mock uses, so both see one state.

EVERY PRICE AND SCORE IN THIS MODULE IS MADE UP for tests; none is AWS's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
import botocore.loaders
import botocore.session
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from moto.core import DEFAULT_ACCOUNT_ID
from moto.core.models import botocore_stubber
from moto.core.responses import ActionResult, EmptyResult
from moto.ec2.exceptions import EC2ClientError
from moto.ec2.models import ec2_backends
from moto.ec2.models.instances import StateReason
from moto.ec2.responses import EC2Response
from moto.ec2.responses.instances import InstanceResponse

FAKE_ACCESS_KEY = "AKIAFAKEFAKEFAKE0042"
FAKE_SECRET_KEY = "fake/secret/never/real/0042xxxxxxxxxxxxxxx"


@contextmanager
def aws_env(tmp_path: Path, **extra: str) -> Iterator[None]:
    """Only fake credentials and no config files: nothing can pick up a real profile."""
    values = {
        "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        **extra,
    }
    with mock.patch.dict(os.environ):
        for key in [k for k in os.environ if k.startswith("AWS_")]:
            del os.environ[key]
        os.environ.update(values)
        yield


def canned(parsed: dict[str, Any], status: int = 200) -> tuple[AWSResponse, dict[str, Any]]:
    """What a ``before-call`` hook returns to answer a call in place of the service."""
    parsed.setdefault("ResponseMetadata", {"HTTPStatusCode": status, "RequestId": "fake"})
    return AWSResponse("https://fake.invalid/", status, {}, None), parsed


def error_response(code: str, status: int, message: str = "") -> tuple[AWSResponse, dict[str, Any]]:
    """An AWS error answer as botocore's parser would have produced it."""
    return canned({"Error": {"Code": code, "Message": message or f"injected {code}"}}, status)


def price_list_item(
    region: str,
    instance_type: str,
    usd: float,
    *,
    operating_system: str = "Linux",
    tenancy: str = "Shared",
    capacity_status: str = "Used",
    pre_installed_sw: str = "NA",
) -> str:
    """One Price List API entry as the real API sends it: a JSON string, ON-DEMAND term
    plus a (cheaper, made-up) reserved term that must not be taken for on-demand."""
    sku = hashlib.sha256(
        f"{region}{instance_type}{operating_system}{tenancy}{capacity_status}".encode()
    ).hexdigest()[:16].upper()
    od, ri = f"{sku}.JRTCKXETXF", f"{sku}.4NA7Y494T4"
    return json.dumps({
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "instanceType": instance_type, "instanceFamily": "GPU instance",
                "regionCode": region, "location": f"Fake location of {region}",
                "locationType": "AWS Region", "servicecode": "AmazonEC2",
                "usagetype": f"BoxUsage:{instance_type}", "operation": "RunInstances",
                "operatingSystem": operating_system, "tenancy": tenancy,
                "preInstalledSw": pre_installed_sw, "capacitystatus": capacity_status,
                "licenseModel": "No License required", "marketoption": "OnDemand",
            },
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {od: {
                "offerTermCode": "JRTCKXETXF", "sku": sku, "termAttributes": {},
                "effectiveDate": "2026-11-01T00:00:00Z",
                "priceDimensions": {f"{od}.6YS6EN2CT7": {
                    "unit": "Hrs", "beginRange": "0", "endRange": "Inf", "appliesTo": [],
                    "rateCode": f"{od}.6YS6EN2CT7", "pricePerUnit": {"USD": f"{usd:.10f}"},
                    "description": f"${usd} per On Demand {operating_system} "
                                   f"{instance_type} Instance Hour",
                }},
            }},
            "Reserved": {ri: {
                "offerTermCode": "4NA7Y494T4", "sku": sku,
                "effectiveDate": "2026-11-01T00:00:00Z",
                "termAttributes": {"LeaseContractLength": "1yr", "OfferingClass": "standard",
                                   "PurchaseOption": "No Upfront"},
                "priceDimensions": {f"{ri}.6YS6EN2CT7": {
                    "unit": "Hrs", "beginRange": "0", "endRange": "Inf", "appliesTo": [],
                    "rateCode": f"{ri}.6YS6EN2CT7",
                    "pricePerUnit": {"USD": f"{usd * 0.6:.10f}"},
                    "description": "Reserved Linux instance hour",
                }},
            }},
        },
        "version": "20261120000000",
        "publicationDate": "2026-11-20T00:00:00Z",
    })  # fmt: skip


@dataclass
class FakeAws:
    """Canned answers and levers for one test; install it on the session first.

    ``spot_rows``: spot price history rows (dicts as boto3 returns them).
    ``scores``: (zone name, type) -> placement score 1-10.
    ``on_demand``: (region, type) -> USD per hour.
    ``quotas``: (region, quota code) -> value (vCPUs); others: NoSuchResourceException.
    ``calls``: every operation's parameters as the adapter passed them.
    """

    spot_rows: list[dict[str, Any]] = field(default_factory=list)
    spot_page_size: int = 100
    scores: dict[tuple[str, str], int] = field(default_factory=dict)
    on_demand: dict[tuple[str, str], float] = field(default_factory=dict)
    quotas: dict[tuple[str, str], float] = field(default_factory=dict)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _failures: dict[str, list[tuple[str, int]]] = field(default_factory=dict)

    def install(self, session: Any) -> None:
        """Hook every client later made from ``session`` (a ``boto3.Session``)."""
        session.events.register("before-parameter-build", self._record)
        session.events.register("before-call", self._before_call)
        session.events.register("after-call.fis.StartExperiment", self._run_experiment)

    # -- levers ------------------------------------------------------------------

    def fail_next(self, operation: str, code: str, status: int) -> None:
        """The next call of ``operation`` (e.g. ``RunInstances``) gets this error, once."""
        self._failures.setdefault(operation, []).append((code, status))

    def add_spot_price(
        self, zone: str, instance_type: str, usd: float, age: timedelta = timedelta(0)
    ) -> None:
        """One (made-up) history row, ``age`` before now."""
        self.spot_rows.append({
            "AvailabilityZone": zone, "InstanceType": instance_type,
            "ProductDescription": "Linux/UNIX", "SpotPrice": f"{usd:.6f}",
            "Timestamp": datetime.now(UTC) - age,
        })  # fmt: skip

    def params(self, operation: str) -> list[dict[str, Any]]:
        """Parameters of every call of ``operation`` so far."""
        return [p for op, p in self.calls if op == operation]

    def interrupt(self, instance_id: str, region: str = "us-east-1") -> None:
        """EC2's side of a spot interruption: terminated, with its state reason."""
        instance = ec2_backends[DEFAULT_ACCOUNT_ID][region].get_instance(instance_id)
        instance.terminate()
        instance.state_reason = StateReason(
            "Server.SpotInstanceTermination: Spot instance termination",
            "Server.SpotInstanceTermination",
        )
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
        instance._reason = f"Service initiated ({stamp} GMT)"  # moto's StateTransitionReason

    @staticmethod
    def ami(region: str) -> str:
        """An image moto knows in ``region``."""
        images = ec2_backends[DEFAULT_ACCOUNT_ID][region].describe_images(owners=["amazon"])
        return str(images[0].id)

    # -- hooks -------------------------------------------------------------------

    def _run_experiment(self, parsed: dict[str, Any], **_: Any) -> None:
        """What FIS does with a started experiment (moto only stores it): each spot
        interruption action interrupts its targets' instances, here at once."""
        experiment = parsed.get("experiment") or {}
        targets = experiment.get("targets") or {}
        for action in (experiment.get("actions") or {}).values():
            if action.get("actionId") != "aws:ec2:send-spot-instance-interruptions":
                continue
            for name in (action.get("targets") or {}).values():
                for arn in targets.get(name, {}).get("resourceArns") or []:
                    _, _, _, region, _, resource = arn.split(":", 5)
                    self.interrupt(resource.removeprefix("instance/"), region)

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls.append((str(model.name), copy.deepcopy(params)))

    def _before_call(
        self, model: Any, params: dict[str, Any], request_signer: Any, **_: Any
    ) -> tuple[AWSResponse, dict[str, Any]] | None:
        operation = str(model.name)
        queued = self._failures.get(operation)
        if queued:
            return error_response(*queued.pop(0))
        region = str(request_signer.region_name)
        body: Any = params.get("body")
        if operation == "DescribeSpotPriceHistory":
            return canned(self._spot_history(region, body))
        if operation == "GetSpotPlacementScores":
            return canned(self._placement_scores(body))
        if operation == "GetProducts":
            return canned(self._products(json.loads(body or b"{}")))
        if operation == "GetServiceQuota":
            return self._quota(region, json.loads(body or b"{}"))
        return None  # moto answers

    def _quota(self, region: str, body: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        code = str(body.get("QuotaCode"))
        value = self.quotas.get((region, code))
        if value is None:
            return error_response("NoSuchResourceException", 400, f"no quota {code}")
        return canned({"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": value,
                                 "QuotaName": f"fake quota {code}", "Unit": "None"}})  # fmt: skip

    def _spot_history(self, region: str, body: dict[str, str]) -> dict[str, Any]:
        types = _members(body, "InstanceType")
        rows = [r for r in self.spot_rows
                if r["AvailabilityZone"].startswith(region)
                and (not types or r["InstanceType"] in types)]  # fmt: skip
        start = int(body.get("NextToken") or 0)
        page = rows[start : start + self.spot_page_size]
        parsed: dict[str, Any] = {"SpotPriceHistory": copy.deepcopy(page)}
        if start + self.spot_page_size < len(rows):
            parsed["NextToken"] = str(start + self.spot_page_size)
        return parsed

    def _placement_scores(self, body: dict[str, str]) -> dict[str, Any]:
        types = set(_members(body, "InstanceType"))
        out = []
        for region in _members(body, "RegionName"):
            zones = ec2_backends[DEFAULT_ACCOUNT_ID][region].describe_availability_zones()
            for zone in zones:
                # Like AWS: one score for the set of types asked about; here the best.
                found = [s for (z, t), s in self.scores.items() if z == zone.name and t in types]
                if found:
                    out.append({"Region": region, "AvailabilityZoneId": zone.zone_id,
                                "Score": max(found)})  # fmt: skip
        return {"SpotPlacementScores": out}

    def _products(self, body: dict[str, Any]) -> dict[str, Any]:
        wanted = {f["Field"]: f["Value"] for f in body.get("Filters", [])}
        items = []
        for (region, itype), usd in sorted(self.on_demand.items()):
            variants = [
                price_list_item(region, itype, usd),
                price_list_item(region, itype, usd * 1.5, operating_system="Windows"),
                price_list_item(region, itype, usd, capacity_status="UnusedCapacityReservation"),
                price_list_item(region, itype, usd * 1.1, tenancy="Dedicated"),
            ]
            for item in variants:
                attributes = json.loads(item)["product"]["attributes"]
                if all(attributes.get(k) == v for k, v in wanted.items()):
                    items.append(item)
        return {"FormatVersion": "aws_v1", "PriceList": items}


def nat_for_default_vpc(region: str) -> str:
    """Give the default VPC's main route table a 0.0.0.0/0 route to a NAT gateway, so its
    subnets' nodes without a public address get out (EFA gang nodes have none); the NAT
    gateway's id. moto's default VPC has no route out at all."""
    ec2 = boto3.client("ec2", region_name=region)  # unhooked
    vpc = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"][0]
    subnet = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc["VpcId"]]}])
    eip = ec2.allocate_address(Domain="vpc")["AllocationId"]
    nat = ec2.create_nat_gateway(SubnetId=subnet["Subnets"][0]["SubnetId"],
                                 AllocationId=eip)["NatGateway"]["NatGatewayId"]  # fmt: skip
    (table,) = ec2.describe_route_tables(Filters=[
        {"Name": "vpc-id", "Values": [vpc["VpcId"]]},
        {"Name": "association.main", "Values": ["true"]}])["RouteTables"]  # fmt: skip
    ec2.create_route(RouteTableId=table["RouteTableId"], DestinationCidrBlock="0.0.0.0/0",
                     NatGatewayId=nat)  # fmt: skip
    return str(nat)


# -- placement groups and launch fabric, taught to moto ---------------------------


@dataclass(frozen=True)
class LaunchedFabric:
    """What one instance's ``run_instances`` asked for: its group and its interfaces."""

    region: str
    placement_group: str
    interfaces: tuple[dict[str, Any], ...]

    @property
    def efa_interfaces(self) -> int:
        return sum(1 for i in self.interfaces if i.get("InterfaceType") in ("efa", "efa-only"))


GROUPS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
"""(account, region) -> placement group name -> the group as EC2 describes it."""
FABRIC: dict[str, LaunchedFabric] = {}
"""Instance id -> what it was launched with."""


def _pg_error(code: str, name: str, what: str) -> EC2ClientError:
    return EC2ClientError(code, f"The Placement Group '{name}' {what}.")


def _groups_of(response: Any) -> dict[str, dict[str, Any]]:
    return GROUPS.setdefault((response.current_account, response.region), {})


def _create_placement_group(self: Any) -> ActionResult:
    name = str(self._get_param("GroupName"))
    tags = self._parse_tag_specification().get("placement-group", {})
    self.error_on_dryrun()
    groups = _groups_of(self)
    if name in groups:
        raise _pg_error("InvalidPlacementGroup.Duplicate", name, "already exists")
    gid = "pg-" + hashlib.sha256(f"{self.region}/{name}".encode()).hexdigest()[:17]
    groups[name] = {
        "GroupName": name, "GroupId": gid, "State": "available",
        "Strategy": self._get_param("Strategy") or "cluster",
        "GroupArn": f"arn:aws:ec2:{self.region}:{self.current_account}:placement-group/{name}",
        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
    }  # fmt: skip
    return ActionResult({"PlacementGroup": copy.deepcopy(groups[name])})


def _describe_placement_groups(self: Any) -> ActionResult:
    names = self._get_param("GroupNames", [])
    filters = self._filters_from_querystring()
    self.error_on_dryrun()
    groups = _groups_of(self)
    for name in names:
        if name not in groups:
            raise _pg_error("InvalidPlacementGroup.Unknown", name, "is unknown")
    found = [g for n, g in sorted(groups.items()) if (not names or n in names)
             and all(_matches(g, k, v) for k, v in filters.items())]  # fmt: skip
    return ActionResult({"PlacementGroups": copy.deepcopy(found)})


def _matches(group: dict[str, Any], name: str, values: list[str]) -> bool:
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    if name.startswith("tag:"):
        return tags.get(name[4:]) in values
    if name == "tag-key":
        return any(v in tags for v in values)
    field_of = {"group-name": "GroupName", "strategy": "Strategy", "state": "State"}
    if name in field_of:
        return str(group[field_of[name]]) in values
    raise EC2ClientError("InvalidParameterValue", f"The filter '{name}' is invalid")


def _delete_placement_group(self: Any) -> ActionResult:
    name = str(self._get_param("GroupName"))
    self.error_on_dryrun()
    groups = _groups_of(self)
    if name not in groups:
        raise _pg_error("InvalidPlacementGroup.Unknown", name, "is unknown")
    backend = ec2_backends[self.current_account][self.region]
    if any(i.placement.group_name == name and i.state != "terminated"
           for i in backend.all_instances()):  # fmt: skip
        raise _pg_error("InvalidPlacementGroup.InUse", name, "is in use")
    del groups[name]
    return EmptyResult()


def _run_instances(self: Any) -> ActionResult:
    group = str(self._get_param("Placement.GroupName") or "")
    dry = bool(self._get_param("DryRun", False))
    if group and not dry and group not in _groups_of(self):
        raise _pg_error("InvalidPlacementGroup.Unknown", group, "is unknown")
    interfaces = tuple(self._get_param("NetworkInterfaces", []))
    result = _MOTO_RUN_INSTANCES(self)
    reservation: Any = result.result
    for instance in reservation.instances:
        instance.placement.group_name = group
        FABRIC[instance.id] = LaunchedFabric(self.region, group, interfaces)
    return result


_MOTO_RUN_INSTANCES = InstanceResponse.run_instances


@contextmanager
def moto_placement_groups() -> Iterator[None]:
    """moto's EC2, in-process and served, with placement groups; state fresh each time."""
    GROUPS.clear()
    FABRIC.clear()
    with (
        mock.patch.object(EC2Response, "create_placement_group", _create_placement_group,
                          create=True),
        mock.patch.object(EC2Response, "describe_placement_groups", _describe_placement_groups,
                          create=True),
        mock.patch.object(EC2Response, "delete_placement_group", _delete_placement_group,
                          create=True),
        mock.patch.object(EC2Response, "run_instances", _run_instances),
    ):  # fmt: skip
        yield
    GROUPS.clear()
    FABRIC.clear()


# -- the in-process mock over HTTP, for a child process ---------------------------

_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([^/]+)/([^/]+)/aws4_request")


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self._answer()

    def do_GET(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        scope = _SCOPE.search(self.headers.get("Authorization", ""))
        region, service = scope.groups() if scope else ("us-east-1", "ec2")
        # moto routes by AWS host name: give the request the one the signature names.
        url = f"https://{service}.{region}.amazonaws.com{self.path}"
        request = AWSPreparedRequest(self.command, url, dict(self.headers.items()), body, False)
        answer = botocore_stubber.process_request(request)
        status, headers, payload = answer if answer is not None else (404, {}, b"")
        data = payload.encode() if isinstance(payload, str) else bytes(payload or b"")
        self.send_response(int(status))
        for key, value in (headers or {}).items():
            if key.lower() not in ("content-length", "status", "transfer-encoding"):
                self.send_header(key, str(value))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class MotoLoopback:
    """The active ``mock_aws`` served on ``url`` (127.0.0.1, a free port) until ``stop``."""

    def __init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host!s}:{port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _members(body: dict[str, str], name: str) -> list[str]:
    """Values of an EC2 query-protocol list parameter (``Name.1``, ``Name.2``, ...)."""
    found = [k for k in body if k.startswith(f"{name}.")]
    found.sort(key=lambda k: int(k.split(".")[1]))
    return [body[k] for k in found]


_LOADER = botocore.loaders.create_loader()


def new_session() -> Any:
    """A boto3 session on the (fake) environment credentials.

    Sessions share one model loader: parsing EC2's API model takes about a
    second, and a fresh session would do it again for every test.
    """
    core = botocore.session.get_session()
    core.register_component("data_loader", _LOADER)
    return boto3.Session(botocore_session=core, region_name="us-east-1")
