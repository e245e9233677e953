"""The Azure adapter: the real azure-mgmt-compute client and httpx against the loopback fake.

Contract behaviour is in test_provider_contract.py; here is what is Azure's
own: price rows, paging, SKU restrictions, the spot fields of the PUT,
idempotent names, every ARM error code, rollback, and credential hygiene.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import (
    ClientAuthenticationError,
    ServiceRequestError,
    ServiceResponseTimeoutError,
)
from azure.identity import CredentialUnavailableError
from azure.mgmt.compute.models import VirtualMachineScaleSet
from fakes.azure_fake import (
    MADE_UP_ON_DEMAND,
    RESOURCE_GROUP,
    FakeAzure,
    SkuFixture,
    made_up_prices,
    price_row,
    unknown_fields,
)
from gang_support import assert_gang_env, gang_request, script_env
from harnesses.azure import FAKE_TOKEN, FakeCredential, bootstrap, make_provider, settings_for
from pydantic import ValidationError

from spotd.core.clock import ManualClock
from spotd.core.errors import (
    AuthError,
    CapacityError,
    ConfigError,
    InvalidRequestError,
    NotFoundError,
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
from spotd_azure import (
    AzureProvider,
    AzureSettings,
    RetailPrices,
    build_azure_provider,
    map_azure_errors,
    pick_prices,
)
from spotd_azure.clients import compute_client, is_loopback_http
from spotd_azure.offerings import offerings_of
from spotd_azure.permissions import ALL_ACTIONS
from spotd_azure.prices import PricePair, price_filter
from spotd_azure.scaleset import set_body, set_name
from spotd_azure.skus import SkuPlace
from spotd_azure.vms import vm_name

H100 = "Standard_ND96isr_H100_v5"
A100_1 = "Standard_NC24ads_A100_v4"
TAGS = {"spotd-job": "j-az", "spotd-attempt": "1"}


@pytest.fixture
def fake() -> Iterator[FakeAzure]:
    with FakeAzure() as f:
        yield f


@pytest.fixture
def provider(fake: FakeAzure) -> Iterator[AzureProvider]:
    p = make_provider(fake)
    yield p
    p.close()


def offering(provider: AzureProvider, size: str = A100_1, zone: str = "eastus-1") -> Offering:
    return next(o for o in provider.offerings()
                if o.pool.instance_type == size and o.pool.zone == zone)  # fmt: skip


def request(o: Offering, *, nodes: int = 1, token: str = "tok",
            market: Market = Market.SPOT) -> LaunchRequest:
    return LaunchRequest(
        offering=o, market=market, nodes=nodes, client_token=token, tags=TAGS,
        command=("python", "-m", "train"), env={"SPOTD_JOB_ID": "j-az"},
    )  # fmt: skip


# -- prices ---------------------------------------------------------------------


def test_price_rows_pick_linux_spot_and_on_demand() -> None:
    rows = made_up_prices("eastus", H100, 100.0)
    pair = pick_prices(rows, "eastus", H100)
    # Windows, Low Priority (cheaper than spot), DevTest and reservation rows are ignored.
    assert pair.spot == pytest.approx(30.0)
    assert pair.on_demand == pytest.approx(100.0)


def test_price_rows_of_other_sizes_regions_and_units_are_ignored() -> None:
    rows = [
        price_row("westus3", H100, 1.0),
        price_row("eastus", A100_1, 2.0),
        price_row("eastus", H100, 3.0, unit="1/Day"),
        price_row("eastus", H100, 0.0, sku_suffix=" Spot"),
    ]
    pair = pick_prices(rows, "eastus", H100)
    assert pair.spot is None and pair.on_demand is None


def test_a_changed_price_takes_the_newest_row() -> None:
    rows = [price_row("eastus", H100, 90.0, start="2025-01-01T00:00:00Z"),
            price_row("eastus", H100, 95.0, start="2026-03-01T00:00:00Z")]  # fmt: skip
    assert pick_prices(rows, "eastus", H100).on_demand == 95.0


def test_filter_quotes_values() -> None:
    text = price_filter("eastus", "Standard_X'1")
    assert "armRegionName eq 'eastus'" in text and "armSkuName eq 'Standard_X''1'" in text
    assert text.startswith("serviceName eq 'Virtual Machines'")


def test_prices_follow_next_page_link(fake: FakeAzure) -> None:
    fake.price_page_size = 2  # 7 rows of one size and region: 4 pages
    prices = RetailPrices(fake.url)
    pair = prices.prices("eastus", H100)
    assert pair.on_demand == MADE_UP_ON_DEMAND[H100]
    assert pair.spot == pytest.approx(MADE_UP_ON_DEMAND[H100] * 0.3)
    calls = fake.requests_of("GET", "/api/retail/prices")
    assert len(calls) == 4
    assert "armSkuName eq 'Standard_ND96isr_H100_v5'" in calls[0].query["$filter"]
    assert all(c.auth_scheme == "" for c in calls)  # the prices API gets no credentials
    prices.close()


def test_next_page_links_off_the_api_host_are_not_followed(fake: FakeAzure) -> None:
    fake.price_page_size = 2
    fake.link_base = fake.url.replace("127.0.0.1", "localhost")  # another host name
    with RetailPrices(fake.url) as prices:
        prices.prices("eastus", H100)
    assert len(fake.requests_of("GET", "/api/retail/prices")) == 1


def test_prices_are_cached_for_an_hour(fake: FakeAzure) -> None:
    clock = ManualClock(datetime(2026, 1, 5, tzinfo=UTC))
    prices = RetailPrices(fake.url, clock=clock)
    prices.prices("eastus", H100)
    first = len(fake.requests_of("GET", "/api/retail/prices"))
    clock.advance(3599.0)
    prices.prices("eastus", H100)
    assert len(fake.requests_of("GET", "/api/retail/prices")) == first
    clock.advance(2.0)
    prices.prices("eastus", H100)
    assert len(fake.requests_of("GET", "/api/retail/prices")) == 2 * first
    prices.close()


def test_a_failed_refresh_keeps_the_last_price(fake: FakeAzure) -> None:
    clock = ManualClock(datetime(2026, 1, 5, tzinfo=UTC))
    prices = RetailPrices(fake.url, clock=clock)
    before = prices.prices("eastus", H100)
    clock.advance(7200.0)
    fake.fail_next_prices(503)
    assert prices.prices("eastus", H100) == before
    prices.close()


@pytest.mark.parametrize(("status", "expected"), [(503, ProviderUnavailable),
                                                  (429, ThrottledError), (400, ProviderError)])
def test_price_errors_without_a_cache_raise(fake: FakeAzure, status: int,
                                            expected: type[ProviderError]) -> None:
    fake.fail_next_prices(status)
    with RetailPrices(fake.url) as prices, pytest.raises(expected) as err:
        prices.prices("eastus", H100)
    assert err.value.provider == "azure" and err.value.code == f"HTTP{status}"


# -- offerings --------------------------------------------------------------------


def test_offerings_leave_out_restricted_zones_and_regions(provider: AzureProvider,
                                                          fake: FakeAzure) -> None:
    pools = {(o.pool.instance_type, o.pool.zone) for o in provider.offerings()}
    h100 = {z for s, z in pools if s == H100}
    assert h100 == {"eastus-1", "eastus-2", "westus3-1", "westus3-2", "westus3-3"}
    assert {z for s, z in pools if s == "Standard_ND96asr_v4"} == {"eastus-1", "eastus-2"}
    assert not any(s == "Standard_D4s_v5" for s, _ in pools)  # no GPUs, not in the table
    filters = [r.query["$filter"] for r in fake.requests_of("GET", "/skus")]
    # eastus has 6 SKUs, 3 a page: the SDK follows nextLink once.
    assert filters == ["location eq 'eastus'"] * 2 + ["location eq 'westus3'"]


def test_offerings_take_gpu_facts_from_the_table(provider: AzureProvider) -> None:
    o = offering(provider, H100)
    assert (o.gpu, o.gpus_per_node, o.gpu_memory_gb) == ("H100", 8, 80)
    assert o.interconnect.fabric is Fabric.INFINIBAND and o.interconnect.gbps_per_gpu == 400
    assert o.spot_price == pytest.approx(MADE_UP_ON_DEMAND[H100] * 0.3)
    assert o.on_demand_price == MADE_UP_ON_DEMAND[H100]
    assert o.capacity is None and o.notice_seconds == 30


def test_sizes_without_spot_have_no_spot_price(provider: AzureProvider) -> None:
    o = offering(provider, "Standard_NC40ads_H100_v5")
    assert o.spot_price is None and o.on_demand_price == MADE_UP_ON_DEMAND[o.pool.instance_type]


def test_infiniband_size_without_rdma_is_taken_as_ethernet() -> None:
    with FakeAzure(skus=(SkuFixture(H100, "eastus", rdma=False),)) as f:
        p = make_provider(f, regions=["eastus"])
        assert all(o.interconnect.fabric is Fabric.ETHERNET for o in p.offerings())
        p.close()


def test_a_size_not_in_the_table_in_a_zoneless_region() -> None:
    place = SkuPlace("Standard_NewGPU_v9", "eastus", (), gpus=4, spot_capable=True, rdma=True)
    (o,) = offerings_of(place, PricePair(spot=1.0, on_demand=2.0))
    assert o.pool.zone == "eastus" and o.gpu == "unknown" and o.gpus_per_node == 4
    assert o.interconnect.fabric is Fabric.ETHERNET
    assert offerings_of(place, PricePair(spot=None, on_demand=None)) == []


def test_zoneless_pool_launches_without_zones() -> None:
    with FakeAzure(skus=(SkuFixture(A100_1, "eastus", zones=(), gpus=1, rdma=False),)) as f:
        p = make_provider(f, regions=["eastus"])
        (o,) = p.offerings()
        p.launch(request(o))
        assert "zones" not in (f.requests_of("PUT")[0].body or {})
        p.close()


def test_sizes_setting_limits_the_offerings(fake: FakeAzure) -> None:
    p = make_provider(fake, sizes=[A100_1])
    assert {o.pool.instance_type for o in p.offerings()} == {A100_1}
    p.close()


# -- launch -------------------------------------------------------------------------


def test_spot_launch_sends_spot_fields(provider: AzureProvider, fake: FakeAzure) -> None:
    (inst,) = provider.launch(request(offering(provider), token="spot-fields"))
    (put,) = fake.requests_of("PUT", "/virtualMachines/")
    body: dict[str, Any] = put.body or {}
    props = body["properties"]
    assert props["priority"] == "Spot" and props["evictionPolicy"] == "Delete"
    assert props["billingProfile"] == {"maxPrice": -1}
    assert body["zones"] == ["1"] and body["location"] == "eastus" and body["tags"] == TAGS
    assert props["hardwareProfile"]["vmSize"] == A100_1
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    nic = props["networkProfile"]["networkInterfaceConfigurations"][0]
    assert nic["properties"]["deleteOption"] == "Delete"
    subnet = nic["properties"]["ipConfigurations"][0]["properties"]["subnet"]["id"]
    assert subnet.endswith("/subnets/eastus")
    script = base64.b64decode(props["osProfile"]["customData"]).decode()
    assert "SPOTD_NODE_RANK=0" in script and f"SPOTD_INSTANCE_ID={inst.id}" in script
    assert "exec python -m train" in script
    assert put.auth_scheme == "Bearer"
    assert inst.state is InstanceState.RUNNING and inst.market is Market.SPOT
    assert inst.pool == Pool("azure", "eastus", "eastus-1", A100_1)


def test_on_demand_launch_is_regular_priority(provider: AzureProvider, fake: FakeAzure) -> None:
    (inst,) = provider.launch(request(offering(provider), market=Market.ON_DEMAND))
    props = (fake.requests_of("PUT", "/virtualMachines/")[0].body or {})["properties"]
    assert props["priority"] == "Regular"
    assert "evictionPolicy" not in props and "billingProfile" not in props
    assert inst.market is Market.ON_DEMAND


def test_names_come_from_token_and_rank(provider: AzureProvider) -> None:
    ids = [i.id for i in provider.launch(request(offering(provider), nodes=3, token="t-9"))]
    assert ids == [vm_name("t-9", r) for r in range(3)]
    for name in ids:
        assert len(name) <= 64 and name.replace("-", "").isalnum()


def test_relaunch_with_the_same_token_creates_nothing(provider: AzureProvider,
                                                      fake: FakeAzure) -> None:
    o = offering(provider)
    first = provider.launch(request(o, nodes=2, token="again"))
    again = provider.launch(request(o, nodes=2, token="again"))
    assert [i.id for i in again] == [i.id for i in first]
    assert len(fake.requests_of("PUT", "/virtualMachines/")) == 2


def test_relaunch_after_a_crash_creates_only_the_missing_node(provider: AzureProvider,
                                                              fake: FakeAzure) -> None:
    o = offering(provider)
    provider.launch(request(o, nodes=2, token="half"))
    with fake.lock:  # as if the first launch had died before its second PUT
        del fake.state.vms[vm_name("half", 1)]
    provider.launch(request(o, nodes=2, token="half"))
    puts = fake.requests_of("PUT", "/virtualMachines/")
    assert [p.path.rsplit("/", 1)[1] for p in puts[2:]] == [vm_name("half", 1)]


@pytest.mark.parametrize("via_operation", [True, False])
def test_partial_failure_deletes_every_node(provider: AzureProvider, fake: FakeAzure,
                                            via_operation: bool) -> None:
    fake.fail_next_put("AllocationFailed", via_operation=via_operation, after=1)
    with pytest.raises(CapacityError):
        provider.launch(request(offering(provider), nodes=3, token="partial"))
    assert fake.state.vms == {}
    deleted = {r.path.rsplit("/", 1)[1] for r in fake.requests_of("DELETE")}
    assert vm_name("partial", 0) in deleted
    assert provider.list_instances(TAGS) == []


def test_launch_outside_the_configured_regions_is_refused(fake: FakeAzure) -> None:
    p = make_provider(fake, subnet_id={"westus3": "/subnets/x"})
    with pytest.raises(ProviderError) as err:
        p.launch(request(offering(p)))
    assert err.value.code == "InvalidParameter" and not fake.requests_of("PUT")
    p.close()


def test_oversized_custom_data_is_refused_before_any_put(fake: FakeAzure) -> None:
    p = make_provider(fake)
    p._custom_data = lambda _r: "x" * 70000
    with pytest.raises(InvalidRequestError) as err:
        p.launch(request(offering(p)))
    assert err.value.code == "InvalidParameter" and not fake.requests_of("PUT")
    p.close()


# -- errors -----------------------------------------------------------------------

ERROR_CASES = [
    ("SkuNotAvailable", 409, False, CapacityError),
    ("AllocationFailed", 200, True, CapacityError),
    ("ZonalAllocationFailed", 200, True, CapacityError),
    ("OverconstrainedAllocationRequest", 200, True, CapacityError),
    ("OverconstrainedZonalAllocationRequest", 400, False, CapacityError),
    ("OperationNotAllowed", 409, False, QuotaError),
    ("QuotaExceeded", 409, False, QuotaError),
    ("LowPriorityCoreQuotaExceeded", 409, False, QuotaError),
    ("TooManyRequests", 429, False, ThrottledError),
    ("SubscriptionRequestsThrottled", 429, False, ThrottledError),
    ("AuthorizationFailed", 403, False, AuthError),
    ("InvalidAuthenticationToken", 401, False, AuthError),
    ("InternalServerError", 500, False, ProviderUnavailable),
    ("ServiceUnavailable", 503, False, ProviderUnavailable),
    ("ResourceGroupNotFound", 404, False, NotFoundError),
    ("NotFound", 404, False, NotFoundError),
    ("InvalidParameter", 400, False, ProviderError),
]


@pytest.mark.parametrize(("code", "status", "via_operation", "expected"), ERROR_CASES,
                         ids=[c[0] for c in ERROR_CASES])
def test_every_error_code_maps_to_its_class(provider: AzureProvider, fake: FakeAzure, code: str,
                                            status: int, via_operation: bool,
                                            expected: type[ProviderError]) -> None:
    o = offering(provider)
    fake.fail_next_put(code, status=status, via_operation=via_operation)
    with pytest.raises(ProviderError) as err:
        provider.launch(request(o, token=f"err-{code}"))
    assert type(err.value) is expected
    assert err.value.provider == "azure" and err.value.code == code
    assert code in str(err.value)


@pytest.mark.parametrize("via_operation", [True, False])
def test_codes_nested_in_details_count(provider: AzureProvider, fake: FakeAzure,
                                       via_operation: bool) -> None:
    fake.fail_next_put("BadRequest", status=400, via_operation=via_operation,
                       details=("QuotaExceeded",))  # fmt: skip
    with pytest.raises(QuotaError) as err:
        provider.launch(request(offering(provider), token="nested"))
    assert err.value.code == "QuotaExceeded"


@pytest.mark.parametrize(("exc", "expected"), [
    (ServiceRequestError("connection refused"), ProviderUnavailable),
    (ServiceResponseTimeoutError("read timed out"), ProviderUnavailable),
    (ClientAuthenticationError("no token"), AuthError),
    (CredentialUnavailableError("DefaultAzureCredential failed"), AuthError),
    (httpx.ConnectTimeout("timed out"), ProviderUnavailable),
])  # fmt: skip
def test_sdk_exceptions_without_a_response_map(exc: Exception,
                                               expected: type[ProviderError]) -> None:
    with pytest.raises(ProviderError) as err, map_azure_errors("test"):
        raise exc
    assert type(err.value) is expected and err.value.__cause__ is exc


def test_an_arm_endpoint_that_refuses_connections_is_unavailable(fake: FakeAzure) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = make_provider(fake, arm_endpoint=f"http://127.0.0.1:{port}")
    with pytest.raises(ProviderUnavailable):
        p.offerings()
    p.close()


def test_a_reply_the_sdk_cannot_read_is_unavailable(fake: FakeAzure) -> None:
    p = make_provider(fake)
    o = offering(p)
    (inst,) = p.launch(request(o))
    fake.garble_next(5)  # the SDK may retry a GET; every try reads the broken body
    with pytest.raises(ProviderUnavailable, match="unreadable reply"):
        p.describe([inst.id])
    fake.garble_next(5, body=b'{"properties": "not an object", "zones": 7}')
    with pytest.raises(ProviderUnavailable, match="unreadable reply"):
        p.describe([inst.id])
    p.close()


# -- state ------------------------------------------------------------------------


def test_eviction_reads_preempted_and_stays_listed(provider: AzureProvider,
                                                   fake: FakeAzure) -> None:
    (inst,) = provider.launch(request(offering(provider)))
    fake.evict(inst.id)
    (gone,) = provider.describe([inst.id])
    assert gone.state is InstanceState.PREEMPTED and gone.ended_at is not None
    assert [i.id for i in provider.list_instances(TAGS)] == [inst.id]


def test_deallocated_spot_vm_reads_preempted(provider: AzureProvider, fake: FakeAzure) -> None:
    (inst,) = provider.launch(request(offering(provider)))
    with fake.lock:
        fake.state.vms[inst.id]["properties"]["evictionPolicy"] = "Deallocate"
    fake.evict(inst.id)
    (found,) = provider.describe([inst.id])
    assert found.state is InstanceState.PREEMPTED


def test_on_demand_vm_deleted_elsewhere_reads_terminated(provider: AzureProvider,
                                                         fake: FakeAzure) -> None:
    (inst,) = provider.launch(request(offering(provider), market=Market.ON_DEMAND))
    with fake.lock:
        del fake.state.vms[inst.id]
    assert provider.describe([inst.id])[0].state is InstanceState.TERMINATED


def test_terminated_vm_reads_terminated_and_missing_ones_are_ignored(
    provider: AzureProvider, fake: FakeAzure
) -> None:
    (inst,) = provider.launch(request(offering(provider)))
    provider.terminate([inst.id])
    assert provider.describe([inst.id])[0].state is InstanceState.TERMINATED
    fake.missing_delete_status = 404
    provider.terminate([inst.id, vm_name("never", 0), "not-ours"])
    deletes = fake.requests_of("DELETE")
    assert len(deletes) == 3 and not any("not-ours" in d.path for d in deletes)


def test_a_new_process_does_not_know_vms_gone_before_it(fake: FakeAzure) -> None:
    first = make_provider(fake)
    (inst,) = first.launch(request(offering(first)))
    fake.evict(inst.id)
    second = make_provider(fake)
    assert second.describe([inst.id]) == []  # documented: the engine sees it as lost
    first.close()
    second.close()


def test_list_reads_every_page_and_filters_by_tag(provider: AzureProvider,
                                                  fake: FakeAzure) -> None:
    provider.launch(request(offering(provider), nodes=3, token="many"))
    with fake.lock:  # a VM of someone else in the same resource group
        fake.state.vms["build-agent"] = {"name": "build-agent", "location": "eastus",
                                         "tags": TAGS, "properties": {}}  # fmt: skip
    listed = provider.list_instances({"spotd-job": "j-az"})
    assert sorted(i.id for i in listed) == [vm_name("many", r) for r in range(3)]
    assert len(fake.requests_of("GET", f"/resourceGroups/{RESOURCE_GROUP}/providers/"
                                       "Microsoft.Compute/virtualMachines")) >= 2  # fmt: skip
    assert provider.list_instances({"spotd-job": "other"}) == []


def test_ids_not_ours_are_never_sent(provider: AzureProvider, fake: FakeAzure) -> None:
    assert provider.describe(["../../evil", "no-such-instance"]) == []
    assert not fake.requests_of("GET", "/virtualMachines/")


def test_logs_are_empty(provider: AzureProvider) -> None:
    assert provider.logs(vm_name("x", 0)) == ""


# -- settings and credentials --------------------------------------------------------


def test_no_token_in_errors_or_logs(provider: AzureProvider, fake: FakeAzure,
                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    o = offering(provider)
    provider.launch(request(o, token="ok"))
    messages = []
    for code, status, via_op, _ in ERROR_CASES:
        fake.fail_next_put(code, status=status, via_operation=via_op)
        with pytest.raises(ProviderError) as err:
            provider.launch(request(o, token=f"leak-{code}"))
        messages += [str(err.value), repr(err.value), repr(err.value.__cause__)]
    assert caplog.text  # the SDK did log its requests
    assert FAKE_TOKEN not in caplog.text
    assert not any(FAKE_TOKEN in m for m in messages)
    assert FAKE_TOKEN not in repr(provider)


def test_settings_hold_no_secrets() -> None:
    with pytest.raises(ValidationError):
        AzureSettings(client_secret="s3cret")  # type: ignore[call-arg]
    assert AzureSettings().enabled is False


def test_build_refuses_settings_that_cannot_launch() -> None:
    with pytest.raises(ConfigError) as err:
        build_azure_provider(AzureSettings(enabled=True), custom_data=bootstrap,
                             credential=FakeCredential())  # fmt: skip
    text = str(err.value)
    assert "subscription_id" in text and "subnet_id" in text and "ssh_public_key" in text


def test_built_provider_talks_to_a_loopback_fake(fake: FakeAzure) -> None:
    p = build_azure_provider(settings_for(fake), custom_data=bootstrap,
                             credential=FakeCredential())  # fmt: skip
    assert p.offerings()
    assert fake.requests_of("GET", "/skus")[0].auth_scheme == "Bearer"
    p.close()


def test_plain_http_is_allowed_only_to_loopback() -> None:
    assert is_loopback_http("http://127.0.0.1:8080")
    assert is_loopback_http("http://localhost:1")
    assert not is_loopback_http("http://management.example.com")
    assert not is_loopback_http("https://127.0.0.1:8080")


def test_a_gangs_custom_data_carries_rendezvous_and_infiniband_variables(
    fake: FakeAzure,
) -> None:
    from spotd.daemon.bootstrap import bootstrap_for
    from spotd_azure.clients import compute_client

    settings = settings_for(fake)
    render = bootstrap_for("azure", daemon_url="https://d:8443", daemon_token="the-daemon-token")
    p = AzureProvider(settings, custom_data=render,
                      compute=compute_client(settings, FakeCredential(), polling_interval=0),
                      prices=RetailPrices(settings.prices_url))  # fmt: skip
    o = offering(p, "Standard_ND96asr_v4", "eastus-1")
    assert o.interconnect.fabric is Fabric.INFINIBAND
    p.launch(gang_request(o, tags=TAGS))
    # An InfiniBand gang is one scale set: one script for every node, which
    # learns its id from the metadata service and its rank from the roster.
    assert not fake.requests_of("PUT", "/virtualMachines/")
    (put,) = fake.requests_of("PUT", "/virtualMachineScaleSets/")
    profile = (put.body or {})["properties"]["virtualMachineProfile"]
    script = base64.b64decode(profile["osProfile"]["customData"])
    env = script_env(script.decode())
    assert_gang_env(env, Fabric.INFINIBAND)
    assert env["NCCL_IB_RETRY_CNT"] == "7" and env["NCCL_IB_HCA"] == "mlx5_ib"
    assert "SPOTD_NODE_RANK" not in env and "SPOTD_INSTANCE_ID" not in env
    assert b"the-daemon-token" not in script


# -- gangs in scale sets ------------------------------------------------------------


def gang(provider: AzureProvider, *, nodes: int = 4, token: str = "gang",
         market: Market = Market.SPOT) -> LaunchRequest:
    return request(offering(provider, H100, "eastus-1"), nodes=nodes, token=token, market=market)


def test_a_gang_is_one_scale_set_built_field_by_field(provider: AzureProvider,
                                                      fake: FakeAzure) -> None:
    nodes = provider.launch(gang(provider))
    name = set_name("gang")
    assert sorted(n.id for n in nodes) == sorted(f"{name}_{i}" for i in range(4))
    model = fake.set_model(name)  # the PUT body read with the SDK's VirtualMachineScaleSet
    assert isinstance(model, VirtualMachineScaleSet) and unknown_fields(model) == []
    assert model.location == "eastus" and model.zones == ["1"] and model.tags == TAGS
    assert model.sku is not None
    assert (model.sku.name, model.sku.tier, model.sku.capacity) == (H100, "Standard", 4)
    props = model.properties
    assert props is not None
    assert props.orchestration_mode == "Uniform" and props.single_placement_group is True
    assert props.overprovision is False and props.platform_fault_domain_count == 1
    assert props.upgrade_policy is not None and props.upgrade_policy.mode == "Manual"
    vm = props.virtual_machine_profile
    assert vm is not None and vm.priority == "Spot" and vm.eviction_policy == "Delete"
    assert vm.billing_profile is not None and vm.billing_profile.max_price == -1
    assert vm.storage_profile is not None and vm.storage_profile.image_reference is not None
    image = vm.storage_profile.image_reference
    assert (image.publisher, image.offer, image.sku, image.version) == (
        "microsoft-dsvm", "ubuntu-hpc", "2204", "latest")
    assert vm.os_profile is not None and vm.os_profile.computer_name_prefix == name[:-3]
    assert vm.os_profile.linux_configuration is not None
    assert vm.os_profile.linux_configuration.disable_password_authentication is True
    assert vm.network_profile is not None
    (nic,) = vm.network_profile.network_interface_configurations or []
    assert nic.properties is not None and nic.properties.enable_accelerated_networking is True
    (ip,) = nic.properties.ip_configurations or []
    assert ip.properties is not None and ip.properties.subnet is not None
    assert (ip.properties.subnet.id or "").endswith("/subnets/eastus")
    for node in nodes:
        assert node.market is Market.SPOT and node.state is InstanceState.RUNNING
        assert node.pool == Pool("azure", "eastus", "eastus-1", H100) and node.tags == TAGS
        assert node.private_address and node.private_address.startswith("10.1.")


def test_an_on_demand_gang_is_regular_priority(provider: AzureProvider, fake: FakeAzure) -> None:
    provider.launch(gang(provider, market=Market.ON_DEMAND, token="od"))
    model = fake.set_model(set_name("od"))
    assert model is not None and model.properties is not None
    vm = model.properties.virtual_machine_profile
    assert vm is not None and vm.priority == "Regular"
    assert vm.eviction_policy is None and vm.billing_profile is None


def test_a_misspelt_field_is_refused_by_the_fake(provider: AzureProvider) -> None:
    o = offering(provider, H100, "eastus-1")
    body = set_body(provider._settings, o.pool, market=Market.SPOT, name=set_name("typo"),
                    nodes=2, tags=TAGS, custom_data="")  # fmt: skip
    assert unknown_fields(VirtualMachineScaleSet(body.as_dict())) == []
    body["properties"]["singlePlacementGroupp"] = True
    assert unknown_fields(VirtualMachineScaleSet(body.as_dict())) == [
        "properties.singlePlacementGroupp"]
    with pytest.raises(ProviderError) as err, map_azure_errors("create"):
        provider._compute.virtual_machine_scale_sets.begin_create_or_update(
            RESOURCE_GROUP, set_name("typo"), body).result()
    assert err.value.code == "InvalidRequestContent"


def test_a_gang_relaunch_puts_nothing_new(provider: AzureProvider, fake: FakeAzure) -> None:
    first = provider.launch(gang(provider, token="again"))
    again = provider.launch(gang(provider, token="again"))
    assert [n.id for n in again] == [n.id for n in first]
    assert len(fake.requests_of("PUT", "/virtualMachineScaleSets/")) == 1


@pytest.mark.parametrize("code", ["AllocationFailed", "ZonalAllocationFailed"])
def test_a_gang_short_of_capacity_is_deleted_whole(provider: AzureProvider, fake: FakeAzure,
                                                   code: str) -> None:
    fake.fail_next_put(code, status=200, via_operation=True)
    with pytest.raises(CapacityError) as err:
        provider.launch(gang(provider, token="short"))
    assert err.value.code == code
    assert fake.scale_set(set_name("short")) is None  # deleted with the VMs it had
    assert provider.list_instances(TAGS) == [] and provider.list_placements(TAGS) == []


def test_a_set_that_ends_with_fewer_vms_is_a_capacity_error(provider: AzureProvider,
                                                            fake: FakeAzure) -> None:
    fake.short_next_set(3)
    with pytest.raises(CapacityError) as err:
        provider.launch(gang(provider, token="three"))
    assert err.value.code == "ScaleSetShortOfCapacity"
    assert fake.scale_set(set_name("three")) is None


def test_a_quota_refusal_of_a_gang_leaves_nothing(provider: AzureProvider,
                                                  fake: FakeAzure) -> None:
    fake.fail_next_put("OperationNotAllowed", status=409)
    with pytest.raises(QuotaError):
        provider.launch(gang(provider, token="quota"))
    assert fake.scale_set(set_name("quota")) is None


def test_gang_members_are_evicted_terminated_and_listed(provider: AzureProvider,
                                                        fake: FakeAzure) -> None:
    ids = [n.id for n in provider.launch(gang(provider, token="life"))]
    fake.evict(ids[0])
    provider.terminate(ids[1:2])
    states = {i.id: i.state for i in provider.describe(ids)}
    assert states[ids[0]] is InstanceState.PREEMPTED
    assert states[ids[1]] is InstanceState.TERMINATED
    assert states[ids[2]] is InstanceState.RUNNING
    (post,) = fake.requests_of("POST", "/delete")
    assert post.body == {"instanceIds": [ids[1].rsplit("_", 1)[1]]}
    assert sorted(i.id for i in provider.list_instances(TAGS)) == sorted(ids)
    assert provider.describe([f"{set_name('life')}_../x", "spotd-x_1"]) == []


def test_placements_are_the_tagged_scale_sets(provider: AzureProvider, fake: FakeAzure) -> None:
    provider.launch(gang(provider, token="p1"))
    (placement,) = provider.list_placements({"spotd-job": "j-az"})
    assert placement.kind == "vm-scale-set" and placement.region == "eastus"
    assert placement.id == f"eastus/{set_name('p1')}" and placement.tags == TAGS
    assert provider.list_placements({"spotd-job": "other"}) == []
    provider.delete_placements([placement])
    assert fake.scale_set(set_name("p1")) is None and fake.members(set_name("p1")) == []
    provider.delete_placements([placement])  # gone: ignored


# -- check-cloud ----------------------------------------------------------------------


def failures(check: CloudCheck) -> list[CheckOutcome]:
    return [o for o in check.outcomes if not o.ok]


def test_check_cloud_passes_every_check_and_creates_nothing(provider: AzureProvider,
                                                            fake: FakeAzure) -> None:
    check = provider.check_cloud(gang(provider, token="chk"))
    assert check.ok, failures(check)
    names = [o.name for o in check.outcomes]
    assert names[0] == "credentials"
    assert "permissions on resource group spotd-test" in names
    assert "permissions on subnet of eastus" in names
    assert f"sku {H100} in eastus-1" in names and "quota lowPriorityCores in eastus" in names
    assert "image microsoft-dsvm/ubuntu-hpc/2204/latest in eastus" in names
    assert names[-2:] == ["request", "egress subnet eastus"]
    egress = check.outcomes[-1]
    assert egress.ok and "NAT gateway nat" in egress.detail and egress.unreachable == ()
    (line,) = check.would_create
    assert set_name("chk") in line and "4 x Standard_ND96isr_H100_v5" in line
    assert not fake.requests_of("PUT") and not fake.requests_of("DELETE")
    assert not fake.requests_of("POST")


def test_check_cloud_without_a_request(provider: AzureProvider) -> None:
    check = provider.check_cloud(None)
    assert check.ok and check.would_create == ()
    assert {o.name for o in check.outcomes} >= {
        "credentials", "image microsoft-dsvm/ubuntu-hpc/2204/latest in westus3"}


ALL_THREE = (Reach.DAEMON, Reach.PACKAGE_INDEX, Reach.CHECKPOINT_STORE)
PRIVATE: dict[str, Any] = {"addressPrefix": "10.0.0.0/24", "defaultOutboundAccess": False}


@pytest.mark.parametrize(("endpoint", "uri", "unreachable"), [
    (False, "az://ckpt/j", ALL_THREE),
    (True, "az://ckpt/j", (Reach.DAEMON, Reach.PACKAGE_INDEX)),
    (True, "s3://ckpt/j", ALL_THREE),  # the storage endpoint serves Azure Storage only
])  # fmt: skip
def test_a_private_subnet_without_nat_is_a_typed_finding(
    provider: AzureProvider, fake: FakeAzure, endpoint: bool, uri: str,
    unreachable: tuple[Reach, ...],
) -> None:
    fake.subnets["eastus"] = {**PRIVATE, "serviceEndpoints": (
        [{"service": "Microsoft.Storage", "locations": ["eastus"]}] if endpoint else [])}
    check = provider.check_cloud(replace(gang(provider), env={"SPOTD_CHECKPOINT_URI": uri}))
    (bad,) = failures(check)
    assert bad.name == "egress subnet eastus" and bad.unreachable == unreachable
    assert "NAT gateway" in bad.detail
    # Without a job every configured subnet is read (westus3's has its NAT gateway), and
    # the store is taken to be Azure Storage.
    (bad,) = failures(provider.check_cloud(None))
    assert bad.name == "egress subnet eastus"
    assert bad.unreachable == ((Reach.DAEMON, Reach.PACKAGE_INDEX) if endpoint else ALL_THREE)


def test_other_ways_out_of_a_subnet(provider: AzureProvider, fake: FakeAzure) -> None:
    table = ("/subscriptions/s/resourceGroups/net/providers/Microsoft.Network/"
             "routeTables/to-firewall")  # fmt: skip
    fake.route_tables["to-firewall"] = {"routes": [{"name": "out", "properties": {
        "addressPrefix": "0.0.0.0/0", "nextHopType": "VirtualAppliance",
        "nextHopIpAddress": "10.9.0.4"}}]}  # fmt: skip
    fake.subnets["eastus"] = {**PRIVATE, "routeTable": {"id": table}}
    fake.subnets["westus3"] = {"addressPrefix": "10.1.0.0/24"}  # default outbound access
    by_name = {o.name: o for o in provider.check_cloud(None).outcomes}
    assert by_name["egress subnet eastus"].ok
    assert "appliance 10.9.0.4 (route table to-firewall" in by_name["egress subnet eastus"].detail
    assert by_name["egress subnet westus3"].ok
    assert "retiring" in by_name["egress subnet westus3"].detail


def test_check_cloud_names_a_missing_permission(provider: AzureProvider,
                                                fake: FakeAzure) -> None:
    fake.denied = {"Microsoft.Compute/virtualMachineScaleSets/write"}
    (bad,) = failures(provider.check_cloud(gang(provider)))
    assert bad.name == "permission Microsoft.Compute/virtualMachineScaleSets/write"
    assert "resource group spotd-test" in bad.detail


def test_check_cloud_names_the_quota(provider: AzureProvider, fake: FakeAzure) -> None:
    fake.usages["lowPriorityCores"] = (100, 300)
    (bad,) = failures(provider.check_cloud(gang(provider)))
    assert bad.name == "quota lowPriorityCores in eastus"
    assert bad.detail == "384 vCPUs needed (4 x 96), 200 of 300 free"
    od = provider.check_cloud(gang(provider, market=Market.ON_DEMAND))
    assert od.ok, failures(od)  # on-demand counts the family and regional quotas instead


def test_check_cloud_names_an_unknown_image(provider: AzureProvider, fake: FakeAzure) -> None:
    fake.images = set()
    (bad,) = failures(provider.check_cloud(gang(provider)))
    assert bad.name == "image microsoft-dsvm/ubuntu-hpc/2204/latest in eastus"
    p = make_provider(fake, image={"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc",
                                   "sku": "2204", "version": "9.9.9"})  # fmt: skip
    (bad,) = failures(p.check_cloud(gang(p)))
    assert bad.name.startswith("image ") and "ImageNotFound" in bad.detail
    p.close()


def test_check_cloud_names_a_restricted_zone(provider: AzureProvider) -> None:
    # Capacity the subscription cannot get: H100 is NotAvailableForSubscription in eastus-3.
    o = offering(provider, H100, "eastus-1")
    zone3 = replace(o, pool=replace(o.pool, zone="eastus-3"))
    (bad,) = failures(provider.check_cloud(request(zone3, nodes=4)))
    assert bad.name == f"sku {H100} in eastus-3"
    assert bad.detail == "restricted in zone 3: NotAvailableForSubscription"


def test_check_cloud_stops_at_credentials(fake: FakeAzure) -> None:
    class NoToken:
        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            raise CredentialUnavailableError("DefaultAzureCredential failed")

    settings = settings_for(fake)
    p = AzureProvider(settings, custom_data=bootstrap,
                      compute=compute_client(settings, NoToken(), polling_interval=0),
                      prices=RetailPrices(settings.prices_url))  # fmt: skip
    check = p.check_cloud(None)
    (only,) = check.outcomes
    assert only.name == "credentials" and not only.ok and "CredentialUnavailable" in only.detail
    assert not fake.requests_of("GET")
    p.close()


def test_the_documented_role_has_every_action() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "providers-azure.md").read_text()
    role = json.loads(doc.split("```json\n", 1)[1].split("```", 1)[0])
    assert sorted(role["Actions"]) == sorted(ALL_ACTIONS)
