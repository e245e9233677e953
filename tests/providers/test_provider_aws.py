"""AWS-specific behaviour of the AWS adapter, beyond the Provider contract suite.

The real boto3 clients run against moto, with botocore hooks answering what
moto lacks (see ``fakes/aws_fake.py``); nothing reaches the network. Every
price here is made up.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)
from fakes.aws_fake import (
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    FakeAws,
    aws_env,
    moto_placement_groups,
    new_session,
    price_list_item,
)
from gang_support import assert_gang_env, gang_request, script_env
from moto import mock_aws
from pydantic import ValidationError

from spotd.core.clock import ManualClock
from spotd.core.errors import (
    AuthError,
    CapacityError,
    InvalidRequestError,
    NotFoundError,
    PriceTooLowError,
    ProviderError,
    ProviderUnavailable,
    QuotaError,
    ThrottledError,
)
from spotd.core.network import Fabric
from spotd.core.values import (
    CheckOutcome,
    CloudCheck,
    InstanceState,
    LaunchRequest,
    Market,
    Offering,
    Pool,
    Reach,
)
from spotd.daemon.bootstrap import bootstrap_for
from spotd.market import catalog as interconnect_module
from spotd.market.catalog import UNKNOWN_NODE_GBPS
from spotd_aws import AwsProvider, AwsSettings, build_aws_provider, map_aws_errors
from spotd_aws.check import quota_for
from spotd_aws.errors import ERROR_CODES
from spotd_aws.fabric import (
    EFA_LAYOUTS,
    EfaCard,
    NetworkFacts,
    efa_interfaces,
    network_facts,
    table_drift,
)
from spotd_aws.figures import INSTANCE_TYPES
from spotd_aws.instances import (
    IDEMPOTENCY_TAG,
    aws_client_token,
    launch_params,
    state_of,
)
from spotd_aws.placement import MAX_NAME, group_name
from spotd_aws.prices import parse_on_demand

EAST, WEST = "us-east-1", "us-west-2"


def bootstrap(request: LaunchRequest) -> str:
    return f"#!/bin/sh\necho agent {request.client_token}\n"


@dataclass
class Env:
    """moto, the hooks and a clock for the caches; ``provider()`` builds an adapter."""

    fake: FakeAws
    session: Any
    clock: ManualClock = field(default_factory=lambda: ManualClock(datetime.now(UTC)))

    def provider(self, user_data: Any = bootstrap, **overrides: Any) -> AwsProvider:
        values: dict[str, Any] = {
            "enabled": True, "regions": [EAST], "instance_types": ["g5.xlarge"],
            "image_id": {EAST: FakeAws.ami(EAST)},
        }  # fmt: skip
        values.update(overrides)
        return AwsProvider(
            AwsSettings(**values), user_data=user_data, session=self.session,
            clock=self.clock,
        )  # fmt: skip


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with aws_env(tmp_path), mock_aws(), moto_placement_groups():
        fake = FakeAws()
        session = new_session()
        fake.install(session)
        yield Env(fake, session)


def by_zone(offerings: list[Offering], itype: str = "g5.xlarge") -> dict[str, Offering]:
    return {o.pool.zone: o for o in offerings if o.pool.instance_type == itype}


def request(offering: Offering, token: str = "tok", nodes: int = 1,
            market: Market = Market.SPOT) -> LaunchRequest:
    return LaunchRequest(
        offering=offering, market=market, nodes=nodes, client_token=token,
        tags={"spotd-job": "j-aws", "spotd-attempt": "3", "spotd-owner": "d1"},
        command=("python", "train.py"), env={},
    )  # fmt: skip


def g5_offering(env: Env, provider: AwsProvider, zone: str = "us-east-1a") -> Offering:
    env.fake.add_spot_price(zone, "g5.xlarge", 0.4)
    return by_zone(provider.offerings())[zone]


# -- settings and factory ----------------------------------------------------------


def test_settings_defaults_and_extra_forbidden() -> None:
    settings = AwsSettings()
    assert settings.enabled is False
    assert settings.regions == ["us-east-1", "us-west-2"]
    assert settings.instance_types is None and settings.pricing_region == "us-east-1"
    with pytest.raises(ValidationError):
        AwsSettings(access_key="AKIA...")  # type: ignore[call-arg]
    for bad in ("ec2.local:4566", "ftp://ec2.local", "http://"):
        with pytest.raises(ValidationError, match="endpoint_url must be an http"):
            AwsSettings(endpoint_url=bad)
    assert AwsSettings(endpoint_url="http://127.0.0.1:5000").endpoint_url == "http://127.0.0.1:5000"


def test_factory_builds_a_provider() -> None:
    provider = build_aws_provider(AwsSettings(), user_data=bootstrap)
    assert isinstance(provider, AwsProvider) and provider.name == "aws"
    assert provider.instance_types == sorted(INSTANCE_TYPES)


def test_clients_retry_little_and_time_out(env: Env) -> None:
    provider = env.provider()
    config = provider._clients.ec2(EAST).meta.config
    assert config.retries["total_max_attempts"] == 2
    assert config.connect_timeout == 5 and config.read_timeout == 30


# -- offerings: spot prices ----------------------------------------------------------


def test_latest_spot_price_per_zone_wins(env: Env) -> None:
    f = env.fake
    f.add_spot_price("us-east-1a", "g5.xlarge", 0.50, timedelta(hours=3))
    f.add_spot_price("us-east-1a", "g5.xlarge", 0.61, timedelta(hours=1))
    f.add_spot_price("us-east-1a", "g5.xlarge", 0.55, timedelta(hours=2))
    f.add_spot_price("us-east-1b", "g5.xlarge", 0.40, timedelta(hours=5))
    offers = by_zone(env.provider().offerings())
    assert offers["us-east-1a"].spot_price == pytest.approx(0.61)
    assert offers["us-east-1b"].spot_price == pytest.approx(0.40)
    assert offers["us-east-1c"].spot_price is None  # no row: not sold as spot now
    (call,) = env.fake.params("DescribeSpotPriceHistory")
    assert call["ProductDescriptions"] == ["Linux/UNIX"]
    assert call["InstanceTypes"] == ["g5.xlarge"]


def test_spot_price_history_is_paged(env: Env) -> None:
    env.fake.spot_page_size = 2
    for hours, price in [(6, 0.30), (5, 0.31), (4, 0.32), (3, 0.33), (2, 0.34), (1, 0.35)]:
        env.fake.add_spot_price("us-east-1d", "g5.xlarge", price, timedelta(hours=hours))
    env.fake.add_spot_price("us-east-1a", "g5.xlarge", 0.77)  # newest row on the last page
    offers = by_zone(env.provider().offerings())
    calls = env.fake.params("DescribeSpotPriceHistory")
    assert len(calls) == 4
    assert [c.get("NextToken") for c in calls] == [None, "2", "4", "6"]
    assert offers["us-east-1d"].spot_price == pytest.approx(0.35)
    assert offers["us-east-1a"].spot_price == pytest.approx(0.77)


# -- offerings: on-demand prices -----------------------------------------------------


def test_on_demand_price_parsed_from_a_price_list_string() -> None:
    item = price_list_item(EAST, "p5.48xlarge", 55.04)
    assert isinstance(item, str)
    assert json.loads(item)["terms"]["Reserved"]  # a cheaper term that must be ignored
    assert parse_on_demand(item) == pytest.approx(55.04)


@pytest.mark.parametrize("variant", [
    {"operating_system": "Windows"},
    {"tenancy": "Dedicated"},
    {"capacity_status": "UnusedCapacityReservation"},
    {"pre_installed_sw": "SQL Std"},
])  # fmt: skip
def test_other_price_list_entries_are_not_on_demand(variant: dict[str, str]) -> None:
    assert parse_on_demand(price_list_item(EAST, "p5.48xlarge", 55.04, **variant)) is None


def test_free_or_capacity_block_entries_give_no_price() -> None:
    free = json.loads(price_list_item(EAST, "g5.xlarge", 0.0))
    assert parse_on_demand(free) is None
    block = json.loads(price_list_item(EAST, "g5.xlarge", 1.0))
    block["product"]["attributes"]["marketoption"] = "CapacityBlock"
    assert parse_on_demand(json.dumps(block)) is None


def test_on_demand_prices_come_filtered_and_are_cached_for_hours(env: Env) -> None:
    env.fake.on_demand[(EAST, "g5.xlarge")] = 1.006
    provider = env.provider()
    first = provider.offerings()
    assert [o.on_demand_price for o in first] == pytest.approx([1.006] * len(first))
    (call,) = env.fake.params("GetProducts")
    filters = {f["Field"]: f["Value"] for f in call["Filters"]}
    assert call["ServiceCode"] == "AmazonEC2"
    assert filters == {
        "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
        "capacitystatus": "Used", "instanceType": "g5.xlarge", "regionCode": EAST,
    }  # fmt: skip
    provider.offerings()
    assert len(env.fake.params("GetProducts")) == 1  # cached
    env.clock.advance(7 * 3600)
    provider.offerings()
    assert len(env.fake.params("GetProducts")) == 2  # stale after hours


def test_pricing_failure_leaves_on_demand_empty_and_warns(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    env.fake.on_demand[(EAST, "g5.xlarge")] = 1.006
    env.fake.fail_next("GetProducts", "AccessDeniedException", 400)
    provider = env.provider()
    with caplog.at_level(logging.WARNING):
        assert {o.on_demand_price for o in provider.offerings()} == {None}
    assert "on-demand price" in caplog.text
    # Failures are not cached: the next poll asks again and gets it.
    again = provider.offerings()
    assert [o.on_demand_price for o in again] == pytest.approx([1.006] * len(again))


# -- offerings: capacity and instance facts --------------------------------------------


def test_placement_scores_map_to_capacity_per_zone(env: Env) -> None:
    env.fake.scores.update({
        ("us-east-1a", "g5.xlarge"): 1, ("us-east-1b", "g5.xlarge"): 10,
        ("us-east-1c", "g5.xlarge"): 5,
    })  # fmt: skip
    offers = by_zone(env.provider().offerings())
    assert offers["us-east-1a"].capacity == pytest.approx(0.1)
    assert offers["us-east-1b"].capacity == pytest.approx(1.0)
    assert offers["us-east-1c"].capacity == pytest.approx(0.5)
    assert offers["us-east-1d"].capacity is None  # no score for that zone
    (call,) = env.fake.params("GetSpotPlacementScores")
    assert call["SingleAvailabilityZone"] is True
    assert call["InstanceTypes"] == ["g5.xlarge"] and call["RegionNames"] == [EAST]
    assert call["TargetCapacity"] == 1


def test_failed_placement_scores_leave_capacity_empty_and_warn(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    env.fake.add_spot_price("us-east-1a", "g5.xlarge", 0.4)
    env.fake.fail_next("GetSpotPlacementScores", "UnauthorizedOperation", 403)
    with caplog.at_level(logging.WARNING):
        offers = by_zone(env.provider().offerings())
    assert offers and all(o.capacity is None for o in offers.values())
    assert offers["us-east-1a"].spot_price == pytest.approx(0.4)
    assert "spot placement scores" in caplog.text


def test_gpu_facts_from_the_api_and_fabric_from_the_table(env: Env) -> None:
    offers = by_zone(env.provider(instance_types=["p5.48xlarge"]).offerings(), "p5.48xlarge")
    offer = next(iter(offers.values()))
    assert (offer.gpu, offer.gpus_per_node, offer.gpu_memory_gb) == ("H100", 8, 80)
    assert offer.interconnect.fabric is Fabric.EFA
    assert offer.interconnect.gbps_per_gpu == pytest.approx(400)
    assert offer.notice_seconds == 120


def test_unknown_type_gets_the_conservative_fabric_and_a_warning(
    env: Env, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(interconnect_module, "_warned", set())  # warned once per process
    with caplog.at_level(logging.WARNING):
        offers = env.provider(instance_types=["g4dn.xlarge"]).offerings()
    assert offers and {o.gpu for o in offers} == {"T4"}
    assert {o.interconnect.fabric for o in offers} == {Fabric.ETHERNET}
    assert {o.interconnect.gbps_per_gpu for o in offers} == {UNKNOWN_NODE_GBPS}
    assert "g4dn.xlarge" in caplog.text


def test_default_types_are_the_interconnect_table(env: Env) -> None:
    provider = env.provider(instance_types=None)
    types = {o.pool.instance_type for o in provider.offerings()}
    (call,) = env.fake.params("DescribeInstanceTypeOfferings")
    assert call["Filters"][0]["Values"] == sorted(INSTANCE_TYPES)
    assert {"p5.48xlarge", "g5.xlarge"} <= types <= set(INSTANCE_TYPES)


def test_static_facts_are_cached_between_polls(env: Env) -> None:
    provider = env.provider()
    provider.offerings()
    provider.offerings()
    assert len(env.fake.params("DescribeInstanceTypeOfferings")) == 1
    assert len(env.fake.params("DescribeInstanceTypes")) == 1
    assert len(env.fake.params("DescribeSpotPriceHistory")) == 2  # prices: every poll


# -- launch -----------------------------------------------------------------------------


def test_a_boot_script_the_renderer_refuses_is_an_invalid_request(env: Env) -> None:
    # The real renderer refuses a script that would carry the daemon's own token.
    render = bootstrap_for("aws", daemon_url="http://d:8000", daemon_token="s3cret")
    provider = env.provider(user_data=render)
    leaky = replace(request(g5_offering(env, provider)), env={"TOKEN": "s3cret"})
    with pytest.raises(InvalidRequestError, match="daemon's token") as err:
        provider.launch(leaky)
    assert not err.value.retryable and err.value.code == "InvalidParameter"
    assert env.fake.params("RunInstances") == []


def test_launch_sends_tags_token_spot_options_and_user_data(env: Env) -> None:
    provider = env.provider()
    (inst,) = provider.launch(request(g5_offering(env, provider), token="tok-42"))
    (params,) = env.fake.params("RunInstances")
    assert params["ClientToken"] == "tok-42"
    assert params["MinCount"] == params["MaxCount"] == 1
    assert params["InstanceType"] == "g5.xlarge"
    assert params["Placement"] == {"AvailabilityZone": "us-east-1a"}
    assert params["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        },
    }
    tags = {t["Key"]: t["Value"] for t in params["TagSpecifications"][0]["Tags"]}
    assert tags == {"spotd-job": "j-aws", "spotd-attempt": "3", "spotd-owner": "d1",
                    "Name": "spotd-j-aws-3", IDEMPOTENCY_TAG: "tok-42"}  # fmt: skip
    # boto3 base64-encodes UserData itself: the adapter passes the plain script.
    assert base64.b64decode(params["UserData"]).decode() == "#!/bin/sh\necho agent tok-42\n"
    assert inst.market is Market.SPOT and inst.tags["spotd-job"] == "j-aws"
    assert inst.pool.zone == "us-east-1a" and inst.state is InstanceState.PENDING


def test_moto_ignores_client_token_so_the_adapter_looks_up_its_tag(env: Env) -> None:
    ec2 = boto3.client("ec2", region_name=EAST)  # unhooked: not counted below
    args = {"ImageId": FakeAws.ami(EAST), "MinCount": 1, "MaxCount": 1, "ClientToken": "x"}
    a, b = ec2.run_instances(**args), ec2.run_instances(**args)
    assert a["Instances"][0]["InstanceId"] != b["Instances"][0]["InstanceId"]  # the fake's gap
    provider = env.provider()
    offer = g5_offering(env, provider)
    first = provider.launch(request(offer, token="same"))
    again = provider.launch(request(offer, token="same"))
    assert [i.id for i in again] == [i.id for i in first]
    assert len(env.fake.params("RunInstances")) == 1
    assert len(provider.list_instances({"spotd-job": "j-aws"})) == 1


def test_long_client_token_is_hashed_to_64_ascii_chars(env: Env) -> None:
    long_token = "job-" + "é" + "x" * 120
    short = aws_client_token(long_token)
    assert len(short) <= 64 and short.isascii()
    assert short == aws_client_token(long_token) != aws_client_token(long_token + "y")
    assert aws_client_token("a" * 64) == "a" * 64
    provider = env.provider()
    offer = g5_offering(env, provider)
    first = provider.launch(request(offer, token=long_token))
    again = provider.launch(request(offer, token=long_token))
    assert [i.id for i in again] == [i.id for i in first]
    (params,) = env.fake.params("RunInstances")
    assert params["ClientToken"] == short


def test_multi_node_launch_is_one_call_in_one_zone(env: Env) -> None:
    provider = env.provider()
    nodes = provider.launch(request(g5_offering(env, provider, "us-east-1b"), nodes=3))
    assert len(nodes) == 3 and {n.pool.zone for n in nodes} == {"us-east-1b"}
    (params,) = env.fake.params("RunInstances")
    assert params["MinCount"] == params["MaxCount"] == 3


def test_on_demand_launch_has_no_spot_options(env: Env) -> None:
    provider = env.provider()
    (inst,) = provider.launch(request(g5_offering(env, provider), market=Market.ON_DEMAND))
    assert "InstanceMarketOptions" not in env.fake.params("RunInstances")[0]
    assert inst.market is Market.ON_DEMAND
    assert provider.describe([inst.id])[0].market is Market.ON_DEMAND


def test_network_and_identity_settings_reach_run_instances() -> None:
    settings = AwsSettings(
        image_id={EAST: "ami-1"}, subnet_ids={"us-east-1a": "subnet-1"},
        security_group_ids=["sg-1"], instance_profile="spotd-node", key_name="ops",
    )  # fmt: skip
    offer = _some_offer()
    params = launch_params(settings, request(offer), "t", "#!/bin/sh")
    assert params["SubnetId"] == "subnet-1" and params["SecurityGroupIds"] == ["sg-1"]
    assert params["IamInstanceProfile"] == {"Name": "spotd-node"}
    assert params["KeyName"] == "ops" and params["ImageId"] == "ami-1"
    arn = settings.model_copy(update={"instance_profile": "arn:aws:iam::1:instance-profile/x"})
    assert "Arn" in launch_params(arn, request(offer), "t", "")["IamInstanceProfile"]


def test_launch_without_an_image_for_the_region_is_refused(env: Env) -> None:
    provider = env.provider(image_id={})
    with pytest.raises(ProviderError, match="image_id") as err:
        provider.launch(request(g5_offering(env, provider)))
    assert type(err.value) is ProviderError and env.fake.params("RunInstances") == []


# -- instances -------------------------------------------------------------------------


def raw(state: str, reason: str = "") -> dict[str, Any]:
    return {"InstanceId": "i-1", "State": {"Name": state}, "StateReason": {"Code": reason}}


@pytest.mark.parametrize(("state", "reason", "expected"), [
    ("pending", "", InstanceState.PENDING),
    ("running", "", InstanceState.RUNNING),
    ("shutting-down", "Server.SpotInstanceTermination", InstanceState.PREEMPTED),
    ("terminated", "Server.SpotInstanceTermination", InstanceState.PREEMPTED),
    ("stopped", "Server.SpotInstanceShutdown", InstanceState.PREEMPTED),
    ("terminated", "Client.InstanceInitiatedShutdown", InstanceState.EXITED),
    ("stopped", "Client.InstanceInitiatedShutdown", InstanceState.EXITED),
    ("terminated", "Client.UserInitiatedShutdown", InstanceState.TERMINATED),
    ("shutting-down", "Client.UserInitiatedShutdown", InstanceState.TERMINATED),
    ("stopped", "Client.UserInitiatedShutdown", InstanceState.TERMINATED),
    ("stopping", "", InstanceState.TERMINATED),
    ("terminated", "Server.InternalError", InstanceState.TERMINATED),
    ("terminated", "", InstanceState.TERMINATED),
    ("some-new-state", "", InstanceState.PENDING),
])  # fmt: skip
def test_state_mapping(state: str, reason: str, expected: InstanceState) -> None:
    assert state_of(raw(state, reason)) is expected


def test_terminate_and_interruption_as_described(env: Env) -> None:
    provider = env.provider()
    offer = g5_offering(env, provider)
    a, b = provider.launch(request(offer, token="a")), provider.launch(request(offer, token="b"))
    ida, idb = a[0].id, b[0].id
    assert provider.describe([ida])[0].state is InstanceState.RUNNING
    provider.terminate([ida])
    env.fake.interrupt(idb, EAST)
    found = {i.id: i for i in provider.describe([idb, ida])}
    assert [i.id for i in provider.describe([idb, ida])] == [idb, ida]
    assert found[ida].state is InstanceState.TERMINATED
    assert found[idb].state is InstanceState.PREEMPTED
    assert found[idb].ended_at is not None and found[idb].exit_code is None
    provider.terminate([ida, idb, "i-0123456789abcdef0", "no-such-instance"])  # all ignored
    assert len(env.fake.params("TerminateInstances")) == 1


def test_unknown_ids_are_left_out(env: Env) -> None:
    provider = env.provider()
    assert provider.describe(["i-0123456789abcdef0", "sim-aws-123", ""]) == []
    assert provider.logs("i-0123456789abcdef0") == ""


def test_instances_are_found_in_every_region(env: Env) -> None:
    images = {EAST: FakeAws.ami(EAST), WEST: FakeAws.ami(WEST)}
    provider = env.provider(regions=[EAST, WEST], image_id=images)
    env.fake.add_spot_price("us-west-2a", "g5.xlarge", 0.5)
    offers = provider.offerings()
    east = next(o for o in offers if o.pool.zone == "us-east-1a")
    west = next(o for o in offers if o.pool.zone == "us-west-2a")
    (ie,) = provider.launch(request(east, token="e"))
    (iw,) = provider.launch(request(west, token="w"))
    listed = provider.list_instances({"spotd-owner": "d1"})
    assert {i.id: i.pool.region for i in listed} == {ie.id: EAST, iw.id: WEST}
    fresh = env.provider(regions=[EAST, WEST], image_id=images)  # no memory of where they are
    assert [i.pool.region for i in fresh.describe([iw.id, ie.id])] == [WEST, EAST]
    fresh.terminate([iw.id])
    assert fresh.describe([iw.id])[0].state is InstanceState.TERMINATED


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "expected"), sorted(ERROR_CODES.items()))
def test_every_error_code_maps_to_its_class(
    env: Env, code: str, expected: type[ProviderError]
) -> None:
    provider = env.provider()
    offer = _some_offer()
    env.fake.fail_next("RunInstances", code, 400)
    with pytest.raises(ProviderError) as err:
        provider.launch(request(offer))
    assert type(err.value) is expected
    assert err.value.provider == "aws" and err.value.code == code


def test_required_codes_are_all_mapped() -> None:
    required = {
        CapacityError: ["InsufficientInstanceCapacity", "InsufficientCapacity", "Unsupported"],
        PriceTooLowError: ["SpotMaxPriceTooLow"],
        QuotaError: ["MaxSpotInstanceCountExceeded", "VcpuLimitExceeded", "InstanceLimitExceeded"],
        ThrottledError: ["RequestLimitExceeded", "Throttling", "ThrottlingException"],
        AuthError: ["AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "ExpiredToken"],
        ProviderUnavailable: ["InternalError", "ServiceUnavailable"],
        NotFoundError: ["InvalidInstanceID.NotFound"],
    }
    for kind, codes in required.items():
        for code in codes:
            assert ERROR_CODES[code] is kind, code


@pytest.mark.parametrize(("code", "status", "expected"), [
    ("InsufficientInstanceCapacity", 500, CapacityError),  # the code wins over the status
    ("SomethingNew", 502, ProviderUnavailable),
    ("SomethingNew", 429, ThrottledError),
    ("InvalidParameterValue", 400, ProviderError),
])  # fmt: skip
def test_unknown_codes_fall_back_on_the_status(
    env: Env, code: str, status: int, expected: type[ProviderError]
) -> None:
    provider = env.provider()
    offer = _some_offer()
    env.fake.fail_next("RunInstances", code, status)
    with pytest.raises(ProviderError) as err:
        provider.launch(request(offer))
    assert type(err.value) is expected


@pytest.mark.parametrize(("exc", "expected"), [
    (NoCredentialsError(), AuthError),
    (EndpointConnectionError(endpoint_url="https://ec2.invalid"), ProviderUnavailable),
    (ConnectTimeoutError(endpoint_url="https://ec2.invalid"), ProviderUnavailable),
    (ReadTimeoutError(endpoint_url="https://ec2.invalid"), ProviderUnavailable),
    (ParamValidationError(report="bad"), ProviderError),
])  # fmt: skip
def test_botocore_exceptions_map_to_our_classes(
    exc: Exception, expected: type[ProviderError]
) -> None:
    with pytest.raises(ProviderError) as err, map_aws_errors("Test"):
        raise exc
    assert type(err.value) is expected and err.value.provider == "aws"
    assert err.value.__cause__ is exc


def test_messages_match_codes_not_text() -> None:
    # A message that reads like throttling does not make an unknown code throttling.
    fake = ClientError({"Error": {"Code": "Odd", "Message": "Request limit exceeded"},
                        "ResponseMetadata": {"HTTPStatusCode": 400}}, "RunInstances")  # fmt: skip
    with pytest.raises(ProviderError) as err, map_aws_errors("RunInstances"):
        raise fake
    assert type(err.value) is ProviderError and err.value.code == "Odd"


# -- credentials ----------------------------------------------------------------------------


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._data


def _answer_over_the_wire(status: int, code: str, message: str) -> Any:
    """A before-send hook: the request is built and signed for real, never sent."""
    xml = (f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message>"
           "</Error></Errors><RequestID>fake</RequestID></Response>").encode()  # fmt: skip

    def hook(request: Any, **_: Any) -> AWSResponse:
        assert FAKE_ACCESS_KEY in request.headers["Authorization"].decode()  # really signed
        return AWSResponse(request.url, status, {}, _Body(xml))

    return hook


def _offline_provider(session: Any) -> AwsProvider:
    settings = AwsSettings(enabled=True, regions=[EAST], image_id={EAST: "ami-12c6146b"})
    return AwsProvider(settings, user_data=bootstrap, session=session)


def _some_offer() -> Offering:
    """A g5.xlarge offering in us-east-1a, without asking the fake."""
    return Offering(
        pool=Pool("aws", EAST, "us-east-1a", "g5.xlarge"), gpu="A10G", gpus_per_node=1,
        gpu_memory_gb=24, interconnect=INSTANCE_TYPES["g5.xlarge"].interconnect,
        spot_price=0.4, on_demand_price=1.0,
    )  # fmt: skip


def test_credentials_never_appear_in_errors_or_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="spotd")
    with aws_env(tmp_path):
        session = new_session()
        # AWS's text may name the key id; the adapter must not pass it on.
        session.events.register("before-send.ec2", _answer_over_the_wire(
            401, "AuthFailure", f"key {FAKE_ACCESS_KEY} was not able to be validated"))
        provider = _offline_provider(session)
        with pytest.raises(AuthError) as err:
            provider.launch(request(_some_offer()))
    text = str(err.value) + caplog.text
    assert err.value.code == "AuthFailure"
    assert FAKE_ACCESS_KEY not in text and FAKE_SECRET_KEY not in text


def test_key_ids_are_scrubbed_from_other_messages(tmp_path: Path) -> None:
    with aws_env(tmp_path):
        session = new_session()
        session.events.register("before-send.ec2", _answer_over_the_wire(
            400, "InvalidParameterValue", f"odd request from {FAKE_ACCESS_KEY}"))
        with pytest.raises(ProviderError) as err:
            _offline_provider(session).launch(request(_some_offer()))
    assert FAKE_ACCESS_KEY not in str(err.value) and "[redacted]" in str(err.value)


def test_missing_credentials_are_an_auth_error(tmp_path: Path) -> None:
    with aws_env(tmp_path):
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.pop(key)
        session = new_session()
        session.events.register("before-send", lambda **_: pytest.fail("request was sent"))
        with pytest.raises(AuthError) as err:
            _offline_provider(session).describe(["i-0123456789abcdef0"])
    assert err.value.code == "NoCredentialsError"


def test_a_gangs_user_data_carries_rendezvous_and_efa_variables(env: Env) -> None:
    render = bootstrap_for("aws", daemon_url="https://d:8443", daemon_token="the-daemon-token")
    provider = env.provider(user_data=render, instance_types=["p4d.24xlarge"])
    env.fake.add_spot_price("us-east-1a", "p4d.24xlarge", 9.8)
    (o, *_) = by_zone(provider.offerings(), "p4d.24xlarge").values()
    assert o.interconnect.fabric is Fabric.EFA
    provider.launch(gang_request(o, tags={"spotd-job": "j-aws", "spotd-attempt": "3"}))
    (params,) = env.fake.params("RunInstances")
    assert params["MinCount"] == params["MaxCount"] == 2
    script = base64.b64decode(params["UserData"]).decode()
    gang = script_env(script)
    assert_gang_env(gang, Fabric.EFA)
    # p4d has EFA with RDMA read: the table's row for its family applies.
    assert gang["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert "the-daemon-token" not in script


# -- gangs: placement group, EFA interfaces, security group ----------------------------

GANG_TAGS = {"spotd-job": "j-aws", "spotd-attempt": "3", "spotd-owner": "d1"}


def p5_offering(env: Env, provider: AwsProvider, zone: str = "us-east-1a") -> Offering:
    env.fake.add_spot_price(zone, "p5.48xlarge", 31.5)
    return by_zone(provider.offerings(), "p5.48xlarge")[zone]


def _operations(env: Env) -> list[str]:
    return [op for op, _ in env.fake.calls]


def _unhooked() -> Any:
    return boto3.client("ec2", region_name=EAST)


def _default_subnet(zone: str) -> str:
    subnets = _unhooked().describe_subnets(Filters=[
        {"Name": "availability-zone", "Values": [zone]},
        {"Name": "default-for-az", "Values": ["true"]},
    ])["Subnets"]  # fmt: skip
    return str(subnets[0]["SubnetId"])


def _group_id(name: str) -> str:
    found = _unhooked().describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [name]}]
    )["SecurityGroups"]
    return str(found[0]["GroupId"])


def test_placement_group_names_are_safe_and_within_aws_limits() -> None:
    assert group_name(GANG_TAGS) == "spotd-j-aws-3"
    assert group_name({"spotd-job": "j/ü x", "spotd-attempt": "2"}) == "spotd-j-x-2"
    long = group_name({"spotd-job": "j" * 400, "spotd-attempt": "1"})
    other = group_name({"spotd-job": "j" * 400 + "k", "spotd-attempt": "1"})
    assert len(long) == MAX_NAME and long.isascii() and long != other


def test_a_gang_gets_its_placement_group_first_and_launches_into_it(env: Env) -> None:
    provider = env.provider(instance_types=["p5.48xlarge"])
    offer = p5_offering(env, provider)
    nodes = provider.launch(request(offer, nodes=4))
    assert len(nodes) == 4
    ops = _operations(env)
    assert ops.index("CreatePlacementGroup") < ops.index("RunInstances")
    (create,) = env.fake.params("CreatePlacementGroup")
    assert create["GroupName"] == "spotd-j-aws-3" and create["Strategy"] == "cluster"
    (spec,) = create["TagSpecifications"]
    assert spec["ResourceType"] == "placement-group"
    assert {t["Key"]: t["Value"] for t in spec["Tags"]} == GANG_TAGS
    (params,) = env.fake.params("RunInstances")
    assert params["MinCount"] == params["MaxCount"] == 4  # all or nothing, one call
    assert params["Placement"] == {"AvailabilityZone": "us-east-1a", "GroupName": "spotd-j-aws-3"}
    (placement,) = provider.list_placements({"spotd-job": "j-aws"})
    assert placement.id == f"{EAST}/spotd-j-aws-3" and placement.region == EAST
    assert placement.kind == "placement-group" and placement.tags == GANG_TAGS


def _nic(card: int, device: int, kind: str, subnet: str, groups: list[str]) -> dict[str, Any]:
    return {"NetworkCardIndex": card, "DeviceIndex": device, "InterfaceType": kind,
            "SubnetId": subnet, "Groups": groups, "DeleteOnTermination": True}  # fmt: skip


def test_efa_interfaces_of_a_p5_follow_the_guide(env: Env) -> None:
    provider = env.provider(instance_types=["p5.48xlarge"])
    provider.launch(request(p5_offering(env, provider), nodes=4))
    (params,) = env.fake.params("RunInstances")
    # With interfaces the subnet and groups go into each one: EC2 refuses both.
    assert "SubnetId" not in params and "SecurityGroupIds" not in params
    groups = [_group_id("default"), _group_id("spotd-gang")]
    subnet = _default_subnet("us-east-1a")
    # An ENA primary, card 0's EFA-only at device 1, one EFA-only per further card.
    assert params["NetworkInterfaces"] == [
        _nic(0, 0, "interface", subnet, groups), _nic(0, 1, "efa-only", subnet, groups),
        *(_nic(card, 0, "efa-only", subnet, groups) for card in range(1, 32)),
    ]  # fmt: skip


def test_efa_interfaces_of_a_p4d_follow_the_table(env: Env) -> None:
    provider = env.provider(instance_types=["p4d.24xlarge"])
    env.fake.add_spot_price("us-east-1a", "p4d.24xlarge", 9.8)
    provider.launch(request(by_zone(provider.offerings(), "p4d.24xlarge")["us-east-1a"], nodes=2))
    (params,) = env.fake.params("RunInstances")
    layout = [(n["NetworkCardIndex"], n["DeviceIndex"], n["InterfaceType"])
              for n in params["NetworkInterfaces"]]  # fmt: skip
    assert layout == [(0, 0, "interface"), (0, 1, "efa-only"), (1, 0, "efa-only"),
                      (2, 0, "efa-only"), (3, 0, "efa-only")]  # fmt: skip
    assert EFA_LAYOUTS["p4d.24xlarge"].efa_interfaces == 4


@pytest.mark.parametrize("itype", sorted(EFA_LAYOUTS))
def test_the_efa_table_matches_what_ec2_says(env: Env, itype: str) -> None:
    """moto carries EC2's own instance type data: the table agrees with it."""
    facts = network_facts(env.session.client("ec2", region_name=EAST), itype)
    assert table_drift(facts) is None
    nics = efa_interfaces(facts, "subnet-1", ["sg-1"])
    efa = [n for n in nics if n["InterfaceType"] == "efa-only"]
    assert len(efa) == facts.max_efa_interfaces  # every EFA the type allows
    assert len({n["NetworkCardIndex"] for n in efa}) == len(efa)  # one per card
    assert (nics[0]["NetworkCardIndex"], nics[0]["DeviceIndex"], nics[0]["InterfaceType"]) \
        == (0, 0, "interface")  # fmt: skip


