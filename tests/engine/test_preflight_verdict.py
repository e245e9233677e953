"""How the daemon judges a failed preflight: the node and check its event names, and
whether the job or the pool is at fault (spotd.engine.gang, spotd.engine.judge)."""

from __future__ import annotations

from engine_support import EPOCH, spec

from spotd.core.agent_wire import (
    PreflightCheck,
    PreflightCheckName,
    PreflightFailure,
    PreflightFigures,
)
from spotd.core.failures import failure_sentence
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    FailureCause,
    InstanceReport,
    JobStatus,
    Market,
    Offering,
    Pool,
)
from spotd.engine import judge
from spotd.engine.gang import GangState, gang_environment, gang_state
from spotd_sim import catalog

Name = PreflightCheckName
Why = PreflightFailure
POOL = Pool("sim-aws", "us-east-1", "us-east-1a", "p4d.24xlarge")


def attempt(nodes: int = 3) -> AttemptRecord:
    return AttemptRecord(
        id=1, job_id="j-1", seq=1, pool=POOL, market=Market.SPOT, nodes=nodes,
        price_per_node_hour=10.0, client_token="j-1-a1",
        instance_ids=tuple(f"i-{n}" for n in range(nodes)), resume_from=None,
        started_at=EPOCH, running_at=None, ended_at=None, end_reason=None,
    )  # fmt: skip


def report(iid: str, figures: PreflightFigures) -> InstanceReport:
    return InstanceReport(instance_id=iid, provider="sim-aws", job_id="j-1", attempt=1,
                          address="10.0.0.1", preflight=figures.model_dump_json())  # fmt: skip


def failing(rank: int | None, name: Name, why: Why, detail: str = "x") -> PreflightFigures:
    check = PreflightCheck(name=name, ok=False, detail=detail, reason=why)
    line = f"node {rank}: {detail}" if rank is not None else detail
    return PreflightFigures(passed=False, checks=(check,), reason=line, failed_rank=rank,
                            failed_check=name, failed_reason=why)  # fmt: skip


TIMED_OUT = failing(None, Name.PROCESS_GROUP, Why.TIMED_OUT, "preflight timed out after 300 s")


def test_the_verdict_that_names_a_node_wins_over_a_timeout() -> None:
    # Node 2 found no torch at once; nodes 0 and 1 could only wait for it.
    named = failing(2, Name.TORCH, Why.TORCH_MISSING, "torch is not installed for /usr/bin/python3")
    reports = [report("i-0", TIMED_OUT), report("i-1", TIMED_OUT), report("i-2", named)]
    state = gang_state(attempt(), reports)
    assert state.preflight == named and state.preflight_failed


def end_of(figures: PreflightFigures, nodes: int = 3) -> judge.End:
    return judge.preflight_failed(attempt(nodes), GangState(joined=nodes, started=0,
                                                            preflight=figures))  # fmt: skip


def test_the_event_names_the_failing_node_its_rank_and_check() -> None:
    end = end_of(failing(1, Name.TORCH_GPUS, Why.NO_GPU, "torch sees 0 CUDA device(s)"))
    assert end.status is JobStatus.RECOVERING and end.end is AttemptEnd.PREFLIGHT_FAILED
    assert (end.facts.node, end.facts.rank, end.facts.check) == ("i-1", 1, "torch_gpus")
    assert "node 1: torch sees 0 CUDA device(s)" in end.detail


def test_a_gang_wide_failure_names_no_node() -> None:
    below = failing(None, Name.BANDWIDTH, Why.BELOW_FLOOR, "bus bandwidth 3 GB/s below 40 GB/s")
    end = end_of(below)
    assert end.status is JobStatus.RECOVERING
    assert (end.facts.node, end.facts.rank, end.facts.check) == (None, None, "allreduce_busbw")


def test_torch_missing_from_the_jobs_python_fails_the_job_not_the_pool() -> None:
    end = end_of(failing(0, Name.TORCH, Why.TORCH_MISSING, "torch is not installed"), nodes=1)
    assert (end.status, end.failure) == (JobStatus.FAILED, FailureCause.INVALID_SPEC)
    assert (end.facts.node, end.facts.rank, end.facts.check) == ("i-0", None, "torch_import")
    words = failure_sentence(FailureCause.INVALID_SPEC, end.facts, spec())
    assert words == "preflight failed: torch is not installed in the job's python interpreter"


def test_a_torch_that_does_not_import_tries_another_pool() -> None:
    end = end_of(failing(0, Name.TORCH, Why.TORCH_BROKEN, "libcudart.so.12: cannot open"))
    assert end.status is JobStatus.RECOVERING and end.failure is None


def test_a_missing_python_fails_the_job() -> None:
    end = end_of(failing(2, Name.JOB_PYTHON, Why.PYTHON_MISSING, "no python3 or python"))
    assert end.status is JobStatus.FAILED and end.facts.check == "job_python"


def test_figures_of_an_older_agent_are_judged_by_their_check_names() -> None:
    checks = (PreflightCheck(name=Name.GANG, ok=False, detail="node 1: read-only"),
              PreflightCheck(name=Name.CHECKPOINT, ok=False, detail="read-only"))  # fmt: skip
    old = PreflightFigures(passed=False, checks=checks, reason="node 1: read-only")
    end = end_of(old)
    assert end.status is JobStatus.FAILED and end.facts.check == "checkpoint_writable"
    assert end.facts.node is None


def test_a_rank_outside_the_attempt_names_no_node() -> None:
    end = end_of(failing(7, Name.GPU_COUNT, Why.GPU_COUNT))
    assert (end.facts.node, end.facts.check) == (None, "gpu_count")


def test_the_job_tells_its_nodes_its_python_and_its_use_of_torch() -> None:
    shape = next(iter(catalog.entries("sim-aws"))).shape
    offering = Offering(
        pool=POOL, gpu=shape.gpu, gpus_per_node=shape.gpus_per_node,
        gpu_memory_gb=shape.gpu_memory_gb, interconnect=shape.interconnect, spot_price=1.0,
        on_demand_price=3.0, capacity=1.0, notice_seconds=120,
    )  # fmt: skip
    declared = spec(preflight={"python": ".venv/bin/python", "torch": True})
    env = gang_environment(declared, attempt(2), offering)
    assert env["SPOTD_PREFLIGHT_PYTHON"] == ".venv/bin/python"
    assert env["SPOTD_PREFLIGHT_TORCH"] == "1"
    plain = gang_environment(spec(), attempt(2), offering)
    assert "SPOTD_PREFLIGHT_PYTHON" not in plain and "SPOTD_PREFLIGHT_TORCH" not in plain
    off = gang_environment(spec(preflight={"torch": False}), attempt(2), offering)
    assert off["SPOTD_PREFLIGHT_TORCH"] == "0"


def test_a_peers_unwritable_checkpoint_fails_the_job_from_any_nodes_figures() -> None:
    # Node 0's own checks passed; its figures carry node 1's check as the gang shared it.
    peer = PreflightCheck(name=Name.GANG, ok=False, detail="node 1: read-only",
                          reason=Why.PEER_FAILED)  # fmt: skip
    figures = PreflightFigures(passed=False, checks=(peer,), reason="node 1: read-only",
                               failed_rank=1, failed_check=Name.CHECKPOINT,
                               failed_reason=Why.CHECKPOINT_UNWRITABLE)  # fmt: skip
    end = end_of(figures)
    assert (end.status, end.failure) == (JobStatus.FAILED, FailureCause.INVALID_SPEC)
    assert (end.facts.node, end.facts.rank, end.facts.check) == ("i-1", 1, "checkpoint_writable")
