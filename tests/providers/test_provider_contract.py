"""One contract suite for every Provider: the simulator and each cloud adapter.

Each cloud runs its REAL adapter and SDK client against a fake of the cloud;
see ``tests/harnesses/``. A cloud harness module not written yet is skipped
with the reason.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harnesses import ERROR_KINDS, PROVIDERS, ErrorKind, Harness

from spotd.core.contracts import Provider
from spotd.core.errors import (
    AuthError,
    CapacityError,
    ProviderError,
    ProviderUnavailable,
    QuotaError,
    ThrottledError,
)
from spotd.core.values import Instance, InstanceState, LaunchRequest, Market

EXPECTED: dict[ErrorKind, type[ProviderError]] = {
    "capacity": CapacityError,
    "quota": QuotaError,
    "throttle": ThrottledError,
    "auth": AuthError,
    "server": ProviderUnavailable,
}


@pytest.fixture(params=PROVIDERS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    try:
        module = importlib.import_module(f"harnesses.{request.param}")
    except ModuleNotFoundError as exc:
        pytest.skip(f"no harness for {request.param} yet: {exc}")
    with module.make_harness(tmp_path) as h:
        yield h


def request_for(h: Harness, token: str = "tok-1", nodes: int = 1) -> LaunchRequest:
    return LaunchRequest(
        offering=h.launchable(),
        market=Market.SPOT,
        nodes=nodes,
        client_token=token,
        tags={"spotd-job": "j-contract", "spotd-attempt": "1"},
        command=h.command(),
        env={"SPOTD_JOB_ID": "j-contract"},
    )


def eventually(h: Harness, check: Callable[[], bool], timeout: float = 15.0) -> None:
    limit = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < limit, "condition never held"
        h.settle()


def test_fits_the_protocol(harness: Harness) -> None:
    assert isinstance(harness.provider, Provider)


def test_offerings_have_prices_and_interconnects(harness: Harness) -> None:
    offerings = harness.provider.offerings()
    assert offerings
    for o in offerings:
        assert o.pool.provider == harness.provider.name
        assert o.gpus_per_node >= 1 and o.gpu
        assert o.interconnect.gbps_per_gpu > 0
        assert o.spot_price is None or o.spot_price > 0
        assert o.on_demand_price is None or o.on_demand_price > 0
    assert any(o.spot_price and o.on_demand_price for o in offerings)
    assert any(o.spot_price and o.on_demand_price and o.spot_price < o.on_demand_price
               for o in offerings)


def test_launch_tags_and_list_by_tag(harness: Harness) -> None:
    (inst,) = harness.provider.launch(request_for(harness))
    assert inst.tags.get("spotd-job") == "j-contract"
    assert inst.market is Market.SPOT
    listed = harness.provider.list_instances({"spotd-job": "j-contract"})
    assert [i.id for i in listed] == [inst.id]
    assert harness.provider.list_instances({"spotd-job": "someone-else"}) == []


def test_relaunch_with_the_same_token_starts_nothing(harness: Harness) -> None:
    first = harness.provider.launch(request_for(harness, token="same"))
    again = harness.provider.launch(request_for(harness, token="same"))
    assert [i.id for i in again] == [i.id for i in first]
    assert len(harness.provider.list_instances({"spotd-job": "j-contract"})) == 1


def test_terminate(harness: Harness) -> None:
    (inst,) = harness.provider.launch(request_for(harness))
    harness.provider.terminate([inst.id])
    eventually(harness, lambda: _state(harness, inst) in (InstanceState.TERMINATED, None))
    harness.provider.terminate([inst.id])  # again: ignored
    harness.provider.terminate(["no-such-instance"])


def test_provider_side_interruption(harness: Harness) -> None:
    (inst,) = harness.provider.launch(request_for(harness))
    eventually(harness, lambda: _state(harness, inst) is InstanceState.RUNNING)
    harness.interrupt(inst.id)
    eventually(harness, lambda: _state(harness, inst) is InstanceState.PREEMPTED)


def test_describe_of_unknown_ids_is_empty(harness: Harness) -> None:
    assert harness.provider.describe(["no-such-instance"]) == []


@pytest.mark.parametrize("kind", ERROR_KINDS)
def test_errors_map_to_our_classes(harness: Harness, kind: ErrorKind) -> None:
    if not harness.supports(kind):
        pytest.skip(f"{harness.provider.name} cannot fail with {kind}")
    harness.fail_next_launch(kind)
    with pytest.raises(EXPECTED[kind]) as err:
        harness.provider.launch(request_for(harness, token=f"err-{kind}"))
    assert err.value.provider == harness.provider.name
    assert harness.provider.list_instances({"spotd-job": "j-contract"}) == []


def _state(h: Harness, inst: Instance) -> InstanceState | None:
    found = h.provider.describe([inst.id])
    return found[0].state if found else None