def test_a_p6_b300_keeps_card_0_for_ena(env: Env) -> None:
    facts = network_facts(env.session.client("ec2", region_name=EAST), "p6-b300.48xlarge")
    nics = efa_interfaces(facts, "subnet-1", ["sg-1"])
    assert [(n["NetworkCardIndex"], n["DeviceIndex"]) for n in nics] == \
        [(0, 0), *((card, 0) for card in range(1, 17))]  # fmt: skip


@pytest.mark.parametrize("itype", ["g6e.24xlarge", "g5.xlarge"])
def test_types_outside_the_table_follow_the_same_rule_from_the_api(env: Env, itype: str) -> None:
    (row,) = _unhooked().describe_instance_types(InstanceTypes=[itype])["InstanceTypes"]
    info = row["NetworkInfo"]
    wanted = info["EfaInfo"]["MaximumEfaInterfaces"] if info.get("EfaSupported") else 0
    nics = efa_interfaces(network_facts(env.session.client("ec2", region_name=EAST), itype),
                          "subnet-1", ["sg-1"])  # fmt: skip
    assert itype not in EFA_LAYOUTS
    assert len([n for n in nics if n["InterfaceType"] == "efa-only"]) == wanted
    assert len(nics) == (wanted + 1 if wanted else 0)


