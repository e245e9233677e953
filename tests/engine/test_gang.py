"""spotd.engine.gang: the roster only for a whole gang, stable ranks, the gang's verdict."""

from __future__ import annotations

from engine_support import EPOCH
from hypothesis import given
from hypothesis import strategies as st

from spotd.core.agent_wire import PreflightFigures, Roster, Waiting
from spotd.core.spec import JobSpec
from spotd.core.values import AttemptRecord, InstanceReport, Market, Offering, Pool
from spotd.engine.gang import (
    assembly_seconds,
    attempt_reports,
    gang_environment,
    gang_state,
    preflight_summary,
    preflight_threshold,
    roster_for,
)
from spotd_sim import catalog
from spotd_sim.catalog import CatalogEntry

POOL = Pool("sim-aws", "us-east-1", "us-east-1a", "p4d.24xlarge")


def attempt(nodes: int = 3, seq: int = 1) -> AttemptRecord:
    return AttemptRecord(
        id=seq, job_id="j-1", seq=seq, pool=POOL, market=Market.SPOT, nodes=nodes,
        price_per_node_hour=10.0, client_token=f"j-1-a{seq}",
        instance_ids=tuple(f"i-{n}" for n in range(nodes)), resume_from=None,
        started_at=EPOCH, running_at=None, ended_at=None, end_reason=None,
    )  # fmt: skip


