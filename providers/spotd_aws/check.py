"""``spotd check-cloud`` for AWS: every check a launch depends on, spending nothing.

Only read calls and EC2 ``DryRun=True`` calls are made. A dry run answers
``DryRunOperation`` when the caller may do it and the request is valid,
``UnauthorizedOperation`` when a permission is missing; EC2 fakes may ignore
``DryRun`` on reads and just answer, which counts as allowed. Every failing
check becomes one :class:`CheckOutcome` naming the permission, quota or
setting to fix; nothing here raises for a failing check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from spotd.core.errors import AuthError, CapacityError, ProviderError, QuotaError
from spotd.core.values import CheckOutcome, CloudCheck, LaunchRequest, Market

from .capacity import placement_scores
from .catalog import zone_ids
from .clients import AwsClients, Client
from .drill import drill_check
from .egress import public_reason, subnet_egress
from .errors import PROVIDER, map_aws_errors
from .fabric import EFA_LAYOUTS, table_drift
from .gang import GangNetwork, GangPlanner
from .instances import aws_client_token, launch_params
from .network import GANG_GROUP, zone_network
from .prices import on_demand_filters
from .settings import AwsSettings

DENIED = frozenset({"UnauthorizedOperation", "AccessDenied", "AccessDeniedException"})
"""Codes of a refused permission."""
INCONCLUSIVE = frozenset({
    "InvalidPlacementGroup.Unknown", "InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed",
})  # fmt: skip
"""Codes EC2 may answer a dry run on a made-up name before it checks the permission."""
CHECK_NAME = "spotd-check-cloud"
"""Name of the placement group the create/delete dry runs ask about (never created)."""
NO_INSTANCE = "i-00000000000000000"

QUOTAS: dict[tuple[str, Market], tuple[str, str]] = {
    ("p5", Market.SPOT): ("L-C4BD4855", "All P5 Spot Instance Requests"),
    ("p", Market.SPOT): ("L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests"),
    ("p", Market.ON_DEMAND): ("L-417A185B", "Running On-Demand P instances"),
    ("g", Market.SPOT): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("g", Market.ON_DEMAND): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
}
"""(family prefix, market) -> Service Quotas code and name of the vCPU quota (EC2 quotas)."""


@dataclass(frozen=True)
class CheckTarget:
    """What the checks need of the adapter."""

    settings: AwsSettings
    clients: AwsClients
    planner: GangPlanner
    user_data: Callable[[LaunchRequest], str]
    instance_types: Sequence[str]


def quota_for(instance_type: str, market: Market) -> tuple[str, str] | None:
    """(quota code, quota name) limiting the vCPUs of ``instance_type`` in ``market``."""
    family = instance_type.split(".", 1)[0]
    for prefix in (family[:2], family[:1]):
        found = QUOTAS.get((prefix, market))
        if found is not None:
            return found
    return None


def run_checks(target: CheckTarget, request: LaunchRequest | None) -> CloudCheck:
    """All checks, for ``request`` if given, else for the configured regions."""
    regions = [request.offering.pool.region] if request else list(target.settings.regions)
    first = regions[0] if regions else "us-east-1"
    identity = _credentials(target.clients, first)
    if not identity.ok:
        # Every further call would fail the same way: one clear line is better.
        return CloudCheck(PROVIDER, (identity,))
    outcomes = [identity, *(_image(target, r) for r in regions)]
    ec2 = target.clients.ec2(first)
    outcomes += _read_permissions(ec2, target.clients, first, target.instance_types)
    outcomes += _write_permissions(ec2)
    if request is None:
        outcomes.append(_bare_launch(ec2, target, first))
        outcomes.append(drill_check(target.settings))
        outcomes += _configured_egress(target)
        return CloudCheck(PROVIDER, tuple(outcomes))
    would: list[str] = []
    outcomes += _launch(target, request, would)
    outcomes += _efa_table(target, request)
    outcomes += _capacity(target, request)
    outcomes += _quota(target, request)
    return CloudCheck(PROVIDER, tuple(outcomes), tuple(would))


# -- the checks --------------------------------------------------------------


def _credentials(clients: AwsClients, region: str) -> CheckOutcome:
    with _failing_as("credentials") as failed:
        with map_aws_errors("GetCallerIdentity"):
            who = clients.sts(region).get_caller_identity()
        return CheckOutcome("credentials", True, f"account {who.get('Account')} as "
                            f"{who.get('Arn')}")  # fmt: skip
    return failed[0]


def _image(target: CheckTarget, region: str) -> CheckOutcome:
    name = f"image {region}"
    image_id = target.settings.image_id.get(region)
    if not image_id:
        return CheckOutcome(name, False, f"no AMI configured: set providers.aws.image_id "
                            f"for {region}")  # fmt: skip
    with _failing_as(name) as failed:
        try:
            with map_aws_errors("DescribeImages"):
                images = target.clients.ec2(region).describe_images(ImageIds=[image_id])
        except ProviderError as exc:
            if exc.code.startswith("InvalidAMIID"):
                return CheckOutcome(name, False, f"{image_id} does not exist in {region} "
                                    f"({exc.code}): fix providers.aws.image_id")  # fmt: skip
            raise
        found = images.get("Images", [])
        if not found:
            return CheckOutcome(name, False, f"{image_id} is not visible in {region}: "
                                "fix providers.aws.image_id")  # fmt: skip
        state = found[0].get("State", "available")
        ok = state == "available"
        return CheckOutcome(name, ok, f"{image_id} ({found[0].get('Name', '?')}) is {state}")
    return failed[0]


def _read_permissions(
    ec2: Client, clients: AwsClients, region: str, instance_types: Sequence[str]
) -> list[CheckOutcome]:
    itype = instance_types[0] if instance_types else "g5.xlarge"
    reads: list[tuple[str, Callable[..., Any], dict[str, Any]]] = [
        ("DescribeInstances", ec2.describe_instances, {}),
        ("DescribeInstanceTypes", ec2.describe_instance_types, {"InstanceTypes": [itype]}),
        ("DescribeInstanceTypeOfferings", ec2.describe_instance_type_offerings, {}),
        ("DescribeAvailabilityZones", ec2.describe_availability_zones, {}),
        ("DescribeSpotPriceHistory", ec2.describe_spot_price_history,
         {"InstanceTypes": [itype], "MaxResults": 1}),
        ("DescribeImages", ec2.describe_images, {"Owners": ["self"]}),
        ("DescribeSubnets", ec2.describe_subnets, {}),
        ("DescribeSecurityGroups", ec2.describe_security_groups, {}),
        ("DescribeRouteTables", ec2.describe_route_tables, {}),
        ("DescribeVpcEndpoints", ec2.describe_vpc_endpoints, {}),
        ("DescribePlacementGroups", ec2.describe_placement_groups, {}),
        ("GetSpotPlacementScores", ec2.get_spot_placement_scores,
         {"InstanceTypes": [itype], "TargetCapacity": 1, "SingleAvailabilityZone": True,
          "RegionNames": [region]}),
    ]  # fmt: skip
    outcomes = [_dry_run(action, call, params) for action, call, params in reads]
    outcomes.append(_pricing(clients, region, itype))
    return outcomes


def _write_permissions(ec2: Client) -> list[CheckOutcome]:
    tags = [{"ResourceType": "placement-group", "Tags": [{"Key": "spotd-job", "Value": "x"}]}]
    return [
        _dry_run("CreatePlacementGroup", ec2.create_placement_group,
                 {"GroupName": CHECK_NAME, "Strategy": "cluster", "TagSpecifications": tags}),
        _dry_run("DeletePlacementGroup", ec2.delete_placement_group, {"GroupName": CHECK_NAME}),
        _dry_run("TerminateInstances", ec2.terminate_instances, {"InstanceIds": [NO_INSTANCE]}),
    ]  # fmt: skip


def _pricing(clients: AwsClients, region: str, itype: str) -> CheckOutcome:
    name = "permission pricing:GetProducts"
    with _failing_as(name, "pricing:GetProducts") as failed:
        with map_aws_errors("GetProducts"):
            clients.pricing().get_products(
                ServiceCode="AmazonEC2", Filters=on_demand_filters(region, itype), MaxResults=1
            )
        return CheckOutcome(name, True, "allowed")
    return failed[0]


def _bare_launch(ec2: Client, target: CheckTarget, region: str) -> CheckOutcome:
    """Without a job: may the caller launch at all (one node of the first type)?"""
    params = {
        "ImageId": target.settings.image_id.get(region, "ami-00000000000000000"),
        "InstanceType": target.instance_types[0] if target.instance_types else "g5.xlarge",
        "MinCount": 1, "MaxCount": 1,
    }  # fmt: skip
    return _dry_run("RunInstances", ec2.run_instances, params)


def _launch(target: CheckTarget, request: LaunchRequest, would: list[str]) -> list[CheckOutcome]:
    pool = request.offering.pool
    outcomes = []
    gang: GangNetwork | None = None
    with _failing_as("gang network") as failed:
        gang = target.planner.plan(request, create=False)
    if failed:
        return failed
    ec2 = target.clients.ec2(pool.region)
    if gang is not None:
        would += gang.would_create
        if any("security group" in line for line in gang.would_create):
            outcomes += _group_permissions(ec2, gang)
    with _failing_as("boot script") as failed:
        script = target.user_data(request)
    if failed:
        return [*outcomes, *failed]
    token = aws_client_token(request.client_token)
    image = target.settings.image_id.get(pool.region, "ami-00000000000000000")
    params = launch_params(
        target.settings.model_copy(update={"image_id": {pool.region: image}}),
        request, token, script, gang, subnet_id=target.planner.private_subnet(request, gang),
    )  # fmt: skip
    efa = len([i for i in (gang.interfaces if gang else ()) if "efa" in str(i["InterfaceType"])])
    line = (f"{request.nodes} {request.market.value} instance(s) {pool.instance_type} in "
            f"{pool.zone} from {image}, each with its root volume")  # fmt: skip
    if efa:
        line += f" and {efa} EFA interfaces"
    if gang is not None:
        line += f", in placement group {gang.placement_group}"
    would.append(line)
    outcomes.append(_launch_dry_run(ec2, params, line))
    outcomes.append(_egress(target, request, gang))
    return outcomes


def _efa_table(target: CheckTarget, request: LaunchRequest) -> list[CheckOutcome]:
    """Does spotd's EFA table still match what EC2 says of the gang's type?"""
    pool = request.offering.pool
    if request.nodes < 2 or pool.instance_type not in EFA_LAYOUTS:
        return []
    name = f"efa layout {pool.instance_type}"
    with _failing_as(name, "ec2:DescribeInstanceTypes") as failed:
        drift = table_drift(target.planner.facts(pool.region, pool.instance_type))
        if drift is not None:
            return [CheckOutcome(name, False, f"EC2 now says {drift}: spotd's table "
                                 "(spotd_aws.fabric.EFA_LAYOUTS) needs an update")]  # fmt: skip
        layout = EFA_LAYOUTS[pool.instance_type]
        return [CheckOutcome(name, True, f"{layout.efa_interfaces} EFA-only interfaces on "
                             f"{layout.network_cards} network cards, as EC2 says")]  # fmt: skip
    return failed


def _egress(target: CheckTarget, request: LaunchRequest, gang: GangNetwork | None) -> CheckOutcome:
    """Can the nodes reach the daemon, the package index and the checkpoint store?"""
    pool = request.offering.pool
    with _failing_as("egress", "ec2:DescribeRouteTables") as failed:
        net = target.planner.zone_network(pool.region, pool.zone)
        interfaces = len(gang.interfaces) if gang is not None and gang.interfaces else 1
        public = public_reason(net, wanted=target.settings.public_address, interfaces=interfaces)
        ec2 = target.clients.ec2(pool.region)
        return subnet_egress(ec2, pool.region, net, request.env, public)
    return failed[0]


def _configured_egress(target: CheckTarget) -> list[CheckOutcome]:
    """Without a job: the way out of each configured subnet, when nodes get no public address."""
    if target.settings.public_address:
        return []
    outcomes = []
    for zone, subnet in sorted(target.settings.subnet_ids.items()):
        region = next((r for r in target.settings.regions if zone.startswith(r)), None)
        if region is None:
            continue  # a zone of no configured region: never launched into
        with _failing_as(f"egress subnet {subnet}", "ec2:DescribeRouteTables") as failed:
            ec2 = target.clients.ec2(region)
            outcomes.append(subnet_egress(ec2, region, zone_network(ec2, zone, subnet), {}, None))
        outcomes += failed
    return outcomes


def _group_permissions(ec2: Client, gang: GangNetwork) -> list[CheckOutcome]:
    outcomes = [_dry_run("CreateSecurityGroup", ec2.create_security_group, {
        "GroupName": GANG_GROUP, "Description": "spotd check-cloud", "VpcId": gang.vpc_id,
    })]  # fmt: skip
    if gang.security_group_ids:
        # Asked about a group that exists (a dry run changes nothing), with a self rule.
        group = gang.security_group_ids[0]
        rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}]
        for action, call in (
            ("AuthorizeSecurityGroupIngress", ec2.authorize_security_group_ingress),
            ("AuthorizeSecurityGroupEgress", ec2.authorize_security_group_egress),
        ):
            outcomes.append(_dry_run(action, call, {"GroupId": group, "IpPermissions": rule}))
    return outcomes


def _launch_dry_run(ec2: Client, params: dict[str, Any], line: str) -> CheckOutcome:
    try:
        with map_aws_errors("RunInstances"):
            ec2.run_instances(DryRun=True, **params)
    except ProviderError as exc:
        if exc.code == "DryRunOperation":
            return CheckOutcome("launch", True, f"EC2 would accept {line}")
        if exc.code == "InvalidPlacementGroup.Unknown":
            return CheckOutcome("launch", True, "EC2 would accept it once spotd has made "
                                f"the placement group: {line}")  # fmt: skip
        return _refused("launch", "RunInstances", exc)
    except Exception as exc:
        return CheckOutcome("launch", False, f"{type(exc).__name__}: {exc}")
    return CheckOutcome("launch", True, f"answered (DryRun ignored by the endpoint): {line}")


def _capacity(target: CheckTarget, request: LaunchRequest) -> list[CheckOutcome]:
    """The spot placement score of the gang in its zone; on-demand has no such signal."""
    if request.market is not Market.SPOT:
        return []
    pool = request.offering.pool
    name = "capacity"
    with _failing_as(name, "ec2:GetSpotPlacementScores") as failed:
        ec2 = target.clients.ec2(pool.region)
        scores = placement_scores(ec2, pool.instance_type, [pool.region], request.nodes)
        names = zone_ids(ec2)
        by_zone = {names.get(zid): v for (r, zid), v in scores.items() if r == pool.region}
        what = f"{request.nodes} x {pool.instance_type} in {pool.zone}"
        score = by_zone.get(pool.zone)
        if score is None:
            return [CheckOutcome(name, False, f"no spot placement score for {what}: "
                                 "AWS expects little or no spot capacity there")]  # fmt: skip
        return [CheckOutcome(name, True, f"spot placement score {round(score * 10)}/10 "
                             f"for {what}")]  # fmt: skip
    return failed


def _quota(target: CheckTarget, request: LaunchRequest) -> list[CheckOutcome]:
    pool = request.offering.pool
    quota = quota_for(pool.instance_type, request.market)
    if quota is None:
        return []
    code, title = quota
    name = f"quota {code}"
    with _failing_as(name, "servicequotas:GetServiceQuota") as failed:
        facts = target.planner.facts(pool.region, pool.instance_type)
        needed = facts.vcpus * request.nodes
        try:
            with map_aws_errors("GetServiceQuota"):
                reply = target.clients.service_quotas(pool.region).get_service_quota(
                    ServiceCode="ec2", QuotaCode=code
                )
        except ProviderError as exc:
            if exc.code == "NoSuchResourceException":
                return [CheckOutcome(name, True, f"{title}: not listed in {pool.region}, "
                                     "not checked")]  # fmt: skip
            raise
        value = float((reply.get("Quota") or {}).get("Value", 0))
        detail = (f"{title}: {value:g} vCPUs in {pool.region}, the launch needs {needed} "
                  f"({request.nodes} x {facts.vcpus}) on top of what already runs")  # fmt: skip
        if value < needed:
            return [CheckOutcome(name, False, detail + ": ask for an increase in Service Quotas")]
        return [CheckOutcome(name, True, detail)]
    return failed


# -- helpers -------------------------------------------------------------------


def _dry_run(action: str, call: Callable[..., Any], params: dict[str, Any]) -> CheckOutcome:
    name = f"permission ec2:{action}"
    try:
        with map_aws_errors(action):
            call(DryRun=True, **params)
    except ProviderError as exc:
        if exc.code == "DryRunOperation":
            return CheckOutcome(name, True, "allowed (dry run)")
        if exc.code in INCONCLUSIVE:
            return CheckOutcome(name, True, f"not conclusive: EC2 answered {exc.code} for the "
                                "made-up name before checking the permission")  # fmt: skip
        return _refused(name, action, exc)
    except Exception as exc:
        return CheckOutcome(name, False, f"{type(exc).__name__}: {exc}")
    return CheckOutcome(name, True, "allowed (answered)")


def _refused(name: str, action: str, exc: ProviderError) -> CheckOutcome:
    if exc.code in DENIED or isinstance(exc, AuthError):
        return CheckOutcome(f"permission ec2:{action}", False,
                            f"missing: allow ec2:{action} ({exc.code})")  # fmt: skip
    if isinstance(exc, CapacityError):
        return CheckOutcome("capacity", False, f"{exc.code}: EC2 has no capacity for it now")
    if isinstance(exc, QuotaError):
        return CheckOutcome("quota", False, f"{exc.code}: a vCPU or instance quota is too low")
    return CheckOutcome(name, False, f"refused: {exc}")


@contextmanager
def _failing_as(name: str, permission: str | None = None) -> Iterator[list[CheckOutcome]]:
    """Runs a check; what it raises becomes one failed outcome in the yielded list.

    A refusal names ``permission``, the one the check's calls need.
    """
    failed: list[CheckOutcome] = []
    try:
        yield failed
    except AuthError as exc:
        need = f"missing: allow {permission}" if permission else "refused"
        failed.append(CheckOutcome(name, False, f"{need} ({exc.code}): {exc}"))
    except ProviderError as exc:
        failed.append(CheckOutcome(name, False, str(exc)))
    except Exception as exc:
        failed.append(CheckOutcome(name, False, f"{type(exc).__name__}: {exc}"))