def test_a_table_out_of_step_with_ec2_is_named() -> None:
    facts = NetworkFacts("p5.48xlarge", 192, max_efa_interfaces=16, network_cards=16,
                         efa_cards=tuple(EfaCard(i, i != 3) for i in range(16)))  # fmt: skip
    drift = table_drift(facts)
    assert drift is not None
    assert "16 network cards, the table 32" in drift and "at most 16 EFAs" in drift
    assert "card(s) 3, 16" in drift  # 3 takes no EFA-only, 16 is not an EFA card


def test_the_gang_group_lets_members_reach_each_other_and_is_made_once(env: Env) -> None:
    provider = env.provider(instance_types=["p5.48xlarge"])
    offer = p5_offering(env, provider)
    provider.launch(request(offer, token="a", nodes=2))
    provider.launch(replace(request(offer, token="b", nodes=2),
                            tags={**GANG_TAGS, "spotd-attempt": "4"}))  # fmt: skip
    (group,) = _unhooked().describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["spotd-gang"]}])["SecurityGroups"]
    gid = group["GroupId"]

    def self_rule(rules: list[dict[str, Any]]) -> bool:
        return any(r["IpProtocol"] == "-1" and gid in {p["GroupId"] for p in r["UserIdGroupPairs"]}
                   for r in rules)  # fmt: skip

    assert self_rule(group["IpPermissions"]) and self_rule(group["IpPermissionsEgress"])
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    assert tags == {"Name": "spotd-gang", "spotd-owner": "d1", "spotd:purpose": "gang"}
    assert len(env.fake.params("CreateSecurityGroup")) == 1
    assert len(env.fake.params("CreatePlacementGroup")) == 2  # one per attempt


