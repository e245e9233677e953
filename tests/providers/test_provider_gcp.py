"""GCP-specific tests: the real compute_v1 / billing_v1 REST clients against the loopback fake.

Expected prices are computed here from the fake's (made-up) SKU table, never
copied from the adapter.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
from fakes.gcp_fake import LOCATIONS, MACHINE_TYPES, PRICES, PROJECT, GcpFake, gpu_networks_config
from gang_support import assert_gang_env, gang_request, script_env
from google.api_core import exceptions as gexc
from google.auth import exceptions as gauth_exc
from google.cloud import compute_v1
from google.oauth2.credentials import Credentials
from harnesses.gcp import bootstrap, provider_for, settings_for
from pydantic import ValidationError

from spotd.core.clock import ManualClock
from spotd.core.contracts import CloudChecker
from spotd.core.errors import (
    AuthError,
    CapacityError,
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
    PlacementObject,
    Reach,
)
from spotd.daemon.bootstrap import bootstrap_for
from spotd_gcp import GcpProvider, GcpSettings, build_gcp_provider, machines, map_gcp_errors, naming
from spotd_gcp import check as gcp_check
from spotd_gcp import errors as gcp_errors

SECRET = "ya29.NOT-A-REAL-TOKEN-but-secret-7f3a9c"


@pytest.fixture
def fake() -> Iterator[GcpFake]:
    server = GcpFake()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def provider(fake: GcpFake) -> GcpProvider:
    return provider_for(fake)


def offering(p: GcpProvider, zone: str, machine: str) -> Offering:
    return next(
        o for o in p.offerings() if o.pool.zone == zone and o.pool.instance_type == machine
    )


def request(o: Offering, token: str = "tok", nodes: int = 1, market: Market = Market.SPOT,
            tags: dict[str, str] | None = None) -> LaunchRequest:
    return LaunchRequest(
        offering=o, market=market, nodes=nodes, client_token=token,
        tags=tags if tags is not None else {"spotd-job": "j1"},
        command=("python", "train.py"), env={},
    )


def expected_price(machine: str, location: str, market: Market) -> float:
    """GPU x count + core x vCPUs + RAM x GiB, from the fake's own price table."""
    cpus, memory_mb, accel, gpus = MACHINE_TYPES[machine]
    family = machine.split("-", maxsplit=1)[0].upper()
    gpu_text = {
        "nvidia-tesla-a100": "Nvidia Tesla A100 GPU", "nvidia-h100-80gb": "Nvidia H100 80GB GPU",
        "nvidia-a100-80gb": "Nvidia Tesla A100 80GB GPU", "nvidia-l4": "Nvidia L4 GPU",
    }[str(accel)]
    column = 1 if market is Market.SPOT else 0
    table = PRICES[location]
    return (
        table[(gpu_text, "GPU")][column] * gpus
        + table[(f"{family} Instance Core", "CPU")][column] * cpus
        + table[(f"{family} Instance Ram", "RAM")][column] * memory_mb / 1024
    )


# -- prices and offerings ------------------------------------------------------


@pytest.mark.parametrize(("zone", "machine", "location"), [
    ("us-central1-a", "a2-highgpu-8g", "Americas"),
    ("us-central1-a", "a2-highgpu-1g", "Americas"),
    ("europe-west4-a", "a2-highgpu-8g", "Netherlands"),
    ("us-east4-a", "a3-highgpu-8g", "Americas"),
    ("us-central1-a", "a2-ultragpu-8g", "Americas"),
    ("us-central1-b", "g2-standard-4", "Americas"),
])
def test_price_is_gpu_plus_core_plus_ram(
    provider: GcpProvider, zone: str, machine: str, location: str
) -> None:
    o = offering(provider, zone, machine)
    assert o.on_demand_price == pytest.approx(expected_price(machine, location, Market.ON_DEMAND))
    assert o.spot_price == pytest.approx(expected_price(machine, location, Market.SPOT))


def test_spot_uses_preemptible_skus_and_is_cheaper(provider: GcpProvider) -> None:
    for o in provider.offerings():
        if o.spot_price is not None and o.on_demand_price is not None:
            assert o.spot_price < o.on_demand_price


def test_decoy_skus_are_ignored(provider: GcpProvider) -> None:
    # The fake also sells a "DWS Defined Duration" H100 and a commitment A100 at tiny prices.
    o = offering(provider, "us-east4-a", "a3-highgpu-8g")
    assert o.on_demand_price == pytest.approx(
        expected_price("a3-highgpu-8g", "Americas", Market.ON_DEMAND))


def test_missing_sku_gives_no_price(fake: GcpFake, provider: GcpProvider) -> None:
    fake.skus = [s for s in fake.skus if "H200" not in s["description"]]
    o = offering(provider, "us-east4-a", "a3-ultragpu-8g")
    assert o.spot_price is None and o.on_demand_price is None
    assert o.gpu == "H200" and o.gpus_per_node == 8


def test_offerings_facts(provider: GcpProvider) -> None:
    offers = provider.offerings()
    names = {o.pool.instance_type for o in offers}
    assert "n2-standard-8" not in names and "e2-medium" not in names  # no GPUs
    a3 = offering(provider, "us-east4-a", "a3-highgpu-8g")
    assert (a3.gpu, a3.gpus_per_node, a3.gpu_memory_gb) == ("H100", 8, 80)
    assert a3.interconnect.fabric is Fabric.TCPX
    assert a3.pool.region == "us-east4" and a3.pool.provider == "gcp"
    mega = offering(provider, "us-central1-b", "a3-megagpu-8g")
    assert mega.gpu == "H100" and mega.interconnect.fabric is Fabric.TCPXO
    assert offering(provider, "us-central1-b", "g2-standard-4").gpu == "L4"
    assert offering(provider, "us-east4-a", "a3-ultragpu-8g").gpu == "H200"
    assert all(o.capacity is None and o.notice_seconds == 30 for o in offers)


def test_machine_types_setting_limits_offerings(fake: GcpFake) -> None:
    p = provider_for(fake, machine_types=["g2-standard-4"])
    assert {o.pool.instance_type for o in p.offerings()} == {"g2-standard-4"}


