"""Why a job waits: the reason on the job and in its events, once per change, and the
warning at submit for a spec no offering can ever run."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from engine_support import FakeProvider, StepClock, spec

from spotd.core.errors import CapacityError
from spotd.core.network import Fabric, Interconnect
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import Candidate, Decision, JobRecord, Offering, PlacementContext, Pool
from spotd.daemon.reader import Planner
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies.balanced import BalancedPolicy
from spotd_policies.cheapest import CheapestPolicy


@dataclass
class Shelf(FakeProvider):
    """The scripted provider, with the node sizes, spot capacity and prices a test sets."""

    sizes: tuple[int, ...] = (1,)
    capacity: float = 1.0
    price_factor: float = 1.0

    def offerings(self) -> list[Offering]:
        return [
            Offering(
                pool=Pool(self.name, region, f"{region}{zone}", f"x{n}.gpu"),
                gpu="A100", gpus_per_node=n, gpu_memory_gb=80,
                interconnect=Interconnect(Fabric.ETHERNET, 25),
                spot_price=price * n * self.price_factor, on_demand_price=3.0 * n,
                capacity=self.capacity,
            )
            for n in self.sizes
            for region, zone, price in (("r1", "a", 1.0), ("r1", "b", 1.1), ("r2", "a", 1.2))
        ]  # fmt: skip


def warning(eng: Engine, job: JobSpec) -> str | None:
    """What a submit of ``job`` to this engine's daemon warns of (its planner, with the
    engine's policy)."""
    return Planner(eng.policy, eng.store, eng.market, eng.clock, eng.settings).submit_warning(job)


@pytest.fixture
def shelf(tmp_path: Path) -> Iterator[tuple[Engine, Shelf, StepClock]]:
    provider = Shelf()
    clock = StepClock()
    store = open_store(f"sqlite:///{tmp_path / 'w.db'}")
    settings = EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck", cooldown_hours=0.5)
    eng = Engine(store, {provider.name: provider}, CheapestPolicy(), clock, settings)
    yield eng, provider, clock
    store.close()


def _waits(eng: Engine, job: JobRecord) -> list[str]:
    """The details of the job's waiting events, in order."""
    return [e.detail for e in eng.store.events(job.id) if e.cause == "waiting"]


def _ticks(eng: Engine, n: int) -> None:
    for _ in range(n):
        eng.tick()


def test_a_node_size_nobody_offers_says_so(shelf: tuple[Engine, Shelf, StepClock]) -> None:
    eng, provider, _ = shelf
    provider.sizes = (1, 2, 4, 8)
    job = eng.submit(spec(resources={"gpus": ["A100"], "gpus_per_node": 3}))
    _ticks(eng, 4)
    stored = eng.store.get_job(job.id)
    reason = "no offering has 3 A100 GPUs per node (offered: 1, 2, 4, 8)"
    assert stored.status is JobStatus.PENDING
    assert stored.waiting == reason
    assert _waits(eng, job) == [reason]  # said once, not on each of the four passes
    last = eng.store.events(job.id)[-1]
    assert (last.from_status, last.to_status) == (JobStatus.PENDING, JobStatus.PENDING)
    # The submit of the same spec now warns (the market has answered a poll).
    assert warning(eng, job.spec) == reason


def test_a_budget_below_any_plan_says_the_cheapest(shelf: tuple[Engine, Shelf, StepClock]) -> None:
    eng, _, _ = shelf
    job = eng.submit(spec(budget={"max_usd": 0.5}))
    _ticks(eng, 3)
    stored = eng.store.get_job(job.id)
    assert stored.status is JobStatus.PENDING
    # One hour of the cheapest pool (the cheapest policy's estimate without a deadline).
    assert stored.waiting == "every plan costs more than the 0.50 USD budget (cheapest 1.00 USD)"
    assert _waits(eng, job) == [stored.waiting]
    # Prices may move: a budget is no static need, so the submit warns of nothing.
    assert warning(eng, job.spec) is None


def test_no_capacity_waits_then_clears_when_placed(shelf: tuple[Engine, Shelf, StepClock]) -> None:
    eng, provider, _ = shelf
    provider.capacity = 0.0
    job = eng.submit(spec())
    _ticks(eng, 3)
    stored = eng.store.get_job(job.id)
    assert stored.waiting == "no spot capacity in the 3 pools that fit"
    assert _waits(eng, job) == [stored.waiting]
    assert warning(eng, job.spec) is None  # capacity comes back
    provider.capacity = 1.0
    eng.market.refresh_all()  # the daemon's price poll
    eng.tick()
    placed = eng.store.get_job(job.id)
    assert placed.status is JobStatus.PROVISIONING
    assert placed.waiting is None
    assert [e.cause for e in eng.store.events(job.id)][-2:] == ["waiting", "placed"]