def test_a_named_gang_group_and_subnet_are_used_as_they_are(env: Env) -> None:
    ec2 = _unhooked()
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    named = ec2.create_security_group(GroupName="mine", Description="d", VpcId=vpc)["GroupId"]
    subnet = _default_subnet("us-east-1b")
    provider = env.provider(instance_types=["p4d.24xlarge"], subnet_ids={"us-east-1b": subnet},
                            security_group_ids=["sg-ops"], gang_security_group_ids={EAST: named})
    env.fake.add_spot_price("us-east-1b", "p4d.24xlarge", 9.8)
    offer = by_zone(provider.offerings(), "p4d.24xlarge")["us-east-1b"]
    provider.launch(request(offer, nodes=2))
    (params,) = env.fake.params("RunInstances")
    assert len(params["NetworkInterfaces"]) == 5  # ENA primary and 4 EFA-only
    assert {n["SubnetId"] for n in params["NetworkInterfaces"]} == {subnet}
    assert all(n["Groups"] == ["sg-ops", named] for n in params["NetworkInterfaces"])
    for op in ("CreateSecurityGroup", "AuthorizeSecurityGroupIngress"):
        assert env.fake.params(op) == []  # a named group is never changed


def test_a_gang_without_efa_still_gets_a_placement_group_and_the_gang_group(env: Env) -> None:
    provider = env.provider()
    provider.launch(request(g5_offering(env, provider), nodes=3))
    (params,) = env.fake.params("RunInstances")
    assert params["Placement"]["GroupName"] == "spotd-j-aws-3"
    assert "NetworkInterfaces" not in params
    assert params["SecurityGroupIds"] == [_group_id("default"), _group_id("spotd-gang")]


