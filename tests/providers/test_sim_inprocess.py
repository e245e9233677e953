"""The in-process simulated market: the simulator's market, nodes moved by a test's clock."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import fsspec
import pytest

from spotd import checkpoints
from spotd.core.agent_wire import (
    ExitReport,
    HeartbeatReport,
    JoinReport,
    NoticeReport,
    PreflightReport,
)
from spotd.core.clock import ManualClock
from spotd.core.errors import CapacityError, ProviderError
from spotd.core.values import Instance, InstanceState, LaunchRequest, Market, Offering
from spotd.exits import kept_exits
from spotd.market.catalog import billed_seconds
from spotd_sim import (
    InProcessSimProvider,
    TrainingPlan,
    TrainingWorkload,
    build_inprocess_providers,
    build_sim_providers,
)
from spotd_sim.inprocess_node import EXIT_KILLED

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
STEP = 60.0
R = TypeVar("R")


@dataclass
class Recorder:
    """A report sink that keeps every report, in order."""

    reports: list[object] = field(default_factory=list)

    def heartbeat(self, report: HeartbeatReport) -> None:
        self.reports.append(report)

    def join(self, report: JoinReport) -> None:
        self.reports.append(report)

    def preflight(self, report: PreflightReport) -> None:
        self.reports.append(report)

    def notice(self, report: NoticeReport) -> None:
        self.reports.append(report)

    def exited(self, report: ExitReport) -> None:
        self.reports.append(report)

    def of(self, kind: type[R]) -> list[R]:
        return [r for r in self.reports if isinstance(r, kind)]


@dataclass
class Sim:
    clock: ManualClock
    providers: list[InProcessSimProvider]
    sink: Recorder

    @property
    def aws(self) -> InProcessSimProvider:
        return self.providers[0]

    @property
    def gcp(self) -> InProcessSimProvider:
        return self.providers[1]

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)


def make_market(**kw: object) -> Sim:
    clock = ManualClock(EPOCH)
    sink = Recorder()
    options: dict[str, object] = {
        "seed": 1, "mean_up_hours": 1000.0, "mean_down_hours": 1.0, "boot_seconds": 0.0,
        "reports": sink,
        "workloads": TrainingWorkload.factory(TrainingPlan(work_hours=1.0, step_seconds=STEP)),
    }  # fmt: skip
    options.update(kw)
    return Sim(clock, build_inprocess_providers(clock, **options), sink)  # type: ignore[arg-type]


@pytest.fixture
def market() -> Sim:
    return make_market()


@pytest.fixture
def ckpt() -> Iterator[str]:
    root = f"spotd-inprocess-test-{uuid.uuid4().hex}"
    yield f"memory://{root}/ckpt"
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def spot_offering(provider: InProcessSimProvider, gpus: int = 1) -> Offering:
    return next(o for o in provider.offerings()
                if o.capacity and o.gpus_per_node == gpus and o.price(Market.SPOT))  # fmt: skip


def request(
    provider: InProcessSimProvider,
    *,
    token: str = "tok-1",
    nodes: int = 1,
    market: Market = Market.SPOT,
    offering: Offering | None = None,
    **env: str,
) -> LaunchRequest:
    return LaunchRequest(
        offering=offering or spot_offering(provider),
        market=market,
        nodes=nodes,
        client_token=token,
        tags={"spotd-job": "j-1", "spotd-attempt": "1"},
        command=("python", "train.py"),
        env={"SPOTD_JOB_ID": "j-1", "SPOTD_ATTEMPT": "1", **env},
    )


def one(provider: InProcessSimProvider, instance_id: str) -> Instance:
    (found,) = provider.describe([instance_id])
    return found


# -- the market: the simulator's, for the same seed ------------------------------------


def test_offers_what_the_process_market_offers_at_the_same_moment(tmp_path: Path) -> None:
    wall = [1000.0]
    sims = build_sim_providers(
        tmp_path / "sim", seed=5, speed=60.0, mean_up_hours=2.0, mean_down_hours=1.0,
        boot_seconds=0, sim_epoch=EPOCH, wall=lambda: wall[0],
    )  # fmt: skip
    clock = ManualClock(EPOCH)
    inproc = build_inprocess_providers(clock, seed=5, mean_up_hours=2.0, mean_down_hours=1.0)
    for hours in (0.0, 1.5, 7.25, 30.0):
        wall[0] = 1000.0 + hours * 3600 / 60.0
        clock.advance(hours * 3600 - (clock.now() - EPOCH).total_seconds())
        assert sims[0].clock.now() == clock.now()
        for sim, mine in zip(sims, inproc, strict=True):
            assert mine.name == sim.name
            assert mine.offerings() == sim.offerings()
    assert any(o.capacity == 0.0 for p in inproc for o in p.offerings())  # pools do run short


def test_check_cloud_checks_the_request_as_the_simulator_does(market: Sim) -> None:
    assert [o.ok for o in market.aws.check_cloud(None).outcomes] == [True]
    check = market.aws.check_cloud(request(market.aws, nodes=2))
    assert all(o.ok for o in check.outcomes)
    assert check.outcomes[-1].detail.startswith("2 x ")


# -- launch, describe, list, terminate ------------------------------------------------


def test_nothing_moves_until_the_clock_does() -> None:
    m = make_market(boot_seconds=300.0)
    (inst,) = m.aws.launch(request(m.aws))
    for _ in range(5):
        assert one(m.aws, inst.id).state is InstanceState.PENDING
    m.advance(299)
    assert one(m.aws, inst.id).state is InstanceState.PENDING
    m.advance(1)
    assert one(m.aws, inst.id).state is InstanceState.RUNNING
    assert inst.launched_at == EPOCH and inst.private_address


def test_a_launch_is_idempotent_by_client_token(market: Sim) -> None:
    first = market.aws.launch(request(market.aws, token="same", nodes=2))
    market.advance(600)
    again = market.aws.launch(request(market.aws, token="same", nodes=2))
    assert [i.id for i in again] == [i.id for i in first]
    assert len(market.aws.list_instances({"spotd-job": "j-1"})) == 2
    assert len({i.private_address for i in first}) == 2


def test_list_by_tags_describe_and_unknown_ids(market: Sim) -> None:
    (inst,) = market.aws.launch(request(market.aws))
    assert [i.id for i in market.aws.list_instances({"spotd-attempt": "1"})] == [inst.id]
    assert market.aws.list_instances({"spotd-job": "another"}) == []
    assert market.gcp.list_instances({}) == []  # each provider sees its own nodes
    assert market.aws.describe(["nope", inst.id]) == market.aws.describe([inst.id])
    assert market.gcp.describe([inst.id]) == []
    assert market.aws.logs("nope") == ""


def test_no_spot_capacity_refuses_the_launch() -> None:
    m = make_market(mean_up_hours=1.0, mean_down_hours=1.0)
    down = next(o for o in m.aws.offerings() if o.capacity == 0.0)
    with pytest.raises(CapacityError) as err:
        m.aws.launch(request(m.aws, offering=down))
    assert err.value.provider == "sim-aws"
    assert m.aws.list_instances({}) == []
    # On demand never runs short.
    (inst,) = m.aws.launch(request(m.aws, offering=down, market=Market.ON_DEMAND, token="od"))
    assert inst.market is Market.ON_DEMAND


@pytest.mark.parametrize(
    "change",
    [{"nodes": 0}, {"command": ()}, {"env": {"SPOTD_SIM_WORK_HOURS": "many"}}],
    ids=["no-node", "no-command", "bad-work"],
)
def test_a_request_no_node_could_run_is_refused(market: Sim, change: dict[str, object]) -> None:
    bad = replace(request(market.aws), **change)  # type: ignore[arg-type]
    with pytest.raises(ProviderError) as err:
        market.aws.launch(bad)
    assert err.value.code == "InvalidParameter"
    assert market.aws.list_instances({}) == []


def test_terminate_a_booting_and_a_running_node(ckpt: str) -> None:
    m = make_market(boot_seconds=300.0)
    (booting,) = m.aws.launch(request(m.aws, token="a"))
    (running,) = m.aws.launch(request(m.aws, token="b", SPOTD_CHECKPOINT_URI=ckpt))
    m.advance(300 + 2.5 * STEP)
    m.aws.terminate([running.id, "nope"])
    assert one(m.aws, running.id).state is InstanceState.TERMINATED
    assert one(m.aws, running.id).exit_code == 143  # the job stopped on the signal
    assert one(m.aws, running.id).ended_at == m.clock.now()
    assert checkpoints.latest_complete(ckpt).step == 2  # type: ignore[union-attr]
    m.aws.launch(request(m.aws, token="c"))
    (late,) = [i for i in m.aws.list_instances({}) if i.state is InstanceState.PENDING]
    m.aws.terminate([late.id])
    assert one(m.aws, late.id).state is InstanceState.TERMINATED
    assert one(m.aws, late.id).exit_code is None
    m.aws.terminate([late.id])  # again: ignored
    assert booting.id != late.id


def test_a_stalled_node_never_boots() -> None:
    m = make_market(boot_seconds=300.0)
    (inst,) = m.aws.launch(request(m.aws))
    m.advance(100)
    m.aws.stall(inst.id)
    m.advance(24 * 3600)
    assert one(m.aws, inst.id).state is InstanceState.PENDING
    assert m.sink.reports == []
    m.aws.terminate([inst.id])
    assert one(m.aws, inst.id).state is InstanceState.TERMINATED


# -- the job: progress, checkpoints, its end ------------------------------------------


def test_the_job_runs_to_its_end_with_reports_and_checkpoints(market: Sim, ckpt: str) -> None:
    (inst,) = market.aws.launch(request(market.aws, SPOTD_CHECKPOINT_URI=ckpt,
                                        SPOTD_CHECKPOINT_INTERVAL_SECONDS="600"))  # fmt: skip
    market.advance(3600 - 1)
    assert one(market.aws, inst.id).state is InstanceState.RUNNING
    market.advance(1)
    done = one(market.aws, inst.id)
    assert (done.state, done.exit_code, done.ended_at) == (
        InstanceState.EXITED, 0, EPOCH + timedelta(hours=1))
    steps = [c.step for c in checkpoints.list_complete(ckpt)]
    assert steps == [10, 20, 30, 40, 50, 60]
    beats = market.sink.of(HeartbeatReport)
    assert [b.at for b in beats] == [EPOCH + timedelta(minutes=5 * n) for n in range(12)]
    assert beats[-1].step == 55 and beats[-1].total_steps == 60
    (exit_,) = market.sink.of(ExitReport)
    assert (exit_.exit_code, exit_.at, exit_.instance_id) == (0, done.ended_at, inst.id)
    assert exit_.provider == "sim-aws" and exit_.job_id == "j-1" and exit_.attempt == 1
    assert kept_exits(ckpt, "j-1", 1)[inst.id].exit.exit_code == 0
    log = market.aws.logs(inst.id)
    assert "fresh start" in log and "done: 60 steps" in log


def test_a_resumed_attempt_starts_from_its_checkpoint(market: Sim, ckpt: str) -> None:
    (first,) = market.aws.launch(request(market.aws, SPOTD_CHECKPOINT_URI=ckpt,
                                         SPOTD_CHECKPOINT_INTERVAL_SECONDS="600"))  # fmt: skip
    market.advance(25 * STEP)
    market.aws.terminate([first.id])
    latest = checkpoints.latest_complete(ckpt)
    assert latest is not None and latest.step == 25
    (second,) = market.aws.launch(request(market.aws, token="tok-2",
                                          SPOTD_CHECKPOINT_URI=ckpt,
                                          SPOTD_RESUME_FROM=latest.uri))  # fmt: skip
    market.advance(35 * STEP)
    assert one(market.aws, second.id).state is InstanceState.EXITED
    assert "resumed from step 25" in market.aws.logs(second.id)
    state = json.loads(checkpoints.read_bytes(f"{ckpt}/step-00000060/state.json"))
    assert state == {"step": 60, "total_steps": 60}


def test_a_configured_exit_code_ends_the_job(market: Sim) -> None:
    (inst,) = market.aws.launch(request(market.aws, SPOTD_SIM_EXIT_CODE="3",
                                        SPOTD_SIM_WORK_HOURS="0.1"))  # fmt: skip
    market.advance(3600)
    done = one(market.aws, inst.id)
    assert (done.state, done.exit_code) == (InstanceState.EXITED, 3)
    assert done.ended_at == EPOCH + timedelta(minutes=6)


# -- the market takes nodes back --------------------------------------------------------


def test_a_pool_running_short_gives_notice_then_takes_the_node(ckpt: str) -> None:
    m = make_market(mean_up_hours=2.0, mean_down_hours=1.0)
    offering = spot_offering(m.aws)
    lost = m.aws.market.next_change(offering.pool, EPOCH)
    assert lost is not None
    (inst,) = m.aws.launch(request(m.aws, offering=offering, SPOTD_CHECKPOINT_URI=ckpt,
                                   SPOTD_SIM_WORK_HOURS="1000"))  # fmt: skip
    m.advance((lost - EPOCH).total_seconds() - 1)
    assert one(m.aws, inst.id).state is InstanceState.RUNNING
    m.advance(1)
    assert one(m.aws, inst.id).state is InstanceState.NOTICE
    (notice,) = m.sink.of(NoticeReport)
    assert notice.at == lost
    assert notice.deadline == lost + timedelta(seconds=120)
    m.advance(STEP)
    gone = one(m.aws, inst.id)
    assert (gone.state, gone.exit_code) == (InstanceState.PREEMPTED, 143)
    boundary = int((lost - EPOCH).total_seconds() // STEP) + 1
    assert gone.ended_at == EPOCH + timedelta(seconds=boundary * STEP)
    assert checkpoints.latest_complete(ckpt).step == boundary  # type: ignore[union-attr]
    kept = kept_exits(ckpt, "j-1", 1)[inst.id]
    assert kept.notice is not None and kept.stopped and kept.exit.exit_code == 143


def test_a_notice_shorter_than_a_step_kills_the_job(market: Sim) -> None:
    (inst,) = market.gcp.launch(request(market.gcp))  # 30 s of notice
    market.advance(1)
    market.gcp.reclaim(inst.id)
    market.advance(29)
    assert one(market.gcp, inst.id).state is InstanceState.NOTICE
    market.advance(1)
    gone = one(market.gcp, inst.id)
    assert (gone.state, gone.exit_code) == (InstanceState.PREEMPTED, EXIT_KILLED)
    assert gone.ended_at == EPOCH + timedelta(seconds=31)
    assert market.sink.of(ExitReport) == []  # the agent went with the node


def test_a_node_taken_back_while_booting() -> None:
    m = make_market(boot_seconds=600.0)
    (inst,) = m.aws.launch(request(m.aws))
    m.advance(10)
    m.aws.reclaim(inst.id)
    gone = one(m.aws, inst.id)
    assert (gone.state, gone.exit_code, gone.ended_at) == (
        InstanceState.PREEMPTED, None, EPOCH + timedelta(seconds=10))
    assert m.sink.reports == []


def test_on_demand_nodes_are_never_taken_back(market: Sim) -> None:
    (inst,) = market.aws.launch(request(market.aws, market=Market.ON_DEMAND))
    market.aws.reclaim(inst.id)
    market.advance(600)
    assert one(market.aws, inst.id).state is InstanceState.RUNNING


def test_lifetimes_end_each_launch_as_the_simulator_does() -> None:
    m = make_market(lifetimes=True, mean_up_hours=0.5)
    offering = spot_offering(m.aws)
    ids = []
    for n in range(3):
        (inst,) = m.aws.launch(request(m.aws, token=f"t{n}", offering=offering,
                                       SPOTD_SIM_WORK_HOURS="1000"))  # fmt: skip
        ids.append(inst.id)
    m.advance(48 * 3600)
    m.aws.settle()  # nodes move when the provider is asked: it asks them
    for n, iid in enumerate(ids):
        notice = next(r for r in m.sink.of(NoticeReport) if r.instance_id == iid)
        assert notice.at == EPOCH + m.aws.market.lifetime(offering.pool, n)


# -- gangs, meter, determinism ----------------------------------------------------------


def test_a_gang_joins_and_passes_preflight_as_it_starts(market: Sim, ckpt: str) -> None:
    offering = spot_offering(market.aws, gpus=8)
    nodes = market.aws.launch(request(market.aws, nodes=2, offering=offering, SPOTD_RDZV_ID="r",
                                      SPOTD_NUM_NODES="2", SPOTD_CHECKPOINT_URI=ckpt))  # fmt: skip
    market.advance(10 * STEP)
    market.aws.settle()
    joins = market.sink.of(JoinReport)
    assert sorted(j.instance_id for j in joins) == sorted(n.id for n in nodes)
    assert {j.address for j in joins} == {n.private_address for n in nodes}
    preflights = market.sink.of(PreflightReport)
    assert all(p.figures.passed and p.figures.world_size == 2 for p in preflights)
    assert len(preflights) == 2
    # Only rank 0 checkpoints and reports progress.
    beats = {b.instance_id: b for b in market.sink.of(HeartbeatReport)}
    assert beats[nodes[0].id].step == 10 and beats[nodes[1].id].step is None


def test_the_meter_bills_from_launch_to_end_at_the_launch_price(market: Sim) -> None:
    offering = spot_offering(market.aws)
    (inst,) = market.aws.launch(request(market.aws, offering=offering, SPOTD_SIM_WORK_HOURS="0.5"))
    market.advance(3600)
    usage = market.aws.usage([inst.id, "nope"])
    assert list(usage) == [inst.id]
    node = usage[inst.id]
    assert (node.launched_at, node.ended_at) == (EPOCH, EPOCH + timedelta(minutes=30))
    assert node.price_per_hour == offering.spot_price
    seconds = billed_seconds("sim-aws", 1800.0)
    assert market.aws.bill([inst.id]) == round(offering.spot_price * seconds / 3600, 2)  # type: ignore[operator]
    assert market.gcp.bill([inst.id]) == 0.0


def test_the_same_calls_give_the_same_history() -> None:
    def history() -> list[Instance]:
        m = make_market(mean_up_hours=0.5, mean_down_hours=0.5)
        for n in range(6):
            with contextlib.suppress(CapacityError):
                m.aws.launch(request(m.aws, token=f"t{n}", SPOTD_SIM_WORK_HOURS="2"))
            m.advance(1800)
        return m.aws.list_instances({})

    first = history()
    assert first and first == history()