def test_unknown_zone_is_skipped(fake: GcpFake) -> None:
    p = provider_for(fake, zones=["asia-east1-a", "us-central1-b"])
    assert {o.pool.zone for o in p.offerings()} == {"us-central1-b"}


def test_skus_and_machine_types_are_paged(fake: GcpFake, provider: GcpProvider) -> None:
    provider.offerings()
    sku_calls = fake.recorded("GET", "/skus")
    assert len(sku_calls) == -(-len(fake.skus) // fake.sku_page_size) > 1
    assert all(c.query.get("currencyCode") == "USD" for c in sku_calls)
    assert [c.query.get("pageToken") for c in sku_calls][1:] == [
        str(i * fake.sku_page_size) for i in range(1, len(sku_calls))]
    zone_a = fake.recorded("GET", "/zones/us-central1-a/machineTypes")
    assert len(zone_a) == 3  # 8 types, 3 a page


def test_catalog_is_cached_for_hours(fake: GcpFake) -> None:
    clock = ManualClock(datetime(2026, 1, 5, tzinfo=UTC))
    p = GcpProvider(settings_for(fake, catalog_ttl_hours=6), startup_script=bootstrap,
                    credentials=_anon(), clock=clock)
    p.offerings()
    pages = len(fake.recorded("GET", "/skus"))
    clock.advance(5 * 3600.0)
    p.offerings()
    assert len(fake.recorded("GET", "/skus")) == pages
    clock.advance(2 * 3600.0)
    p.offerings()
    assert len(fake.recorded("GET", "/skus")) == 2 * pages


def test_stale_catalog_is_kept_when_a_refresh_fails(fake: GcpFake) -> None:
    clock = ManualClock(datetime(2026, 1, 5, tzinfo=UTC))
    p = GcpProvider(settings_for(fake), startup_script=bootstrap, credentials=_anon(),
                    clock=clock)
    before = offering(p, "us-central1-a", "a2-highgpu-8g").spot_price
    clock.advance(10 * 3600.0)
    fake.fail_next("GET", r"/skus$", 503, "backendError")
    assert offering(p, "us-central1-a", "a2-highgpu-8g").spot_price == before


# -- launch --------------------------------------------------------------------


def test_spot_scheduling_and_metadata_are_sent(fake: GcpFake, provider: GcpProvider) -> None:
    o = offering(provider, "us-central1-a", "a2-highgpu-1g")
    req = request(o)
    provider.launch(req)
    (insert,) = fake.recorded("POST", "/zones/us-central1-a/instances")
    body = insert.body
    assert body is not None
    assert body["scheduling"] == {
        "provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE", "automaticRestart": False,
    }
    assert body["machineType"] == "zones/us-central1-a/machineTypes/a2-highgpu-1g"
    items = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert items["startup-script"] == bootstrap(req)
    assert items["spotd-node-rank"] == "0"
    assert body["labels"]["spotd-launch"] == naming.token_hash("tok")
    assert body["disks"][0]["initializeParams"]["sourceImage"].endswith("family/gpu")
    assert insert.query["requestId"] == naming.request_id("tok", 0)


@pytest.mark.parametrize(("zone", "machine", "configured", "disk"), [
    ("us-east4-a", "a3-ultragpu-8g", "pd-balanced", "hyperdisk-balanced"),
    ("us-east4-a", "a3-ultragpu-8g", "hyperdisk-extreme", "hyperdisk-extreme"),
    ("us-central1-b", "a3-megagpu-8g", "pd-balanced", "pd-balanced"),
    ("us-central1-a", "a2-highgpu-1g", "pd-ssd", "pd-ssd"),
])  # fmt: skip
def test_the_boot_disk_type_follows_the_machine_family(
    fake: GcpFake, zone: str, machine: str, configured: str, disk: str
) -> None:
    p = provider_for(fake, boot_disk_type=configured)
    p.launch(request(offering(p, zone, machine)))
    (insert,) = fake.recorded("POST", f"/zones/{zone}/instances")
    assert insert.body is not None
    assert insert.body["disks"][0]["initializeParams"]["diskType"] == \
        f"zones/{zone}/diskTypes/{disk}"  # fmt: skip


def test_a_persistent_disk_is_refused_where_the_family_takes_hyperdisk_only(
    fake: GcpFake,
) -> None:
    # What the adapter avoids, as GCE (and its fake) answers it.
    body = {"name": "spotd-x-0", "machineType": "zones/us-east4-a/machineTypes/a3-ultragpu-8g",
            "disks": [{"boot": True, "initializeParams": {
                "diskType": "zones/us-east4-a/diskTypes/pd-balanced"}}]}  # fmt: skip
    answer = requests.post(
        f"{fake.url}/compute/v1/projects/{PROJECT}/zones/us-east4-a/instances", json=body,
        timeout=5)  # fmt: skip
    assert answer.status_code == 400 and "pd-balanced" in answer.text
    assert machines.boot_disk_type("a4-highgpu-8g", "pd-balanced") == "hyperdisk-balanced"
    assert machines.boot_disk_type("a4x-highgpu-4g", "pd-ssd") == "hyperdisk-balanced"
    assert machines.hyperdisk_only("a3-ultragpu-8g") == "A3 Ultra"
    assert machines.hyperdisk_only("a3-highgpu-8g") is None


def test_stop_action_and_on_demand_scheduling(fake: GcpFake) -> None:
    p = provider_for(fake, termination_action="STOP")
    o = offering(p, "us-central1-b", "g2-standard-4")
    p.launch(request(o, token="spot"))
    p.launch(request(o, token="od", market=Market.ON_DEMAND))
    spot, on_demand = (c.body for c in fake.recorded("POST", "/instances"))
    assert spot is not None and on_demand is not None
    assert spot["scheduling"]["instanceTerminationAction"] == "STOP"
    assert on_demand["scheduling"] == {"provisioningModel": "STANDARD",
                                       "onHostMaintenance": "TERMINATE"}
    markets = {i.market for i in p.list_instances({"spotd-job": "j1"})}
    assert markets == {Market.SPOT, Market.ON_DEMAND}


def test_request_ids_are_stable_uuids() -> None:
    rid = naming.request_id("token-a", 0)
    assert rid == naming.request_id("token-a", 0)
    assert uuid.UUID(rid).version == 5
    others = {naming.request_id("token-a", 1), naming.request_id("token-b", 0)}
    assert rid not in others and len(others) == 2


def test_relaunch_sends_the_same_request_ids(fake: GcpFake, provider: GcpProvider) -> None:
    o = offering(provider, "us-central1-b", "g2-standard-4")
    first = provider.launch(request(o, nodes=2))
    again = provider.launch(request(o, nodes=2))
    assert [i.id for i in again] == [i.id for i in first]
    ids = [c.query["requestId"] for c in fake.recorded("POST", "/instances")]
    assert ids == [naming.request_id("tok", 0), naming.request_id("tok", 1)] * 2
    assert len(fake.instances) == 2


def test_existing_name_counts_as_launched(fake: GcpFake, provider: GcpProvider) -> None:
    o = offering(provider, "us-central1-b", "g2-standard-4")
    first = provider.launch(request(o))
    fake.request_ids.clear()  # GCE forgot the request id: the insert now answers 409
    again = provider.launch(request(o))
    assert [i.id for i in again] == [i.id for i in first]
    assert len(fake.instances) == 1


@pytest.mark.parametrize("token", ["tok", "x" * 500, "Ünïcode token/with spaces", ""])
def test_names_follow_gce_rules(token: str) -> None:
    for rank in (0, 7, 255):
        name = naming.instance_name(token, rank)
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
        assert name == naming.instance_name(token, rank)


def test_ids_are_zone_and_name(provider: GcpProvider) -> None:
    o = offering(provider, "us-central1-b", "g2-standard-4")
    (inst,) = provider.launch(request(o))
    assert inst.id == f"us-central1-b/{naming.instance_name('tok', 0)}"
    assert inst.pool == o.pool and inst.market is Market.SPOT


# -- labels ----------------------------------------------------------------------


LABEL = re.compile(r"[a-z][a-z0-9_-]{0,62}")
VALUE = re.compile(r"[a-z0-9_-]{0,63}")


@pytest.mark.parametrize(("key", "value"), [
    ("spotd-job", "j-123"), ("Team", "ML Research"), ("9lives", "x.y@z"),
    ("k" * 80, "v" * 80), ("", ""), ("ключ", "значение"),
])
def test_label_sanitising_follows_gcp_rules(key: str, value: str) -> None:
    assert LABEL.fullmatch(naming.label_key(key))
    assert VALUE.fullmatch(naming.label_value(value))


def test_label_mapping_keeps_plain_tags_and_separates_lossy_ones() -> None:
    assert naming.label_key("spotd-job") == "spotd-job"
    assert naming.label_value("j-123") == "j-123"
    assert naming.label_value("Team") == "team"  # only the case is lost
    assert naming.label_value("a.b") != naming.label_value("a_b")  # hash suffix tells apart
    assert naming.label_value("a" * 70) != naming.label_value("a" * 71)


def test_tags_round_trip_through_metadata(fake: GcpFake, provider: GcpProvider) -> None:
    tags = {"spotd-job": "j1", "Team": "ML Research", "owner@corp": "Ann.B"}
    o = offering(provider, "us-central1-b", "g2-standard-4")
    (inst,) = provider.launch(request(o, tags=tags))
    assert inst.tags == tags
    (insert,) = fake.recorded("POST", "/instances")
    assert insert.body is not None
    for key, value in insert.body["labels"].items():
        assert LABEL.fullmatch(key) and VALUE.fullmatch(value)
    assert [i.id for i in provider.list_instances({"Team": "ML Research"})] == [inst.id]
    # Same labels after sanitising, different tags: the exact tags decide.
    assert provider.list_instances({"team": "ml research"}) == []
    assert provider.list_instances({"Team": "ml research"}) == []


def test_list_instances_filters_on_the_server_and_pages(
    fake: GcpFake, provider: GcpProvider
) -> None:
    o = offering(provider, "us-central1-b", "g2-standard-4")
    provider.launch(request(o, token="many", nodes=5))
    provider.launch(request(o, token="other", tags={"spotd-job": "j2"}))
    listed = provider.list_instances({"spotd-job": "j1"})
    assert len(listed) == 5
    calls = fake.recorded("GET", "/aggregated/instances")
    assert len(calls) == 2  # 5 matches, 3 a page
    assert calls[0].query["filter"] == '(labels.spotd-job = "j1")'
    assert len(provider.list_instances({})) == 6


def test_vms_spotd_did_not_start_are_invisible(fake: GcpFake, provider: GcpProvider) -> None:
    fake.instances[("us-central1-b", "someone-elses-vm")] = {
        "name": "someone-elses-vm", "status": "RUNNING", "labels": {"spotd-job": "j1"},
        "machineType": "zones/us-central1-b/machineTypes/g2-standard-4",
    }
    assert provider.list_instances({"spotd-job": "j1"}) == []
    assert provider.describe(["us-central1-b/someone-elses-vm"]) == []


# -- states ------------------------------------------------------------------------


def test_boot_states_then_running(provider: GcpProvider) -> None:
    o = offering(provider, "us-central1-b", "g2-standard-4")
    (inst,) = provider.launch(request(o))
    assert inst.state is InstanceState.PENDING
    (now,) = provider.describe([inst.id])
    assert now.state is InstanceState.RUNNING and now.launched_at is not None


def test_preempted_and_stopped_vm_is_preempted(fake: GcpFake) -> None:
    p = provider_for(fake, termination_action="STOP")
    (inst,) = p.launch(request(offering(p, "us-central1-b", "g2-standard-4")))
    p.describe([inst.id])
    p.describe([inst.id])
    fake.preempt(*inst.id.split("/"))
    (gone,) = p.describe([inst.id])
    assert gone.state is InstanceState.PREEMPTED and gone.ended_at is not None
    (listed,) = p.list_instances({"spotd-job": "j1"})
    assert listed.state is InstanceState.PREEMPTED


def test_preempted_and_deleted_vm_is_preempted(fake: GcpFake, provider: GcpProvider) -> None:
    o = offering(provider, "us-central1-b", "g2-standard-4")
    (inst,) = provider.launch(request(o))
    fake.preempt(*inst.id.split("/"))
    assert ("us-central1-b", inst.id.split("/")[1]) not in fake.instances
    (gone,) = provider.describe([inst.id])
    assert gone.state is InstanceState.PREEMPTED and gone.pool == o.pool
    assert gone.tags == {"spotd-job": "j1"}
    # A provider that never saw the VM still knows it was preempted, not its type.
    (fresh,) = provider_for(fake).describe([inst.id])
    assert fresh.state is InstanceState.PREEMPTED and fresh.pool.instance_type == "unknown"


def test_stopped_without_preemption_is_terminated(fake: GcpFake, provider: GcpProvider) -> None:
    (inst,) = provider.launch(request(offering(provider, "us-central1-b", "g2-standard-4")))
    zone, name = inst.id.split("/")
    fake.instances[(zone, name)]["status"] = "TERMINATED"
    (stopped,) = provider.describe([inst.id])
    assert stopped.state is InstanceState.TERMINATED


def test_terminate_deletes_and_ignores_unknown(fake: GcpFake, provider: GcpProvider) -> None:
    (inst,) = provider.launch(request(offering(provider, "us-central1-b", "g2-standard-4")))
    provider.terminate([inst.id, inst.id, "us-central1-b/spotd-nothing-0", "junk"])
    assert fake.instances == {}
    assert provider.describe([inst.id]) == []


def test_logs_are_the_serial_console(fake: GcpFake, provider: GcpProvider) -> None:
    (inst,) = provider.launch(request(offering(provider, "us-central1-b", "g2-standard-4")))
    assert provider.logs(inst.id) == fake.serial_output
    assert provider.logs("us-central1-b/spotd-nothing-0") == ""
    assert provider.logs("junk") == ""


# -- all or none ---------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "after", "error"), [
    ("capacity", 1, CapacityError),  # node 1's operation fails after nodes 0 and 2 exist
    ("quota-http", 2, QuotaError),  # node 2's insert is refused
    ("server", 1, ProviderUnavailable),
])
def test_partial_launch_deletes_the_created_nodes(
    fake: GcpFake, provider: GcpProvider, kind: str, after: int, error: type[ProviderError]
) -> None:
    o = offering(provider, "us-central1-a", "a2-highgpu-8g")
    fake.fail_next_insert(kind, after=after)
    with pytest.raises(error):
        provider.launch(request(o, nodes=3))
    assert fake.instances == {}
    deleted = {c.path.rsplit("/", 1)[1] for c in fake.recorded("DELETE", "/instances/")}
    assert {naming.instance_name("tok", r) for r in range(after)} <= deleted
    assert provider.list_instances({"spotd-job": "j1"}) == []


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "error", "code"), [
    ("capacity", CapacityError, "ZONE_RESOURCE_POOL_EXHAUSTED"),
    ("capacity-details", CapacityError, "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"),
    ("stockout", CapacityError, "STOCKOUT"),
    ("quota", QuotaError, "QUOTA_EXCEEDED"),
    ("quota-http", QuotaError, "quotaExceeded"),
    ("throttle", ThrottledError, "rateLimitExceeded"),
    ("rate-403", ThrottledError, "rateLimitExceeded"),
    # A 401 makes the SDK refresh the credentials; anonymous ones cannot be refreshed.
    ("auth", AuthError, "CredentialsRefused"),
    ("forbidden", AuthError, "forbidden"),
    ("server", ProviderUnavailable, "backendError"),
    ("unavailable", ProviderUnavailable, "backendError"),
    ("bad-request", ProviderError, "invalid"),
])
def test_every_insert_error_maps_to_its_class(
    fake: GcpFake, provider: GcpProvider, kind: str, error: type[ProviderError], code: str
) -> None:
    o = offering(provider, "us-central1-b", "g2-standard-4")
    fake.fail_next_insert(kind)
    with pytest.raises(error) as err:
        provider.launch(request(o))
    assert type(err.value) is error
    assert err.value.provider == "gcp" and err.value.code == code