def test_a_single_node_makes_no_placement_group(env: Env) -> None:
    provider = env.provider(instance_types=["p5.48xlarge"])
    provider.launch(request(p5_offering(env, provider)))
    (params,) = env.fake.params("RunInstances")
    assert params["Placement"] == {"AvailabilityZone": "us-east-1a"}
    assert "NetworkInterfaces" not in params
    assert env.fake.params("CreatePlacementGroup") == []
    assert provider.list_placements({}) == []


def test_a_retried_gang_launch_finds_its_group(env: Env) -> None:
    _unhooked().create_placement_group(GroupName="spotd-j-aws-3", Strategy="cluster")
    provider = env.provider(instance_types=["p5.48xlarge"])
    assert len(provider.launch(request(p5_offering(env, provider), nodes=2))) == 2


def test_placements_in_use_are_retried_and_gone_ones_ignored(env: Env) -> None:
    provider = env.provider(instance_types=["p5.48xlarge"])
    ids = [n.id for n in provider.launch(request(p5_offering(env, provider), nodes=2))]
    placements = provider.list_placements({"spotd-owner": "d1"})
    with pytest.raises(ProviderUnavailable) as err:
        provider.delete_placements(placements)
    assert err.value.retryable and err.value.code == "InvalidPlacementGroup.InUse"
    provider.terminate(ids)
    provider.delete_placements(placements)
    provider.delete_placements(placements)  # already gone: ignored
    assert provider.list_placements({"spotd-owner": "d1"}) == []