def joined(iid: str, address: str, *, seq: int = 1, **extra: object) -> InstanceReport:
    return InstanceReport(
        instance_id=iid, provider="sim-aws", job_id="j-1", attempt=seq, address=address,
        ports="29500,29501", joined_at=EPOCH, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def spec(**extra: object) -> JobSpec:
    body: dict[str, object] = {
        "name": "g",
        "command": ["true"],
        "resources": {"gpus": ["A100"], "gpus_per_node": 8, "nodes": 2},
    }
    body.update(extra)
    return JobSpec.model_validate(body)


def test_no_roster_until_every_node_joined() -> None:
    a = attempt(3)
    partial = attempt_reports(a, [joined("i-0", "127.100.1.1"), joined("i-2", "127.100.1.3")])
    assert roster_for(a, partial, "i-0") == Waiting(joined=2, nodes=3)


def test_ranks_follow_the_launch_order_whoever_asks_first() -> None:
    a = attempt(3)
    reports = [joined("i-2", "10.0.0.3"), joined("i-0", "10.0.0.1"), joined("i-1", "10.0.0.2")]
    own = attempt_reports(a, reports)
    rosters = {i: roster_for(a, own, i) for i in ("i-1", "i-2", "i-0")}
    assert all(isinstance(r, Roster) for r in rosters.values())
    assert [r.rank for r in rosters.values()] == [1, 2, 0]  # type: ignore[union-attr]
    first = rosters["i-0"]
    assert isinstance(first, Roster)
    assert first.addresses == ("10.0.0.1", "10.0.0.2", "10.0.0.3")
    master = (first.master_addr, first.master_port, first.preflight_port)
    assert master == ("10.0.0.1", 29500, 29501)
    assert first.rdzv_id == "j-1-a1"


def test_reports_of_another_attempt_or_instance_do_not_count() -> None:
    a = attempt(2, seq=2)
    reports = [
        joined("i-0", "10.0.0.1", seq=1),  # the same id in an earlier attempt's numbering
        joined("i-9", "10.0.0.9", seq=2),  # not one of this attempt's nodes
        joined("i-1", "10.0.0.2", seq=2),
    ]
    own = attempt_reports(a, reports)
    assert set(own) == {"i-1"}
    assert roster_for(a, own, "i-1") == Waiting(joined=1, nodes=2)
    assert roster_for(a, own, "i-9") == Waiting(joined=1, nodes=2)


@given(st.permutations(range(4)))
def test_every_node_gets_the_same_roster_but_its_rank(order: list[int]) -> None:
    a = attempt(4)
    reports = [joined(f"i-{n}", f"10.0.0.{n + 1}") for n in order]
    own = attempt_reports(a, reports)
    rosters = [roster_for(a, own, f"i-{n}") for n in range(4)]
    assert [r.rank for r in rosters if isinstance(r, Roster)] == [0, 1, 2, 3]
    assert len({r.model_copy(update={"rank": 0}) for r in rosters}) == 1


def test_a_failed_preflight_on_any_node_is_the_gang_verdict() -> None:
    a = attempt(2)
    ok = PreflightFigures(passed=True, busbw_gbps=3.0).model_dump_json()
    bad = PreflightFigures(passed=False, busbw_gbps=3.0, reason="bus bandwidth low")
    reports = [
        joined("i-0", "10.0.0.1", preflight=ok, command_at=EPOCH),
        joined("i-1", "10.0.0.2", preflight=bad.model_dump_json()),
    ]
    state = gang_state(a, reports)
    assert state.preflight == bad
    assert (state.joined, state.started) == (2, 1)
    assert not state.assembled(2)


def test_a_gang_is_assembled_when_every_node_started_the_command() -> None:
    a = attempt(2)
    ok = PreflightFigures(passed=True).model_dump_json()
    reports = [joined(f"i-{n}", "x", preflight=ok, command_at=EPOCH) for n in range(2)]
    assert gang_state(a, reports).assembled(2)


def test_environment_before_boot_carries_torchrun_and_preflight_variables() -> None:
    entry = next(e for e in catalog.entries("sim-aws") if e.pool.instance_type == "p4d.24xlarge")
    offering = _offering(entry)
    env = gang_environment(spec(gang={"master_port": 29400}), attempt(2), offering)
    assert env["PET_NNODES"] == "2"
    assert env["PET_RDZV_ID"] == env["SPOTD_RDZV_ID"] == "j-1-a1"
    assert env["PET_MASTER_PORT"] == env["SPOTD_MASTER_PORT"] == "29400"
    assert env["SPOTD_PREFLIGHT"] == "1"
    assert env["SPOTD_EXPECT_GPUS"] == "8" and env["SPOTD_EXPECT_GPU_MODEL"] == "A100"
    assert env["SPOTD_PREFLIGHT_THRESHOLD_SOURCE"] == "fabric"
    assert float(env["SPOTD_PREFLIGHT_MIN_BUSBW_GBPS"]) > 0


def test_the_jobs_threshold_wins_and_one_node_has_none_by_default() -> None:
    offering = _offering(next(iter(catalog.entries("sim-aws"))))
    assert preflight_threshold(spec(preflight={"min_busbw_gbps": 7.5}), offering) == (7.5, "spec")
    single = spec(resources={"gpus": ["A100"], "gpus_per_node": 8, "nodes": 1})
    assert preflight_threshold(single, offering) == (None, "")


def test_assembly_time_is_gang_plus_preflight_timeout() -> None:
    assert assembly_seconds(spec(gang={"timeout": "2m"}, preflight={"timeout": "1m"})) == 180
    off = spec(gang={"timeout": "2m"}, preflight={"enabled": False})
    assert assembly_seconds(off) == 120


def test_preflight_summary_names_the_figure_and_the_threshold() -> None:
    line = preflight_summary(
        PreflightFigures(passed=False, busbw_gbps=1.234, min_busbw_gbps=1000, backend="gloo",
                         world_size=4, seconds=2.5, reason="bus bandwidth 1.23 GB/s below 1000")
    )  # fmt: skip
    assert line.startswith("preflight failed, bus bandwidth 1.23 GB/s (min 1000), gloo x4")
    assert line.endswith("below 1000")


def _offering(entry: CatalogEntry) -> Offering:
    t = entry.shape
    return Offering(
        pool=entry.pool, gpu=t.gpu, gpus_per_node=t.gpus_per_node,
        gpu_memory_gb=t.gpu_memory_gb, interconnect=t.interconnect, spot_price=1.0,
        on_demand_price=3.0, capacity=1.0, notice_seconds=120,
    )  # fmt: skip

