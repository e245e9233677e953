"""EC2 instances to spotd's :class:`~spotd.core.values.Instance`, and launch requests to EC2.

Pure functions: no API calls here, so the mapping tables are tested directly.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from spotd.core.errors import ProviderError
from spotd.core.values import Instance, InstanceState, LaunchRequest, Market, Pool

from .errors import PROVIDER
from .fabric import primary_interface
from .gang import GangNetwork
from .settings import AwsSettings

log = logging.getLogger(__name__)

IDEMPOTENCY_TAG = "spotd:client-token"
"""Tag holding the (AWS-sized) client token, so a relaunch finds its instances."""

MAX_TOKEN = 64
"""AWS accepts ClientTokens of up to 64 ASCII characters."""

SPOT_REASONS = frozenset(
    {
        "Server.SpotInstanceTermination",
        "Server.SpotInstanceShutdown",
    }
)
"""StateReason codes EC2 gives a spot instance it took back."""

SELF_SHUTDOWN = "Client.InstanceInitiatedShutdown"
"""StateReason code of an instance that shut itself down (the job ended)."""

_ENDING = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
_GONE = frozenset({"shutting-down", "terminated"})
_STAMP = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


def aws_client_token(token: str) -> str:
    """``token`` as AWS accepts it: itself if short ASCII, else a stable hash of it."""
    if len(token) <= MAX_TOKEN and token.isascii() and token.isprintable():
        return token
    return "spotd-" + hashlib.sha256(token.encode()).hexdigest()[: MAX_TOKEN - len("spotd-")]


def state_of(raw: Mapping[str, Any]) -> InstanceState:
    """spotd's state of one ``describe_instances`` instance.

    EC2 shows no interruption notice here (that is on the VM, 2 minutes
    ahead), so NOTICE never comes from this adapter.
    """
    name = str((raw.get("State") or {}).get("Name", ""))
    if name == "pending":
        return InstanceState.PENDING
    if name == "running":
        return InstanceState.RUNNING
    if name in _ENDING:
        reason = str((raw.get("StateReason") or {}).get("Code", ""))
        if reason in SPOT_REASONS or reason.startswith("Server.Spot"):
            return InstanceState.PREEMPTED
        if reason == SELF_SHUTDOWN:
            return InstanceState.EXITED
        return InstanceState.TERMINATED
    # A state EC2 may add later: not ended, so nothing is relaunched on top of it.
    log.warning("aws: unknown state %r of %s; treated as pending", name, raw.get("InstanceId"))
    return InstanceState.PENDING


def is_gone(raw: Mapping[str, Any]) -> bool:
    """Whether EC2 is already terminating the instance (so terminating it again is moot)."""
    return str((raw.get("State") or {}).get("Name", "")) in _GONE


def to_instance(raw: Mapping[str, Any], region: str) -> Instance:
    """spotd's view of one ``describe_instances`` / ``run_instances`` instance."""
    state = state_of(raw)
    return Instance(
        id=str(raw["InstanceId"]),
        pool=Pool(
            provider="aws",
            region=region,
            zone=str((raw.get("Placement") or {}).get("AvailabilityZone", "")),
            instance_type=str(raw.get("InstanceType", "")),
        ),
        market=Market.SPOT if raw.get("InstanceLifecycle") == "spot" else Market.ON_DEMAND,
        state=state,
        tags=tags_of(raw),
        exit_code=None,  # the on-VM agent reports exit codes; EC2 does not know them
        launched_at=_aware(raw.get("LaunchTime")),
        ended_at=_ended_at(raw)
        if state not in (InstanceState.PENDING, InstanceState.RUNNING)
        else None,
        # The primary interface's address: where the gang's peers reach the node.
        private_address=str(raw["PrivateIpAddress"]) if raw.get("PrivateIpAddress") else None,
    )


def tags_of(raw: Mapping[str, Any]) -> dict[str, str]:
    """The instance's tags as a dict."""
    return {str(t["Key"]): str(t.get("Value", "")) for t in raw.get("Tags") or []}


def launch_params(
    settings: AwsSettings,
    request: LaunchRequest,
    token: str,
    user_data: str,
    gang: GangNetwork | None = None,
    *,
    subnet_id: str | None = None,
) -> dict[str, Any]:
    """``run_instances`` arguments for all nodes of ``request`` in its pool's zone.

    ``gang`` (for multi-node requests) puts the nodes in its placement group and
    gives each its EFA interfaces, which then carry the subnet and the groups.
    With ``public_address = false`` a node without EFA gets one primary interface
    asking for no public address, in ``subnet_id`` (the zone's subnet; needed
    when ``subnet_ids`` names none for the zone).
    Raises KeyError naming the region when ``settings.image_id`` has no AMI for it.
    """
    pool = request.offering.pool
    tags = {**request.tags, "Name": _name(request), IDEMPOTENCY_TAG: token}
    tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
    params: dict[str, Any] = {
        "ImageId": settings.image_id[pool.region],
        "InstanceType": pool.instance_type,
        "MinCount": request.nodes,  # all or none
        "MaxCount": request.nodes,
        "ClientToken": token,
        "UserData": user_data,
        "Placement": {"AvailabilityZone": pool.zone},
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tag_list},
            {"ResourceType": "volume", "Tags": tag_list},
        ],
    }
    if request.market is Market.SPOT:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            # No MaxPrice: AWS caps a spot price at the on-demand price.
            "SpotOptions": {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            },
        }
    subnet = settings.subnet_ids.get(pool.zone)
    if subnet:
        params["SubnetId"] = subnet
    if settings.security_group_ids:
        params["SecurityGroupIds"] = list(settings.security_group_ids)
    if gang is not None:
        _add_gang(params, gang)
    if not settings.public_address and "NetworkInterfaces" not in params:
        _add_private_primary(params, subnet_id or params.get("SubnetId"))
    if settings.instance_profile:
        key = "Arn" if settings.instance_profile.startswith("arn:") else "Name"
        params["IamInstanceProfile"] = {key: settings.instance_profile}
    if settings.key_name:
        params["KeyName"] = settings.key_name
    return params


def _add_gang(params: dict[str, Any], gang: GangNetwork) -> None:
    params["Placement"]["GroupName"] = gang.placement_group
    if gang.interfaces:
        # EC2 refuses NetworkInterfaces beside an instance-level subnet or groups.
        params.pop("SubnetId", None)
        params.pop("SecurityGroupIds", None)
        params["NetworkInterfaces"] = [dict(i) for i in gang.interfaces]
    elif gang.security_group_ids:
        params["SecurityGroupIds"] = list(gang.security_group_ids)


def _add_private_primary(params: dict[str, Any], subnet_id: str | None) -> None:
    # Only an interface can say "no public address"; it then carries subnet and groups.
    if not subnet_id:
        raise ProviderError("aws: a node without a public address needs its zone's subnet",
                            provider=PROVIDER, code="InvalidRequest")  # fmt: skip
    groups = params.pop("SecurityGroupIds", [])
    params.pop("SubnetId", None)
    params["NetworkInterfaces"] = [primary_interface(subnet_id, groups, public=False)]


def _name(request: LaunchRequest) -> str:
    job = request.tags.get("spotd-job")
    attempt = request.tags.get("spotd-attempt")
    parts = ["spotd", *(p for p in (job, attempt) if p)]
    return "-".join(parts)


def _aware(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _ended_at(raw: Mapping[str, Any]) -> datetime | None:
    # EC2 gives the time of the last state change only inside this text.
    found = _STAMP.search(str(raw.get("StateTransitionReason") or ""))
    if found is None:
        return None
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