def test_placements_are_listed_in_every_region(env: Env) -> None:
    images = {EAST: FakeAws.ami(EAST), WEST: FakeAws.ami(WEST)}
    provider = env.provider(regions=[EAST, WEST], image_id=images, instance_types=["p5.48xlarge"])
    env.fake.add_spot_price("us-west-2a", "p5.48xlarge", 30.0)
    env.fake.add_spot_price("us-east-1a", "p5.48xlarge", 30.0)
    offers = provider.offerings()
    west = next(o for o in offers if o.pool.zone == "us-west-2a")
    provider.launch(replace(request(west, token="w", nodes=2),
                            tags={**GANG_TAGS, "spotd-job": "j-west"}))  # fmt: skip
    (placement,) = provider.list_placements({"spotd-owner": "d1"})
    assert placement.id == f"{WEST}/spotd-j-west-3" and placement.region == WEST


def test_nodes_report_their_private_addresses(env: Env) -> None:
    provider = env.provider(instance_types=["p5.48xlarge"])
    nodes = provider.launch(request(p5_offering(env, provider), nodes=2))
    described = provider.describe([n.id for n in nodes])
    addresses = [i.private_address for i in described]
    assert all(addresses) and len(set(addresses)) == 2
    assert [n.private_address for n in nodes] == addresses  # the launch reply has them too