def test_cooling_pools_say_until_when(shelf: tuple[Engine, Shelf, StepClock]) -> None:
    eng, provider, clock = shelf
    refused = CapacityError("no spot capacity", provider="fake")
    provider.launch_errors = [refused, refused]
    job = eng.submit(spec())
    _ticks(eng, 2)  # r1 refuses, then r2: both regions cool down for half an hour
    _ticks(eng, 2)
    stored = eng.store.get_job(job.id)
    assert stored.status is JobStatus.RECOVERING
    assert stored.waiting == "3 pools that fit cooling down until 00:30 UTC after no-capacity"
    last = eng.store.events(job.id)[-1]
    assert (last.cause, last.from_status, last.to_status) == (
        "waiting", JobStatus.RECOVERING, JobStatus.RECOVERING,
    )  # fmt: skip
    assert len(_waits(eng, job)) == 1
    clock.at += timedelta(hours=1)
    eng.tick()
    placed = eng.store.get_job(job.id)
    assert placed.status is JobStatus.PROVISIONING and placed.waiting is None


def test_an_event_per_change_of_reason_not_per_pass(
    shelf: tuple[Engine, Shelf, StepClock],
) -> None:
    eng, provider, _ = shelf
    job = eng.submit(spec(budget={"max_usd": 0.5}))
    eng.tick()
    first = eng.store.get_job(job.id)
    # The prices move: the cheapest plan with them, not the reason. Nothing is written,
    # and the job's version stays where the first reason left it.
    provider.price_factor = 1.2
    eng.market.refresh_all()
    _ticks(eng, 3)
    assert eng.store.get_job(job.id).version == first.version
    assert _waits(eng, job) == [first.waiting]
    # Another reason is another event.
    provider.capacity = 0.0
    eng.market.refresh_all()
    _ticks(eng, 3)
    assert _waits(eng, job) == [first.waiting, "no spot capacity in the 3 pools that fit"]
    # A restarted engine (or another daemon) reads the reason said: it says it no more.
    again = Engine(eng.store, eng.providers, eng.policy, eng.clock, eng.settings)
    _ticks(again, 2)
    assert len(_waits(eng, job)) == 2


def test_a_restart_does_not_repeat_a_reason_with_figures(
    shelf: tuple[Engine, Shelf, StepClock],
) -> None:
    eng, provider, _ = shelf
    job = eng.submit(spec(budget={"max_usd": 0.5}))
    eng.tick()
    provider.price_factor = 1.2  # a new engine sees other figures than the stored text
    again = Engine(eng.store, eng.providers, eng.policy, eng.clock, eng.settings)
    _ticks(again, 2)
    assert len(_waits(eng, job)) == 1


def test_the_submit_warns_only_of_what_no_offering_can_run(
    shelf: tuple[Engine, Shelf, StepClock],
) -> None:
    eng, provider, _ = shelf
    provider.sizes = (1, 8)
    three = spec(resources={"gpus": ["A100"], "gpus_per_node": 3})
    # Before the first price poll nobody can tell: no warning, and no poll in the submit.
    assert warning(eng, three) is None
    eng.market.refresh_all()
    assert warning(eng, three) == "no offering has 3 A100 GPUs per node (offered: 1, 8)"
    assert warning(eng, spec()) is None
    # A region the market has no offering in: static too.
    far = spec(market={"regions": ["eu-*"]})
    assert warning(eng, far) == (
        "every offering that fits is ruled out: 2 regions not in market.regions"
    )
    # Four nodes on 25 Gbps ethernet: no offering has the fabric such a gang needs.
    gang = spec(resources={"gpus": ["A100"], "gpus_per_node": 8, "nodes": 4})
    assert warning(eng, gang) == (
        "every offering that fits is ruled out: scale-out fabric too slow for a 4-node job "
        "(fastest of them 25 Gbps/GPU)"
    )
    # The balanced policy's near misses say the same.
    eng.policy = BalancedPolicy()
    assert warning(eng, three) == "no offering has 3 A100 GPUs per node (offered: 1, 8)"


class CountingPolicy:
    """The cheapest policy, counting how often a decision's near misses are walked."""

    name = "counting"

    def __init__(self) -> None:
        self.inner = CheapestPolicy()
        self.walks = 0

    def place(self, ctx: PlacementContext, offerings: Sequence[Offering]) -> Decision:
        decision = self.inner.place(ctx, offerings)

        def near() -> tuple[Candidate, ...]:
            self.walks += 1
            return decision.near_misses()

        return Decision(decision.choice, decision.candidates, near=near)


def test_a_waiting_job_is_explained_again_only_when_the_market_changed(tmp_path: Path) -> None:
    provider = Shelf(capacity=0.0)
    policy = CountingPolicy()
    store = open_store(f"sqlite:///{tmp_path / 'w.db'}")
    eng = Engine(store, {provider.name: provider}, policy, StepClock(),
                 EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"))  # fmt: skip
    job = eng.submit(spec())
    _ticks(eng, 4)
    # Placed every pass (the market may have room now), explained once: nothing changed.
    assert policy.walks == 1
    eng.market.refresh_all()  # a price poll: a new market
    _ticks(eng, 2)
    assert policy.walks == 2
    assert _waits(eng, job) == ["no spot capacity in the 3 pools that fit"]
    store.close()
