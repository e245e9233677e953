"""One contract suite for every Provider: the simulator and each cloud adapter.

Each cloud runs its REAL adapter and SDK client against a fake of the cloud;
see ``tests/harnesses/``. A cloud harness module not written yet is skipped
with the reason.
"""

from __future__ import annotations

import importlib
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from harnesses import ERROR_KINDS, PROVIDERS, ErrorKind, Harness

from spotd.core.clock import WallClock
from spotd.core.contracts import Driller, PlacementHost, Provider
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
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import (
    GangRef,
    Instance,
    InstanceState,
    LaunchRequest,
    Market,
    Offering,
)
from spotd.engine.reconcile import Engine
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB, TAG_OWNER, EngineSettings
from spotd.registry import load_policy
from spotd.store.sql import open_store

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


def request_for(
    h: Harness, token: str = "tok-1", nodes: int = 1, offering: Offering | None = None
) -> LaunchRequest:
    return LaunchRequest(
        offering=offering or h.launchable(),
        market=Market.SPOT,
        nodes=nodes,
        client_token=token,
        tags={TAG_JOB: "j-contract", TAG_ATTEMPT: "1", TAG_OWNER: "contract"},
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


# -- gangs: placement objects and fabric interfaces ----------------------------

GANG = 4


def placer(h: Harness) -> PlacementHost:
    if not h.makes_placements:
        pytest.skip(f"{h.provider.name} puts a gang on one fabric without placement objects")
    assert isinstance(h.provider, PlacementHost)
    return h.provider


def test_gang_launch_carries_the_placement_and_the_fabric(harness: Harness) -> None:
    host = placer(harness)
    offering = harness.gang_offering()
    request = request_for(harness, token="gang-1", nodes=GANG, offering=offering)
    nodes = harness.provider.launch(request)
    assert len(nodes) == GANG
    (placement,) = host.list_placements({TAG_JOB: "j-contract", TAG_ATTEMPT: "1"})
    assert placement.tags[TAG_OWNER] == "contract"
    seen = harness.fabric_seen([n.id for n in nodes])
    assert seen.placements == {placement.id}
    wanted = harness.expected_interfaces(offering.pool.instance_type)
    assert wanted >= 1
    assert seen.interfaces == (wanted,) * GANG
    # Launching again with the token makes neither nodes nor a second placement.
    again = harness.provider.launch(request)
    assert sorted(n.id for n in again) == sorted(n.id for n in nodes)
    assert len(host.list_placements({TAG_JOB: "j-contract"})) == 1


def test_gang_nodes_report_their_private_addresses(harness: Harness) -> None:
    request = request_for(harness, token="gang-2", nodes=GANG, offering=harness.gang_offering())
    ids = [n.id for n in harness.provider.launch(request)]
    described: list[Instance] = []

    def all_addressed() -> bool:
        described[:] = harness.provider.describe(ids)
        return len(described) == GANG and all(i.private_address for i in described)

    eventually(harness, all_addressed)
    assert len({i.private_address for i in described}) == GANG


def test_placement_is_deleted_with_its_gang(harness: Harness) -> None:
    host = placer(harness)
    request = request_for(harness, token="gang-3", nodes=GANG, offering=harness.gang_offering())
    ids = [n.id for n in harness.provider.launch(request)]
    placements = host.list_placements({TAG_JOB: "j-contract"})
    assert len(placements) == 1
    harness.provider.terminate(ids)
    eventually(harness, lambda: all(i.ended for i in harness.provider.describe(ids)))
    host.delete_placements(placements)
    assert host.list_placements({TAG_JOB: "j-contract"}) == []
    host.delete_placements(placements)  # again: ignored


def join_request(h: Harness, token: str, first: LaunchRequest, kept: str) -> LaunchRequest:
    """One node of attempt 2 joining the gang ``first`` launched, of which ``kept`` runs."""
    return replace(
        request_for(h, token=token, nodes=1, offering=first.offering),
        tags={**first.tags, TAG_ATTEMPT: "2"},
        joins=GangRef(first.client_token, first.tags, (kept,)),
    )


def test_a_node_joins_a_running_gang_in_its_placement(harness: Harness) -> None:
    """A node repair's launch: one new node beside the kept one, in the gang's placement
    object with the same fabric interfaces, the object kept, the join idempotent."""
    host = placer(harness)
    offering = harness.gang_offering()
    first = request_for(harness, token="gang-join-1", nodes=2, offering=offering)
    kept, lost = harness.provider.launch(first)
    (placement,) = host.list_placements({TAG_JOB: "j-contract", TAG_ATTEMPT: "1"})
    harness.interrupt(lost.id)
    eventually(harness, lambda: all(i.ended for i in harness.provider.describe([lost.id])))
    join = join_request(harness, "gang-join-2", first, kept.id)
    (new,) = harness.provider.launch(join)
    assert new.id not in (kept.id, lost.id) and new.pool == kept.pool
    seen = harness.fabric_seen([kept.id, new.id])
    assert seen.placements == {placement.id}
    assert seen.interfaces[1] == seen.interfaces[0] >= 1
    # The gang's placement object is the only one, and still there.
    assert [p.id for p in host.list_placements({TAG_JOB: "j-contract"})] == [placement.id]
    # The same join again (a retry after a crash) starts nothing new.
    again = harness.provider.launch(join)
    assert [n.id for n in again] == [new.id]
    live = [i.id for i in harness.provider.list_instances({TAG_JOB: "j-contract"})
            if not i.ended]  # fmt: skip
    assert sorted(live) == sorted([kept.id, new.id])


def test_a_join_refused_for_capacity_leaves_the_gang_and_its_placement(
    harness: Harness,
) -> None:
    host = placer(harness)
    offering = harness.gang_offering()
    first = request_for(harness, token="gang-join-3", nodes=2, offering=offering)
    kept, lost = harness.provider.launch(first)
    harness.interrupt(lost.id)
    eventually(harness, lambda: all(i.ended for i in harness.provider.describe([lost.id])))
    harness.fail_next_launch("capacity")
    with pytest.raises(CapacityError):
        harness.provider.launch(join_request(harness, "gang-join-4", first, kept.id))
    assert len(host.list_placements({TAG_JOB: "j-contract", TAG_ATTEMPT: "1"})) == 1
    live = [i.id for i in harness.provider.list_instances({TAG_JOB: "j-contract"})
            if not i.ended]  # fmt: skip
    assert live == [kept.id]


def test_a_join_to_a_gang_whose_placement_is_gone_launches_nothing(harness: Harness) -> None:
    host = placer(harness)
    first = request_for(harness, token="gang-join-5", nodes=2, offering=harness.gang_offering())
    ids = [n.id for n in harness.provider.launch(first)]
    harness.provider.terminate(ids)
    eventually(harness, lambda: all(i.ended for i in harness.provider.describe(ids)))
    host.delete_placements(host.list_placements({TAG_JOB: "j-contract"}))
    # Not an invalid request (which fails a job): the gang restarts whole.
    with pytest.raises(NotFoundError):
        harness.provider.launch(join_request(harness, "gang-join-6", first, ids[0]))
    live = [i for i in harness.provider.list_instances({TAG_JOB: "j-contract"}) if not i.ended]
    assert live == [] and host.list_placements({TAG_JOB: "j-contract"}) == []


def engine_for(h: Harness, tmp_path: Path, owner: str = "contract") -> Engine:
    store = open_store(f"sqlite:///{tmp_path / 'spotd.db'}")
    settings = EngineSettings(owner=owner, checkpoints_dir=tmp_path / "ckpt")
    return Engine(store, {h.provider.name: h.provider}, load_policy("cheapest"), WallClock(),
                  settings)  # fmt: skip


def gang_spec(offering: Offering) -> JobSpec:
    return JobSpec.model_validate({
        "name": "gang",
        "command": ["python", "train.py"],
        "resources": {"gpus": [offering.gpu], "gpus_per_node": offering.gpus_per_node,
                      "nodes": GANG},
    })  # fmt: skip


def test_the_engine_deletes_the_placement_when_the_attempt_ends(
    harness: Harness, tmp_path: Path
) -> None:
    host = placer(harness)
    engine = engine_for(harness, tmp_path)
    job = engine.submit(gang_spec(harness.gang_offering()))
    limit = time.monotonic() + 30
    while not engine.store.attempts(job.id) or not engine.store.attempts(job.id)[-1].instance_ids:
        assert time.monotonic() < limit, "the gang was never launched"
        engine.tick()
    tags = {TAG_JOB: job.id}
    assert len(host.list_placements(tags)) == 1
    engine.request_cancel(job.id)
    engine.tick()  # the pass carries the cancel out
    eventually(harness, lambda: not host.list_placements(tags))
    ids = engine.store.attempts(job.id)[-1].instance_ids
    assert all(i.ended for i in harness.provider.describe(ids))


def test_a_placement_orphaned_by_a_killed_launch_is_reaped(
    harness: Harness, tmp_path: Path
) -> None:
    host = placer(harness)
    request = request_for(harness, token="gang-kill", nodes=GANG, offering=harness.gang_offering())
    request = replace(request, tags={**request.tags, TAG_JOB: "j-killed"})
    child = harness.launch_in_child(request, tmp_path)
    try:
        limit = time.monotonic() + 60
        while not host.list_placements({TAG_JOB: "j-killed"}):
            assert child.poll() is None, f"the launching child exited with {child.returncode}"
            assert time.monotonic() < limit, "the child never created its placement"
            time.sleep(0.1)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # The daemon comes back with no attempt for j-killed: everything of it is an orphan.
    engine = engine_for(harness, tmp_path)
    def reaped() -> bool:
        engine.reap()
        return not host.list_placements({TAG_JOB: "j-killed"})

    eventually(harness, reaped)
    live = [i for i in harness.provider.list_instances({TAG_JOB: "j-killed"}) if not i.ended]
    assert live == []


def test_a_finished_jobs_nodes_are_terminated(harness: Harness, tmp_path: Path) -> None:
    """docs/providers.md: when a job ends, the engine terminates its nodes. A cloud
    VM whose job exited may still show as running (or stopped, and billing disks):
    the agent's exit report decides, and the engine stops the VM."""
    from spotd.core.values import InstanceReport

    engine = engine_for(harness, tmp_path)
    offering = harness.launchable()
    job = engine.submit(JobSpec.model_validate({
        "name": "finishes", "command": list(harness.command()),
        "resources": {"gpus": [offering.gpu], "gpus_per_node": offering.gpus_per_node},
        "market": {"providers": [harness.provider.name]},
    }))  # fmt: skip
    limit = time.monotonic() + 30
    while engine.store.get_job(job.id).status is not JobStatus.RUNNING:
        assert time.monotonic() < limit, f"never ran: {engine.store.get_job(job.id).status}"
        engine.tick()
        harness.settle()
    (attempt,) = engine.store.attempts(job.id)
    (iid,) = attempt.instance_ids
    engine.store.save_report(InstanceReport(iid, harness.provider.name, job.id, attempt.seq,
                                            exit_code=0, exited_at=engine.clock.now()))  # fmt: skip
    engine.tick()
    assert engine.store.get_job(job.id).status is JobStatus.SUCCEEDED
    eventually(harness, lambda: _state(harness, Instance(iid, attempt.pool, attempt.market,
                                                          InstanceState.RUNNING))
               in (InstanceState.TERMINATED, None))  # fmt: skip


# -- drills: a preemption sent on purpose, through the provider's own mechanism ---------


def driller(h: Harness) -> Driller:
    if not isinstance(h.provider, Driller):
        pytest.skip(f"{h.provider.name} sends no drills")
    return h.provider


def test_a_drill_preempts_a_spot_node_with_the_providers_notice(harness: Harness) -> None:
    drills = driller(harness)
    (inst,) = harness.provider.launch(request_for(harness, token="drill-1"))
    eventually(harness, lambda: _state(harness, inst) is InstanceState.RUNNING)
    drills.drill(inst.id)
    taken = (InstanceState.NOTICE, InstanceState.PREEMPTED)
    eventually(harness, lambda: _state(harness, inst) in taken)


def test_a_drill_of_an_on_demand_node_is_refused(harness: Harness) -> None:
    drills = driller(harness)
    offering = harness.launchable()
    request = replace(request_for(harness, token="drill-2", offering=offering),
                      market=Market.ON_DEMAND)  # fmt: skip
    (inst,) = harness.provider.launch(request)
    eventually(harness, lambda: _state(harness, inst) is InstanceState.RUNNING)
    with pytest.raises(InvalidRequestError) as err:
        drills.drill(inst.id)
    assert err.value.provider == harness.provider.name
    assert _state(harness, inst) is InstanceState.RUNNING


def test_a_drill_of_a_node_gone_is_not_found(harness: Harness) -> None:
    drills = driller(harness)
    (inst,) = harness.provider.launch(request_for(harness, token="drill-3"))
    harness.provider.terminate([inst.id])
    eventually(harness, lambda: _state(harness, inst) in (InstanceState.TERMINATED, None))
    with pytest.raises(NotFoundError):
        drills.drill(inst.id)