# -- check-cloud ---------------------------------------------------------------------


def way_out(zone: str, *, nat: bool, s3: bool = False) -> str:
    """Give the zone's default subnet a route table of its own, with a NAT gateway route
    and an S3 gateway endpoint if asked; the subnet's id."""
    ec2 = _unhooked()
    subnet = _default_subnet(zone)
    vpc = ec2.describe_subnets(SubnetIds=[subnet])["Subnets"][0]["VpcId"]
    table = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    ec2.associate_route_table(RouteTableId=table, SubnetId=subnet)
    if nat:
        eip = ec2.allocate_address(Domain="vpc")["AllocationId"]
        gateway = ec2.create_nat_gateway(SubnetId=subnet, AllocationId=eip)["NatGateway"]
        ec2.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0",
                         NatGatewayId=gateway["NatGatewayId"])  # fmt: skip
    if s3:
        ec2.create_vpc_endpoint(VpcId=vpc, ServiceName=f"com.amazonaws.{EAST}.s3",
                                VpcEndpointType="Gateway", RouteTableIds=[table])  # fmt: skip
    return subnet


def seed_check(env: Env) -> None:
    for zone in ("us-east-1a", "us-east-1b"):
        env.fake.scores[(zone, "p5.48xlarge")] = 7  # made up
    env.fake.quotas[(EAST, "L-C4BD4855")] = 1536.0  # made up: 8 p5 nodes
    way_out("us-east-1a", nat=True)  # EFA nodes get no public address: they need NAT


def gang_check_request(env: Env, provider: AwsProvider, zone: str = "us-east-1a") -> LaunchRequest:
    return request(p5_offering(env, provider, zone), token="j-aws-3", nodes=4)


def failing(check: CloudCheck) -> list[CheckOutcome]:
    return [o for o in check.outcomes if not o.ok]


def test_check_cloud_passes_every_check_and_creates_nothing(env: Env) -> None:
    seed_check(env)
    provider = env.provider(instance_types=["p5.48xlarge"])
    check = provider.check_cloud(gang_check_request(env, provider))
    assert failing(check) == [] and check.ok and check.provider == "aws"
    names = {o.name for o in check.outcomes}
    assert {"credentials", f"image {EAST}", "launch", "capacity", "quota L-C4BD4855",
            "permission ec2:CreatePlacementGroup",
            "permission ec2:TerminateInstances", "permission ec2:CreateSecurityGroup",
            "permission ec2:AuthorizeSecurityGroupIngress", "permission pricing:GetProducts",
            "permission ec2:DescribeInstances"} <= names  # fmt: skip
    by_name = {o.name: o for o in check.outcomes}
    assert "768" in by_name["quota L-C4BD4855"].detail  # 4 x 192 vCPUs
    assert by_name["capacity"].detail.startswith("spot placement score 7/10")
    assert by_name["launch"].detail.startswith("EC2 would accept")
    assert by_name["efa layout p5.48xlarge"].ok
    egress = by_name[f"egress subnet {_default_subnet('us-east-1a')}"]
    assert egress.ok and "NAT gateway nat-" in egress.detail and egress.unreachable == ()
    assert check.would_create == (
        f"cluster placement group spotd-j-aws-3 in {EAST}",
        f"security group spotd-gang in {_unhooked().describe_vpcs()['Vpcs'][0]['VpcId']} "
        "(all traffic between its members, in and out)",
        f"4 spot instance(s) p5.48xlarge in us-east-1a from {FakeAws.ami(EAST)}, each with its "
        "root volume and 32 EFA interfaces, in placement group spotd-j-aws-3",
    )
    # The launch was a dry run with the whole gang request: group and interfaces.
    dry = [p for p in env.fake.params("RunInstances") if p.get("DryRun")]
    assert len(dry) == 1 and dry[0]["Placement"]["GroupName"] == "spotd-j-aws-3"
    assert len(dry[0]["NetworkInterfaces"]) == 33 and dry[0]["MinCount"] == 4
    # Nothing was made: no group, no security group, no instance.
    assert provider.list_placements({}) == []
    assert not _unhooked().describe_security_groups(
        Filters=[{"Name": "group-name", "Values": ["spotd-gang"]}])["SecurityGroups"]
    assert _unhooked().describe_instances()["Reservations"] == []


