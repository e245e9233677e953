"""Node repair through the reconcile loop, on the scripted provider and a still clock:
the lost node alone is stopped and relaunched, the kept one stays at its rank."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from engine_support import EPOCH, FakeProvider, spec

from spotd.core.agent_wire import (
    ExitReport,
    JoinReport,
    PreflightCheckName,
    PreflightFailure,
    PreflightFigures,
    PreflightReport,
    agent_token,
)
from spotd.core.clock import ManualClock
from spotd.core.errors import CapacityError
from spotd.core.rejoin import RejoinAsk, RejoinStep
from spotd.core.states import JobStatus
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    EventCause,
    GangRef,
    Instance,
    InstanceState,
    JobRecord,
    LaunchRequest,
    PlacementObject,
)
from spotd.daemon.rejoin import DaemonRejoin
from spotd.engine import repairing
from spotd.engine.reconcile import Engine
from spotd.engine.reports import StoreReports
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB, TAG_OWNER, EngineSettings
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy

PASSES = 20


@pytest.fixture
def fake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Engine, FakeProvider]]:
    # The scripted provider adds nodes to a running gang, as the simulated market does.
    monkeypatch.setattr(repairing, "replaces_gang_nodes", lambda provider: provider == "fake")
    provider = FakeProvider()
    store = open_store(f"sqlite:///{tmp_path / 'f.db'}")
    eng = Engine(store, {"fake": provider}, CheapestPolicy(), ManualClock(EPOCH),
                 EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"))  # fmt: skip
    yield eng, provider
    store.close()


def gang(mode: str = "auto") -> dict[str, object]:
    return {"resources": {"gpus": ["A100"], "gpus_per_node": 1, "nodes": 2,
                          "min_gbps_per_gpu": 10},
            "gang": {"on_node_failure": mode}}  # fmt: skip


def passes(eng: Engine, job_id: str, until: JobStatus) -> JobRecord:
    for _ in range(PASSES):
        eng.tick()
        job = eng.store.get_job(job_id)
        if job.status is until:
            return job
    raise AssertionError(f"{job_id} is {eng.store.get_job(job_id).status}, not {until}")


def speaker(eng: Engine, attempt: AttemptRecord, iid: str) -> dict[str, object]:
    return {"job_id": attempt.job_id, "attempt": attempt.seq, "instance_id": iid,
            "provider": attempt.pool.provider, "at": eng.clock.now()}  # fmt: skip


def assemble(eng: Engine, attempt: AttemptRecord) -> None:
    """Every node of ``attempt`` joins and passes preflight, as their agents would say."""
    book = StoreReports(eng.store)
    for n, iid in enumerate(attempt.instance_ids):
        book.join(JoinReport(address=f"10.0.0.{n + 1}", ports=(29500, 29501),
                             **speaker(eng, attempt, iid)))  # fmt: skip
        book.preflight(PreflightReport(figures=PreflightFigures(passed=True, world_size=2),
                                       **speaker(eng, attempt, iid)))  # fmt: skip


def running_gang(eng: Engine, mode: str = "auto") -> tuple[JobRecord, AttemptRecord]:
    job = eng.submit(spec(**gang(mode)))
    passes(eng, job.id, JobStatus.PROVISIONING)
    (first,) = eng.store.attempts(job.id)
    assemble(eng, first)
    return passes(eng, job.id, JobStatus.RUNNING), first


def lose_node_1(eng: Engine, provider: FakeProvider, first: AttemptRecord) -> None:
    """Node 1 is preempted; node 0's command exits with the agreed stop and its agent
    stands by (asks what next, through the daemon's answer)."""
    kept, lost = first.instance_ids
    provider.states[lost] = InstanceState.PREEMPTED
    StoreReports(eng.store).exited(ExitReport(exit_code=143, **speaker(eng, first, kept)))
    eng.clock.advance(1.0)  # type: ignore[attr-defined]
    ask = RejoinAsk.model_validate(speaker(eng, first, kept))
    assert DaemonRejoin(eng.store, "tok").next_step(ask).step is RejoinStep.WAIT


def test_a_preempted_node_is_replaced_and_the_other_kept_at_its_rank(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = fake
    job, first = running_gang(eng)
    kept, lost = first.instance_ids
    lose_node_1(eng, provider, first)
    job = passes(eng, job.id, JobStatus.PROVISIONING)
    closed, second = eng.store.attempts(job.id)
    assert closed.end_reason is AttemptEnd.PREEMPTED
    assert (second.pool, second.market, second.nodes) == (first.pool, first.market, 2)
    assert second.instance_ids[0] == kept and second.instance_ids[1] not in first.instance_ids
    # Only the lost node was stopped; one node launched, for the new attempt.
    assert provider.terminated == [lost]
    assert [(r.nodes, r.tags[TAG_ATTEMPT]) for r in provider.launched] == [(2, "1"), (1, "2")]
    assert provider.launched[-1].env["SPOTD_NUM_NODES"] == "2"
    (event,) = [e for e in eng.store.events(job.id) if e.cause is EventCause.NODE_REPLACED]
    assert event.facts.node == lost and event.facts.rank == 1
    assert f"node 1 ({lost}) replaced by 1 new node(s); node 0 ({kept}) kept" in event.detail
    # The kept node's agent is told to rejoin, with the new attempt's token and rendezvous.
    answer = DaemonRejoin(eng.store, "tok").next_step(
        RejoinAsk.model_validate(speaker(eng, first, kept))
    )
    assert answer.step is RejoinStep.REJOIN and answer.attempt == 2
    assert answer.token == agent_token("tok", second.client_token)
    assert answer.env["SPOTD_RDZV_ID"] == answer.env["PET_RDZV_ID"] == second.client_token
    assert answer.env["SPOTD_ATTEMPT"] == "2"
    # The new gang assembles and runs as any does.
    assemble(eng, second)
    passes(eng, job.id, JobStatus.RUNNING)
    eng.reap()
    assert provider.terminated == [lost]  # the reaper leaves the kept node to its attempt


def test_a_failed_replacement_launch_stops_the_kept_node_and_places_the_whole_gang(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = fake
    job, first = running_gang(eng)
    kept, lost = first.instance_ids
    provider.launch_errors.append(CapacityError("no room", provider="fake"))
    lose_node_1(eng, provider, first)
    job = passes(eng, job.id, JobStatus.PROVISIONING)
    _, refused, third = eng.store.attempts(job.id)
    assert refused.end_reason is AttemptEnd.NO_CAPACITY and refused.instance_ids == (kept,)
    assert set(provider.terminated) == {kept, lost}
    assert len(third.instance_ids) == 2 and kept not in third.instance_ids
    causes = [e.cause for e in eng.store.events(job.id)]
    assert causes[-3:] == [EventCause.NODE_REPLACED, AttemptEnd.NO_CAPACITY, EventCause.PLACED]


@pytest.mark.parametrize("mode", ["restart", "move"])
def test_restart_and_move_stop_every_node_and_place_a_whole_gang(
    fake: tuple[Engine, FakeProvider], mode: str
) -> None:
    eng, provider = fake
    job, first = running_gang(eng, mode)
    lose_node_1(eng, provider, first)
    passes(eng, job.id, JobStatus.PROVISIONING)
    _, second = eng.store.attempts(job.id)
    assert set(provider.terminated) == set(first.instance_ids)
    assert not set(second.instance_ids) & set(first.instance_ids)
    # A preempted spot region cools down either way (``move`` also leaves the pool in
    # the other market: spotd.engine.repair's own tests).
    assert second.pool != first.pool


def test_the_gang_restarts_when_the_other_node_never_stands_by(
    fake: tuple[Engine, FakeProvider],
) -> None:
    eng, provider = fake
    job, first = running_gang(eng)
    # Preempted with no notice heard and no time known for it: no wait, a restart.
    provider.states[first.instance_ids[1]] = InstanceState.PREEMPTED
    job = passes(eng, job.id, JobStatus.PROVISIONING)
    assert set(provider.terminated) == set(first.instance_ids)
    (ended,) = [e for e in eng.store.events(job.id) if e.cause is AttemptEnd.PREEMPTED]
    assert ended.detail.endswith("did not stand by for a new peer")


def test_a_provider_that_cannot_add_a_node_to_a_gang_restarts_it_whole(
    fake: tuple[Engine, FakeProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    eng, provider = fake
    monkeypatch.setattr(repairing, "replaces_gang_nodes", lambda provider: False)
    job, first = running_gang(eng, "replace")
    lose_node_1(eng, provider, first)
    job = passes(eng, job.id, JobStatus.PROVISIONING)
    assert set(provider.terminated) == set(first.instance_ids)
    (ended,) = [e for e in eng.store.events(job.id) if e.cause is AttemptEnd.PREEMPTED]
    assert ended.detail.endswith("its provider cannot add a node to a running gang yet")


def test_every_shipped_provider_adds_nodes_to_a_gang() -> None:
    for provider in ("sim-aws", "sim-gcp", "sim-azure", "aws", "gcp", "azure"):
        assert repairing.replaces_gang_nodes(provider), provider
    assert not repairing.replaces_gang_nodes("fake")  # no kind describes it


@dataclass
class PlacingProvider(FakeProvider):
    """The scripted provider, making a placement object for each new gang as the clouds
    do (a join makes none: its nodes go into the gang's)."""

    placements: dict[str, PlacementObject] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)

    def launch(self, request: LaunchRequest) -> list[Instance]:
        if request.nodes > 1 and request.joins is None:
            pid = f"pg-{request.tags[TAG_ATTEMPT]}"
            self.placements[pid] = PlacementObject(pid, "group", "r1", dict(request.tags))
        return super().launch(request)

    def list_placements(self, tags: Mapping[str, str]) -> list[PlacementObject]:
        return [p for p in self.placements.values() if tags.items() <= p.tags.items()]

    def delete_placements(self, placements: Sequence[PlacementObject]) -> None:
        for placement in placements:
            self.deleted.append(placement.id)
            self.placements.pop(placement.id, None)


def test_a_replacement_joins_the_kept_gang_whose_placement_lives_until_the_gang_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(repairing, "replaces_gang_nodes", lambda provider: provider == "fake")
    provider = PlacingProvider()
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}")
    eng = Engine(store, {"fake": provider}, CheapestPolicy(), ManualClock(EPOCH),
                 EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"))  # fmt: skip
    job, first = running_gang(eng, "replace")  # after a preemption, auto would move
    kept = first.instance_ids[0]
    lose_node_1(eng, provider, first)
    passes(eng, job.id, JobStatus.PROVISIONING)
    origin = {TAG_JOB: job.id, TAG_ATTEMPT: "1", TAG_OWNER: "test"}
    assert provider.launched[-1].joins == GangRef(first.client_token, origin, (kept,))
    assert provider.launched[-1].nodes == 1 and provider.deleted == []
    # Repaired again, of the node kept the first time: the gang still lives in the first
    # attempt's placement, which no live node of attempt 1 holds now; the reaper keeps it.
    _, second = eng.store.attempts(job.id)
    assemble(eng, second)
    passes(eng, job.id, JobStatus.RUNNING)
    new = second.instance_ids[1]
    provider.states[kept] = InstanceState.PREEMPTED
    StoreReports(eng.store).exited(ExitReport(exit_code=143, **speaker(eng, second, new)))
    eng.clock.advance(1.0)  # type: ignore[attr-defined]
    DaemonRejoin(eng.store, "tok").next_step(RejoinAsk.model_validate(speaker(eng, second, new)))
    passes(eng, job.id, JobStatus.PROVISIONING)
    assert provider.launched[-1].joins == GangRef(first.client_token, origin, (new,))
    eng.reap()
    assert list(provider.placements) == ["pg-1"] and provider.deleted == []
    # When the gang ends, the placement its nodes were in goes with it.
    eng.request_cancel(job.id)
    passes(eng, job.id, JobStatus.CANCELLED)
    assert provider.deleted == ["pg-1"] and provider.placements == {}
    store.close()


def test_a_node_failing_its_own_preflight_check_is_replaced_and_the_other_kept(
    fake: tuple[Engine, FakeProvider],
) -> None:
    """Node 1's GPUs are not as offered: the gang's verdict names it; node 0 passed, stands
    by, and is kept at rank 0 while node 1 alone is stopped and relaunched."""
    eng, provider = fake
    job = eng.submit(spec(**gang()))
    passes(eng, job.id, JobStatus.PROVISIONING)
    (first,) = eng.store.attempts(job.id)
    kept, bad = first.instance_ids
    book = StoreReports(eng.store)
    verdict = PreflightFigures(passed=False, world_size=2, reason="node 1: 0 GPUs, 1 offered",
                               failed_rank=1, failed_check=PreflightCheckName.GPU_COUNT,
                               failed_reason=PreflightFailure.GPU_COUNT)  # fmt: skip
    for n, iid in enumerate(first.instance_ids):
        book.join(JoinReport(address=f"10.0.0.{n + 1}", ports=(29500, 29501),
                             **speaker(eng, first, iid)))  # fmt: skip
        book.preflight(PreflightReport(figures=verdict, **speaker(eng, first, iid)))
        book.exited(ExitReport(exit_code=76, phase="preflight", **speaker(eng, first, iid)))
    eng.clock.advance(1.0)  # type: ignore[attr-defined]
    ask = RejoinAsk.model_validate(speaker(eng, first, kept))
    assert DaemonRejoin(eng.store, "tok").next_step(ask).step is RejoinStep.WAIT

    job = passes(eng, job.id, JobStatus.PROVISIONING)
    closed, second = eng.store.attempts(job.id)
    assert closed.end_reason is AttemptEnd.PREFLIGHT_FAILED and closed.running_at is None
    assert second.instance_ids[0] == kept and second.instance_ids[1] not in first.instance_ids
    assert bad in provider.terminated and kept not in provider.terminated
    replaced = [e for e in eng.store.events(job.id) if e.cause is EventCause.NODE_REPLACED]
    assert replaced and "node 1" in replaced[0].detail and f"({kept}) kept" in replaced[0].detail
