"""The engine's handling of gangs' placement objects: deleted at attempt end, orphans reaped.

Against a scripted provider that keeps placement objects as a cloud would; each
cloud adapter's own placement objects are checked against its fake in the
Provider contract suite.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from engine_support import FakeProvider, spec

from spotd.core.contracts import PlacementHost
from spotd.core.errors import ProviderError
from spotd.core.states import JobStatus
from spotd.core.values import InstanceState, LaunchRequest, PlacementObject
from spotd.engine.reconcile import Engine
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB, TAG_OWNER, EngineSettings
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy


@dataclass
class PlacingProvider(FakeProvider):
    """A scripted provider that makes one placement object per multi-node launch."""

    placements: dict[str, PlacementObject] = field(default_factory=dict)
    refuse_deletes: int = 0
    """How many delete calls answer "still in use" before deletes go through."""

    def launch(self, request: LaunchRequest) -> list:  # type: ignore[type-arg]
        if request.nodes > 1:
            pid = f"pg-{request.tags[TAG_JOB]}-{request.tags[TAG_ATTEMPT]}"
            self.placements[pid] = PlacementObject(pid, "group", "r1", dict(request.tags))
        return super().launch(request)

    def list_placements(self, tags: Mapping[str, str]) -> list[PlacementObject]:
        return [p for p in self.placements.values()
                if all(p.tags.get(k) == v for k, v in tags.items())]  # fmt: skip

    def delete_placements(self, placements: Sequence[PlacementObject]) -> None:
        if self.refuse_deletes:
            self.refuse_deletes -= 1
            raise ProviderError("placement group in use", provider=self.name, code="InUse")
        for p in placements:
            self.placements.pop(p.id, None)


@pytest.fixture
def placing(tmp_path: Path) -> Iterator[tuple[Engine, PlacingProvider]]:
    from spotd_sim import SimClock

    provider = PlacingProvider()
    assert isinstance(provider, PlacementHost)
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}")
    eng = Engine(store, {"fake": provider}, CheapestPolicy(), SimClock(tmp_path / "c", 3600.0),
                 EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"))  # fmt: skip
    yield eng, provider
    store.close()


def _gang_launched(eng: Engine) -> str:
    job = eng.submit(
        spec(resources={"gpus": ["A100"], "gpus_per_node": 1, "nodes": 2, "min_gbps_per_gpu": 10})
    )
    for _ in range(20):
        eng.tick()
        attempts = eng.store.attempts(job.id)
        if attempts and attempts[-1].instance_ids:
            return job.id
    raise AssertionError("the gang was never launched")


def test_an_ended_attempts_placement_is_deleted_with_its_nodes(
    placing: tuple[Engine, PlacingProvider],
) -> None:
    eng, provider = placing
    job_id = _gang_launched(eng)
    assert len(provider.list_placements({TAG_JOB: job_id})) == 1
    eng.request_cancel(job_id)
    eng.tick()
    assert provider.list_placements({TAG_JOB: job_id}) == []
    (attempt,) = eng.store.attempts(job_id)
    assert all(provider.states[i] is InstanceState.TERMINATED for i in attempt.instance_ids)


def test_a_placement_still_in_use_is_deleted_by_a_later_reap(
    placing: tuple[Engine, PlacingProvider],
) -> None:
    eng, provider = placing
    job_id = _gang_launched(eng)
    provider.refuse_deletes = 1
    eng.request_cancel(job_id)
    eng.tick()
    assert len(provider.list_placements({TAG_JOB: job_id})) == 1, "refused, kept for the reaper"
    eng.reap()
    assert provider.list_placements({TAG_JOB: job_id}) == []


def test_the_reaper_deletes_placements_no_attempt_owns_once_their_nodes_are_gone(
    placing: tuple[Engine, PlacingProvider],
) -> None:
    eng, provider = placing
    tags = {TAG_JOB: "j-gone", TAG_ATTEMPT: "1", TAG_OWNER: "test"}
    provider.placements["pg-orphan"] = PlacementObject("pg-orphan", "group", "r1", tags)
    provider.states["i-orphan"] = InstanceState.RUNNING
    provider.tags["i-orphan"] = tags
    other = {**tags, TAG_OWNER: "another-daemon"}
    provider.placements["pg-theirs"] = PlacementObject("pg-theirs", "group", "r1", other)

    assert eng.reap() == 1, "the orphaned node is stopped first"
    assert "pg-orphan" in provider.placements, "its placement still held a live node"
    eng.reap()
    assert "pg-orphan" not in provider.placements
    assert "pg-theirs" in provider.placements, "another owner's objects are left alone"


def test_the_reaper_keeps_the_placement_of_an_open_attempt(
    placing: tuple[Engine, PlacingProvider],
) -> None:
    eng, provider = placing
    job_id = _gang_launched(eng)
    for iid in eng.store.attempts(job_id)[-1].instance_ids:
        provider.states[iid] = InstanceState.PENDING
    eng.reap()
    assert len(provider.list_placements({TAG_JOB: job_id})) == 1
    assert eng.store.get_job(job_id).status in (JobStatus.PROVISIONING, JobStatus.RUNNING)


def test_a_failed_launch_releases_the_placement_it_made(
    placing: tuple[Engine, PlacingProvider],
) -> None:
    from spotd.core.errors import CapacityError

    eng, provider = placing

    original = provider.launch

    def half_launch(request: LaunchRequest) -> list:  # type: ignore[type-arg]
        original(request)  # the placement and the nodes' records are made...
        raise CapacityError("not all nodes", provider="fake")  # ...but the cloud says no

    provider.launch = half_launch  # type: ignore[method-assign]
    job = eng.submit(
        spec(resources={"gpus": ["A100"], "gpus_per_node": 1, "nodes": 2, "min_gbps_per_gpu": 10})
    )
    eng.tick()
    first = eng.store.attempts(job.id)[0]
    assert not first.open
    assert provider.list_placements({TAG_JOB: job.id, TAG_ATTEMPT: str(first.seq)}) == []