def test_check_cloud_without_a_job_checks_the_account(env: Env) -> None:
    check = env.provider().check_cloud(None)
    assert failing(check) == [] and check.would_create == ()
    assert "permission ec2:RunInstances" in {o.name for o in check.outcomes}


@pytest.mark.parametrize(("inject", "name", "words"), [
    ("permission", "permission ec2:CreatePlacementGroup", "allow ec2:CreatePlacementGroup"),
    ("launch permission", "permission ec2:RunInstances", "allow ec2:RunInstances"),
    ("quota", "quota L-C4BD4855", "96 vCPUs"),
    ("image", f"image {EAST}", "does not exist"),
    ("capacity", "capacity", "InsufficientInstanceCapacity"),
    ("no score", "capacity", "no spot placement score"),
])  # fmt: skip
def test_check_cloud_names_each_injected_failure(
    env: Env, inject: str, name: str, words: str
) -> None:
    seed_check(env)
    overrides: dict[str, Any] = {"instance_types": ["p5.48xlarge"]}
    if inject == "image":
        overrides["image_id"] = {EAST: "ami-0000000000000dead"}
    provider = env.provider(**overrides)
    req = gang_check_request(env, provider)
    if inject == "permission":
        env.fake.fail_next("CreatePlacementGroup", "UnauthorizedOperation", 403)
    elif inject == "launch permission":
        env.fake.fail_next("RunInstances", "UnauthorizedOperation", 403)
    elif inject == "quota":
        env.fake.quotas[(EAST, "L-C4BD4855")] = 96.0
    elif inject == "capacity":
        env.fake.fail_next("RunInstances", "InsufficientInstanceCapacity", 500)
    elif inject == "no score":
        env.fake.scores.clear()
    check = provider.check_cloud(req)
    (bad,) = failing(check)
    assert bad.name == name and words in bad.detail, bad


def test_check_cloud_without_credentials_says_so_once(tmp_path: Path) -> None:
    with aws_env(tmp_path), mock_aws():
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.pop(key)
        check = _offline_provider(new_session()).check_cloud(None)
    (only,) = check.outcomes
    assert only.name == "credentials" and not only.ok and "NoCredentialsError" in only.detail


def egress_of(check: CloudCheck) -> CheckOutcome:
    (found,) = [o for o in check.outcomes if o.name.startswith("egress")]
    return found


ALL_THREE = (Reach.DAEMON, Reach.PACKAGE_INDEX, Reach.CHECKPOINT_STORE)


@pytest.mark.parametrize(("s3", "uri", "unreachable"), [
    (False, "s3://ckpt/j", ALL_THREE),
    (True, "s3://ckpt/j", (Reach.DAEMON, Reach.PACKAGE_INDEX)),
    (True, "gs://ckpt/j", ALL_THREE),  # the S3 endpoint serves S3 only
    (False, "/mnt/ckpt", (Reach.DAEMON, Reach.PACKAGE_INDEX)),  # nothing to reach
])  # fmt: skip
def test_efa_nodes_without_a_way_out_are_named_a_typed_finding(
    env: Env, s3: bool, uri: str, unreachable: tuple[Reach, ...]
) -> None:
    seed_check(env)
    subnet = way_out("us-east-1b", nat=False, s3=s3)
    provider = env.provider(instance_types=["p5.48xlarge"])
    req = replace(gang_check_request(env, provider, "us-east-1b"),
                  env={"SPOTD_CHECKPOINT_URI": uri})  # fmt: skip
    found = egress_of(provider.check_cloud(req))
    assert found.name == f"egress subnet {subnet}" and not found.ok
    assert found.unreachable == unreachable
    assert "NAT gateway" in found.detail  # the fix
    if s3 and uri.startswith("s3"):
        assert "S3 gateway endpoint vpce-" in found.detail


def test_a_lone_interface_in_a_public_subnet_needs_no_way_out(env: Env) -> None:
    provider = env.provider()
    found = egress_of(provider.check_cloud(request(g5_offering(env, provider))))
    assert found.ok and "public address" in found.detail


def test_nodes_told_to_have_no_public_address_ask_for_none(env: Env) -> None:
    provider = env.provider(public_address=False)
    provider.launch(request(g5_offering(env, provider)))
    (params,) = env.fake.params("RunInstances")
    assert "SubnetId" not in params and "SecurityGroupIds" not in params
    assert params["NetworkInterfaces"] == [{
        "DeviceIndex": 0, "SubnetId": _default_subnet("us-east-1a"),
        "DeleteOnTermination": True, "AssociatePublicIpAddress": False}]  # fmt: skip


@pytest.mark.parametrize("nat", [True, False])
def test_private_nodes_get_their_subnets_checked_with_or_without_a_job(
    env: Env, nat: bool
) -> None:
    subnet = way_out("us-east-1a", nat=nat)
    provider = env.provider(public_address=False, subnet_ids={"us-east-1a": subnet},
                            security_group_ids=[_group_id("default")])  # fmt: skip
    for req in (None, request(g5_offering(env, provider))):
        found = egress_of(provider.check_cloud(req))
        assert found.name == f"egress subnet {subnet}" and found.ok is nat
        assert found.unreachable == (() if nat else ALL_THREE)


@pytest.mark.parametrize(("itype", "market", "code"), [
    ("p5.48xlarge", Market.SPOT, "L-C4BD4855"), ("p5en.48xlarge", Market.SPOT, "L-C4BD4855"),
    ("p4d.24xlarge", Market.SPOT, "L-7212CCBC"), ("p5.48xlarge", Market.ON_DEMAND, "L-417A185B"),
    ("g6.48xlarge", Market.SPOT, "L-3819A6DF"), ("g5.xlarge", Market.ON_DEMAND, "L-DB2E81BA"),
])  # fmt: skip
def test_quota_codes_by_family_and_market(itype: str, market: Market, code: str) -> None:
    found = quota_for(itype, market)
    assert found is not None and found[0] == code