@pytest.mark.parametrize(("method", "path", "status", "reason", "error"), [
    ("GET", r"/instances/[^/]+$", 500, "backendError", ProviderUnavailable),
    ("GET", r"/instances/[^/]+$", 403, "forbidden", AuthError),
    ("GET", r"/instances/[^/]+$", 429, "rateLimitExceeded", ThrottledError),
    ("GET", r"/aggregated/instances$", 503, "backendError", ProviderUnavailable),
    ("DELETE", r"/instances/[^/]+$", 401, "required", AuthError),
])
def test_errors_of_other_calls(
    fake: GcpFake, provider: GcpProvider, method: str, path: str, status: int, reason: str,
    error: type[ProviderError],
) -> None:
    (inst,) = provider.launch(request(offering(provider, "us-central1-b", "g2-standard-4")))
    fake.fail_next(method, path, status, reason)
    with pytest.raises(error):
        if method == "DELETE":
            provider.terminate([inst.id])
        elif "aggregated" in path:
            provider.list_instances({})
        else:
            provider.describe([inst.id])


@pytest.mark.parametrize(("codes", "status", "error"), [
    (["ZONE_RESOURCE_POOL_EXHAUSTED"], 503, CapacityError),
    (["quotaExceeded"], 403, QuotaError),
    (["rateLimitExceeded"], 403, ThrottledError),
    (["RATE_LIMIT_EXCEEDED"], 429, ThrottledError),
    ([], 429, ThrottledError),
    (["forbidden"], 403, AuthError),
    ([], 401, AuthError),
    (["IAM_PERMISSION_DENIED"], 403, AuthError),
    ([], 404, NotFoundError),
    ([], 502, ProviderUnavailable),
    (["alreadyExists"], 409, ProviderError),
    ([], None, ProviderError),
])
def test_classify(codes: list[str], status: int | None, error: type[ProviderError]) -> None:
    assert gcp_errors.classify(codes, status) is error


def test_mapping_never_reads_the_message() -> None:
    with pytest.raises(ProviderError) as err, map_gcp_errors():
        raise gexc.BadRequest("ZONE_RESOURCE_POOL_EXHAUSTED quota exceeded rate limit")
    assert type(err.value) is ProviderError


@pytest.mark.parametrize(("raised", "expected"), [
    (gauth_exc.OAuthError("bad grant"), AuthError),
    (gauth_exc.MutualTLSChannelError("no client certificate"), AuthError),
    (gauth_exc.MalformedError("not a key file"), AuthError),
    (gauth_exc.TimeoutError("token endpoint slow"), ProviderUnavailable),
])
def test_every_google_auth_error_is_mapped(raised: Exception, expected: type) -> None:
    with pytest.raises(ProviderError) as err, map_gcp_errors("list"):
        raise raised
    assert type(err.value) is expected and err.value.__cause__ is raised


def test_unreachable_api_is_unavailable(fake: GcpFake) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    p = provider_for(fake, api_endpoint=f"http://127.0.0.1:{port}")
    with pytest.raises(ProviderUnavailable):
        p.describe(["us-central1-b/spotd-abc-0"])


def test_missing_adc_is_an_auth_error(
    fake: GcpFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    p = build_gcp_provider(settings_for(fake), startup_script=bootstrap)
    with pytest.raises(AuthError) as err:
        p.offerings()
    assert err.value.provider == "gcp"


def test_no_credentials_in_errors_or_logs(
    fake: GcpFake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    p = build_gcp_provider(settings_for(fake), startup_script=bootstrap,
                           credentials=Credentials(token=SECRET))
    o = offering(p, "us-central1-b", "g2-standard-4")
    assert all(r.headers.get("authorization") == f"Bearer {SECRET}" for r in fake.requests)
    texts: list[str] = []
    for kind in ("capacity", "quota-http", "throttle", "auth", "server", "bad-request"):
        fake.fail_next_insert(kind)
        with pytest.raises(ProviderError) as err:
            p.launch(request(o, token=kind))
        texts += [str(err.value), repr(err.value), str(err.value.__cause__)]
    texts.append(caplog.text)
    assert not any(SECRET in t for t in texts)


# -- settings ------------------------------------------------------------------------


def test_settings_defaults_and_validation() -> None:
    s = GcpSettings()
    assert not s.enabled and s.machine_types is None and "us-central1-a" in s.zones
    assert s.termination_action == "DELETE"
    with pytest.raises(ValidationError):
        GcpSettings(api_endpoint="http://compute.example.com")  # plain http off loopback
    with pytest.raises(ValidationError):
        GcpSettings(enabled=True)  # no image
    with pytest.raises(ValidationError):
        GcpSettings.model_validate({"unknown": 1})
    assert GcpSettings(billing_endpoint="https://billing.example.com/").billing_endpoint == (
        "https://billing.example.com")


def test_launch_validates_the_request(provider: GcpProvider) -> None:
    o = offering(provider, "us-central1-b", "g2-standard-4")
    with pytest.raises(ProviderError):
        provider.launch(request(o, nodes=0))


def test_a_boot_script_the_renderer_refuses_is_an_invalid_request(fake: GcpFake) -> None:
    # The real renderer refuses a script that would carry the daemon's own token.
    render = bootstrap_for("gcp", daemon_url="http://d:8000", daemon_token="s3cret")
    p = build_gcp_provider(settings_for(fake), startup_script=render,
                           credentials=_anon())  # fmt: skip
    leaky = replace(request(offering(p, "us-central1-b", "g2-standard-4")), env={"T": "s3cret"})
    with pytest.raises(InvalidRequestError, match="daemon's token") as err:
        p.launch(leaky)
    assert not err.value.retryable and err.value.code == "InvalidParameter"
    assert not [r for r in fake.requests if r.method == "POST"]


def test_project_is_used_in_paths(fake: GcpFake, provider: GcpProvider) -> None:
    provider.offerings()
    compute = [r for r in fake.requests if r.path.startswith("/compute/")]
    assert compute and all(f"/projects/{PROJECT}/" in r.path for r in compute)
    assert LOCATIONS  # the fake's price regions are imported for the expected prices


def _anon() -> Any:
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()


@pytest.mark.parametrize(
    ("zone", "machine", "fabric"),
    [("us-central1-a", "a3-highgpu-8g", Fabric.TCPX), ("us-central1-b", "a3-megagpu-8g",
     Fabric.TCPXO), ("us-east4-a", "a3-ultragpu-8g", Fabric.ROCE)],
)  # fmt: skip
def test_a_gangs_startup_script_carries_rendezvous_and_fabric_variables(
    fake: GcpFake, zone: str, machine: str, fabric: Fabric
) -> None:
    render = bootstrap_for("gcp", daemon_url="https://d:8443", daemon_token="the-daemon-token")
    p = GcpProvider(settings_for(fake), startup_script=render, credentials=_anon())
    o = offering(p, zone, machine)
    assert o.interconnect.fabric is fabric
    p.launch(gang_request(o, tags={"spotd-job": "j-gang", "spotd-attempt": "3"}))
    inserts = fake.recorded("POST", f"/zones/{zone}/instances")
    assert len(inserts) == 2
    for insert in inserts:
        items = {i["key"]: i["value"] for i in (insert.body or {})["metadata"]["items"]}
        env = script_env(items["startup-script"])
        assert_gang_env(env, fabric)
        assert "the-daemon-token" not in items["startup-script"]


# -- gangs: the placement policy and the GPU NICs ----------------------------------


def sent_instances(fake: GcpFake, zone: str) -> list[compute_v1.Instance]:
    """The insert bodies the fake got, parsed by the SDK's own model (unknown fields refused)."""
    return [compute_v1.Instance.from_json(json.dumps(c.body), ignore_unknown_fields=False)
            for c in fake.recorded("POST", f"/zones/{zone}/instances")]


def sent_policies(fake: GcpFake, region: str) -> list[compute_v1.ResourcePolicy]:
    return [compute_v1.ResourcePolicy.from_json(json.dumps(c.body), ignore_unknown_fields=False)
            for c in fake.recorded("POST", f"/regions/{region}/resourcePolicies")]


GANG_TAGS = {"spotd-job": "j-gang", "spotd-attempt": "2", "spotd-owner": "me"}


def test_a_gang_gets_a_compact_policy_first_and_names_it(
    fake: GcpFake, provider: GcpProvider
) -> None:
    o = offering(provider, "us-central1-b", "a3-megagpu-8g")
    nodes = provider.launch(request(o, token="j-gang-a2", nodes=4, tags=GANG_TAGS))
    (policy,) = sent_policies(fake, "us-central1")
    name = naming_policy("j-gang-a2")
    assert policy.name == name and policy.region == "us-central1"
    assert policy.group_placement_policy.collocation == "COLLOCATED"
    assert policy.group_placement_policy.vm_count == 4
    assert json.loads(policy.description)["spotd"]["tags"] == GANG_TAGS
    posts = [r.path for r in fake.requests if r.method == "POST" and "/wait" not in r.path]
    assert "resourcePolicies" in posts[0] and all("/instances" in p for p in posts[1:])
    for vm in sent_instances(fake, "us-central1-b"):
        assert list(vm.resource_policies) == [
            f"projects/{PROJECT}/regions/us-central1/resourcePolicies/{name}"]
        assert vm.scheduling.provisioning_model == "SPOT"
        assert vm.scheduling.instance_termination_action == "DELETE"
        assert vm.scheduling.on_host_maintenance == "TERMINATE"
        assert vm.scheduling.automatic_restart is False
        assert "max_run_duration" not in vm.scheduling  # the job set none
        assert list(vm.guest_accelerators) == []  # A3 has its GPUs built in
    (placement,) = provider.list_placements({"spotd-job": "j-gang"})
    assert placement.id == f"us-central1/{name}" and placement.kind == "resource-policy"
    assert placement.region == "us-central1" and dict(placement.tags) == GANG_TAGS
    assert len(nodes) == 4


def naming_policy(token: str) -> str:
    from spotd_gcp import placement

    return placement.policy_name(token)


@pytest.mark.parametrize(("zone", "machine", "gvnic", "mrdma"), [
    ("us-central1-a", "a3-highgpu-8g", 4, 0),   # nic0 + 4 GPU NICs, GPUDirect-TCPX
    ("us-central1-b", "a3-megagpu-8g", 8, 0),   # nic0 + 8 GPU NICs, GPUDirect-TCPXO
    ("us-east4-a", "a3-ultragpu-8g", 1, 8),     # 2 gVNIC + 8 MRDMA on the RoCE VPC
])  # fmt: skip
def test_a3_nic_layouts(
    fake: GcpFake, provider: GcpProvider, zone: str, machine: str, gvnic: int, mrdma: int
) -> None:
    provider.launch(request(offering(provider, zone, machine), nodes=2))
    region = zone.rsplit("-", 1)[0]
    for vm in sent_instances(fake, zone):
        nics = list(vm.network_interfaces)
        assert len(nics) == 1 + gvnic + mrdma
        assert nics[0].nic_type == "GVNIC" and nics[0].network == "global/networks/default"
        assert [a.type_ for a in nics[0].access_configs] == ["ONE_TO_ONE_NAT"]
        for i, nic in enumerate(nics[1 : 1 + gvnic]):
            assert nic.nic_type == "GVNIC"
            assert nic.network == f"projects/{PROJECT}/global/networks/gpu-net-{i}"
            assert nic.subnetwork == f"regions/{region}/subnetworks/gpu-{i}"
            assert list(nic.access_configs) == []
        for i, nic in enumerate(nics[1 + gvnic :]):
            assert nic.nic_type == "MRDMA"
            assert nic.network == f"projects/{PROJECT}/global/networks/roce-net"
            assert nic.subnetwork == f"regions/{region}/subnetworks/roce-{i}"
            assert list(nic.access_configs) == []


def test_a_single_a3_node_gets_nic0_only_and_no_policy(
    fake: GcpFake, provider: GcpProvider
) -> None:
    provider.launch(request(offering(provider, "us-central1-b", "a3-megagpu-8g")))
    (vm,) = sent_instances(fake, "us-central1-b")
    assert [n.nic_type for n in vm.network_interfaces] == ["GVNIC"]
    assert list(vm.resource_policies) == []
    assert fake.recorded("POST", "/resourcePolicies") == []


def test_an_a2_gang_gets_the_policy_but_no_gpu_nics(fake: GcpFake, provider: GcpProvider) -> None:
    provider.launch(request(offering(provider, "us-central1-a", "a2-highgpu-8g"), nodes=2))
    for vm in sent_instances(fake, "us-central1-a"):
        assert len(vm.network_interfaces) == 1 and vm.network_interfaces[0].nic_type == ""
        assert len(vm.resource_policies) == 1


def test_a_gang_without_its_gpu_networks_is_refused(fake: GcpFake) -> None:
    p = provider_for(fake, gpu_networks={})
    o = offering(p, "us-central1-b", "a3-megagpu-8g")
    with pytest.raises(InvalidRequestError, match=r"gpu_networks\.us-central1.*8 gvnic") as err:
        p.launch(request(o, nodes=2))
    assert err.value.code == "GpuNetworksMissing" and not err.value.retryable
    assert not [r for r in fake.requests if r.method == "POST"]


def test_a_zone_entry_wins_over_its_region(fake: GcpFake) -> None:
    nets = gpu_networks_config()
    zone_only = {"gvnic": nets["us-east4"]["gvnic"][:1], "rdma": nets["us-east4"]["rdma"]}
    p = provider_for(fake, gpu_networks={"us-east4-a": zone_only, "us-east4": {}})
    p.launch(request(offering(p, "us-east4-a", "a3-ultragpu-8g"), nodes=2))
    assert all(len(vm.network_interfaces) == 10 for vm in sent_instances(fake, "us-east4-a"))


def test_the_policy_is_created_once_across_relaunches(fake: GcpFake, provider: GcpProvider) -> None:
    o = offering(provider, "us-central1-b", "a3-megagpu-8g")
    first = provider.launch(request(o, nodes=2))
    fake.request_ids.clear()  # GCE forgot the request ids: the policy insert now answers 409
    again = provider.launch(request(o, nodes=2))
    assert [i.id for i in again] == [i.id for i in first]
    assert len(fake.policies) == 1


def test_a_failed_gang_launch_deletes_its_nodes_and_its_policy(
    fake: GcpFake, provider: GcpProvider
) -> None:
    fake.fail_next_insert("capacity", after=1)
    with pytest.raises(CapacityError):
        provider.launch(request(offering(provider, "us-central1-b", "a3-megagpu-8g"), nodes=3))
    assert fake.instances == {} and fake.policies == {}


def test_placements_in_use_raise_and_gone_ones_are_ignored(
    fake: GcpFake, provider: GcpProvider
) -> None:
    ids = [i.id for i in provider.launch(
        request(offering(provider, "us-central1-b", "a3-megagpu-8g"), nodes=2, tags=GANG_TAGS))]
    placements = provider.list_placements({"spotd-job": "j-gang"})
    with pytest.raises(ProviderError) as err:
        provider.delete_placements(placements)
    assert err.value.code == "resourceInUseByAnotherResource"
    provider.terminate(ids)
    provider.delete_placements(placements)
    assert provider.list_placements({}) == []
    provider.delete_placements(placements)  # gone: ignored


def test_policies_spotd_did_not_make_are_invisible_and_untouched(
    fake: GcpFake, provider: GcpProvider
) -> None:
    fake.policies[("us-central1", "someone-elses")] = {
        "name": "someone-elses", "description": '{"spotd": {"tags": {"spotd-job": "j"}}}'}
    fake.policies[("us-central1", "spotd-pp-not-json")] = {
        "name": "spotd-pp-not-json", "description": "hand made"}
    assert provider.list_placements({}) == []
    provider.delete_placements([PlacementObject("us-central1/someone-elses", "resource-policy",
                                                "us-central1")])
    assert len(fake.policies) == 2


def test_placements_are_listed_in_the_configured_regions_only(
    fake: GcpFake, provider: GcpProvider
) -> None:
    provider.launch(request(offering(provider, "us-central1-b", "a3-megagpu-8g"), nodes=2))
    provider.list_placements({})
    regions = {c.path.split("/regions/")[1].split("/")[0]
               for c in fake.recorded("GET", "/resourcePolicies")}
    assert regions == {"us-central1", "us-east4", "europe-west4"}


@pytest.mark.parametrize("token", ["j-1-a1", "x" * 500, "Ünïcode token/with spaces", "", "---"])
def test_policy_names_follow_gce_rules(token: str) -> None:
    name = naming_policy(token)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
    assert name.startswith("spotd-pp-") and name == naming_policy(token)
    assert name != naming_policy(token + "x")


# -- accelerators, run duration, addresses ------------------------------------------


def test_attached_gpus_become_guest_accelerators(fake: GcpFake) -> None:
    p = provider_for(fake, attached_gpus={"n1-standard-8": {"accelerator": "nvidia-tesla-t4"}})
    o = offering(p, "us-central1-a", "n1-standard-8")
    assert (o.gpu, o.gpus_per_node, o.gpu_memory_gb) == ("T4", 1, 16)
    p.launch(request(o))
    (vm,) = sent_instances(fake, "us-central1-a")
    (accel,) = vm.guest_accelerators
    assert accel.accelerator_type == "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4"
    assert accel.accelerator_count == 1
    assert "n1-standard-8" not in {x.pool.instance_type for x in provider_for(fake).offerings()}


@pytest.mark.parametrize("market", [Market.SPOT, Market.ON_DEMAND])
def test_max_run_seconds_becomes_max_run_duration(
    fake: GcpFake, provider: GcpProvider, market: Market
) -> None:
    o = offering(provider, "us-central1-b", "g2-standard-4")
    provider.launch(replace(request(o, market=market), max_run_seconds=7200))
    (vm,) = sent_instances(fake, "us-central1-b")
    assert vm.scheduling.max_run_duration.seconds == 7200
    assert vm.scheduling.instance_termination_action == "DELETE"


@pytest.mark.parametrize("seconds", [10, 121 * 24 * 3600])
def test_a_max_run_gce_cannot_take_is_refused(
    fake: GcpFake, provider: GcpProvider, seconds: int
) -> None:
    o = offering(provider, "us-central1-b", "g2-standard-4")
    with pytest.raises(InvalidRequestError, match="max_run_seconds"):
        provider.launch(replace(request(o), max_run_seconds=seconds))
    assert not [r for r in fake.requests if r.method == "POST"]


def test_nodes_report_nic0s_private_address(fake: GcpFake, provider: GcpProvider) -> None:
    (inst,) = provider.launch(request(offering(provider, "us-central1-b", "g2-standard-4")))
    zone, name = inst.id.split("/")
    expected = fake.instances[(zone, name)]["networkInterfaces"][0]["networkIP"]
    assert inst.private_address == expected
    assert provider.describe([inst.id])[0].private_address == expected
    assert provider.list_instances({"spotd-job": "j1"})[0].private_address == expected


def test_a_misspelt_field_is_refused_by_the_fake(fake: GcpFake) -> None:
    # The SDK cannot misspell a field, so the body goes raw: the fake's parser is the check.
    body = {"name": "spotd-x-0", "machineType": "zones/us-central1-b/machineTypes/e2-medium",
            "netwrkInterfaces": []}
    answer = requests.post(
        f"{fake.url}/compute/v1/projects/{PROJECT}/zones/us-central1-b/instances", json=body,
        timeout=5)
    assert answer.status_code == 400 and "netwrkInterfaces" in answer.text
    assert fake.instances == {}


# -- check-cloud ---------------------------------------------------------------------


def gang_check(p: GcpProvider, **changes: Any) -> CloudCheck:
    o = offering(p, "us-central1-b", "a3-megagpu-8g")
    return p.check_cloud(replace(request(o, token="j-chk-a1", nodes=4, tags=GANG_TAGS),
                                 **changes))


def failing(check: CloudCheck) -> list[CheckOutcome]:
    return [o for o in check.outcomes if not o.ok]


def test_check_cloud_passes_each_check_and_creates_nothing(
    fake: GcpFake, provider: GcpProvider
) -> None:
    assert isinstance(provider, CloudChecker)
    check = gang_check(provider)
    assert check.ok and check.provider == "gcp", failing(check)
    names = [o.name for o in check.outcomes]
    assert names[0] == "credentials"
    assert "permission compute.instances.create" in names
    assert "permission compute.resourcePolicies.create" in names
    assert {"image", "launch request", "machine type a3-megagpu-8g in us-central1-b",
            "quota PREEMPTIBLE_NVIDIA_H100_MEGA_GPUS in us-central1",
            "quota A3_CPUS in us-central1"} <= set(names)
    assert sum(n.startswith("subnetwork ") for n in names) == 8
    assert check.would_create[0].startswith(
        f"resource policy regions/us-central1/resourcePolicies/{naming_policy('j-chk-a1')}")
    assert len(check.would_create) == 5 and "9 NICs" in check.would_create[1]
    writes = [r for r in fake.requests if r.method in ("POST", "DELETE")]
    assert [r.path for r in writes] == [f"/v1/projects/{PROJECT}:testIamPermissions"]
    assert fake.instances == {} and fake.policies == {}


def test_check_cloud_without_a_request(fake: GcpFake, provider: GcpProvider) -> None:
    check = provider.check_cloud(None)
    assert check.ok and check.would_create == ()
    assert sum(o.name.startswith("subnetwork ") for o in check.outcomes) == 16 * 3


def _deny(fake: GcpFake) -> None:
    fake.denied.add("compute.instances.create")


def _quota(fake: GcpFake) -> None:
    fake.quotas["us-central1"]["PREEMPTIBLE_NVIDIA_H100_MEGA_GPUS"] = (40.0, 16.0)


def _image(fake: GcpFake) -> None:
    fake.images.clear()


def _capacity(fake: GcpFake) -> None:
    fake.zone_types["us-central1-b"] = [t for t in fake.zone_types["us-central1-b"]
                                        if t != "a3-megagpu-8g"]


def _subnet(fake: GcpFake) -> None:
    del fake.subnetworks[("us-central1", "gpu-3")]


@pytest.mark.parametrize(("inject", "name", "detail"), [
    (_deny, "permission compute.instances.create", "missing in project"),
    (_quota, "quota PREEMPTIBLE_NVIDIA_H100_MEGA_GPUS in us-central1", "need 32, 24 free of 40"),
    (_image, "image", "not found"),
    (_capacity, "machine type a3-megagpu-8g in us-central1-b", "capacity: not offered"),
    (_subnet, "subnetwork us-central1/gpu-3", "not found"),
])  # fmt: skip
def test_check_cloud_names_each_injected_failure(
    fake: GcpFake, provider: GcpProvider, inject: Callable[[GcpFake], None], name: str,
    detail: str,
) -> None:
    provider.offerings()  # the offering is read before the fake changes
    inject(fake)
    (bad,) = failing(gang_check(provider))
    assert bad.name == name and detail in bad.detail


def test_check_cloud_stops_at_refused_credentials(fake: GcpFake, provider: GcpProvider) -> None:
    o = offering(provider, "us-central1-b", "a3-megagpu-8g")
    fake.fail_next("GET", r"/regions/[^/]+$", 403, "forbidden")
    check = provider.check_cloud(request(o, nodes=4))
    assert [(c.name, c.ok) for c in check.outcomes] == [("credentials", False)]
    assert "compute.regions.get" in check.outcomes[0].detail


def test_check_cloud_without_adc(
    fake: GcpFake, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    check = build_gcp_provider(settings_for(fake), startup_script=bootstrap).check_cloud(None)
    assert [(c.name, c.ok) for c in check.outcomes] == [("credentials", False)]


def test_check_cloud_reports_missing_gpu_networks_and_a_bad_request(fake: GcpFake) -> None:
    p = provider_for(fake, gpu_networks={})
    (bad,) = failing(gang_check(p))
    assert bad.name == "gpu networks in us-central1-b" and "gpu_networks" in bad.detail
    (bad,) = failing(gang_check(provider_for(fake), max_run_seconds=5))
    assert bad.name == "launch request" and "max_run_seconds" in bad.detail


def egress_of(check: CloudCheck) -> list[CheckOutcome]:
    return [o for o in check.outcomes if o.name.startswith("egress")]


def test_nodes_with_an_external_address_need_no_way_out(provider: GcpProvider) -> None:
    (found,) = egress_of(gang_check(provider))
    assert found.ok and "external_ip = true" in found.detail


ALL_THREE = (Reach.DAEMON, Reach.PACKAGE_INDEX, Reach.CHECKPOINT_STORE)


@pytest.mark.parametrize(("access", "uri", "unreachable"), [
    (False, "gs://ckpt/j", ALL_THREE),
    (True, "gs://ckpt/j", (Reach.DAEMON, Reach.PACKAGE_INDEX)),
    (True, "s3://ckpt/j", ALL_THREE),  # Private Google Access reaches Google's APIs only
])  # fmt: skip
def test_private_nodes_without_cloud_nat_are_a_typed_finding(
    fake: GcpFake, access: bool, uri: str, unreachable: tuple[Reach, ...]
) -> None:
    fake.subnetworks[("us-central1", "default")]["privateIpGoogleAccess"] = access
    p = provider_for(fake, external_ip=False)
    check = gang_check(p, env={"SPOTD_CHECKPOINT_URI": uri})
    (found,) = egress_of(check)
    assert found.name == "egress network default in us-central1" and not found.ok
    assert found.unreachable == unreachable and "Cloud NAT" in found.detail
    assert failing(check) == [found]
    if unreachable != ALL_THREE:
        assert "Private Google Access on default" in found.detail


def test_private_nodes_get_out_through_cloud_nat(fake: GcpFake) -> None:
    fake.add_cloud_nat("us-central1")
    fake.add_cloud_nat("us-east4", network="gpu-net-0")  # another network's NAT: no help
    p = provider_for(fake, external_ip=False)
    (found,) = egress_of(gang_check(p))
    assert found.ok and "Cloud NAT router-default/nat-all" in found.detail
    by_region = {o.name: o for o in egress_of(p.check_cloud(None))}
    assert by_region["egress network default in us-central1"].ok
    assert not by_region["egress network default in us-east4"].ok
    granted = gcp_check.required_permissions(settings_for(fake, external_ip=False), PROJECT)
    assert {"compute.routers.list", "compute.subnetworks.list"} <= set(granted)


def test_check_cloud_when_permissions_cannot_be_tested(
    fake: GcpFake, provider: GcpProvider
) -> None:
    fake.fail_next("POST", r":testIamPermissions$", 403, "SERVICE_DISABLED")
    (bad,) = failing(provider.check_cloud(None))
    assert bad.name == "permissions" and "cloudresourcemanager" in bad.detail
