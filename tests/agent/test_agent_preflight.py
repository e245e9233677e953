"""The gang preflight, with real worker processes and gloo over loopback.

Two "nodes" share this machine, each on its own loopback address (the whole
127/8 is loopback on Linux): node 0 at 127.0.0.2, which is also the master,
node 1 at 127.0.0.3. Each node runs ``run_preflight`` in its own thread, as its
agent would on its own VM. Nothing leaves the loopback.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from spotd.agent import preflight, preflight_worker
from spotd.agent.gpu import GpuSource, RecordedSource
from spotd.agent.job_python import JobRuntime, job_runtime
from spotd.agent.preflight import PreflightPlan, gpu_model_matches, run_preflight
from spotd.agent.preflight_launch import WorkerOutcome
from spotd.agent.preflight_worker import bus_bandwidth_gbps
from spotd.core.agent_wire import (
    PreflightCheck,
    PreflightCheckName,
    PreflightFailure,
    PreflightFigures,
)

Name = PreflightCheckName
Why = PreflightFailure

NODE_ADDRS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
MASTER = NODE_ADDRS[0]
# Small and short: the figures only need to be positive and agreed on.
FAST = {"size_mb": 2.0, "iterations": 5, "timeout_seconds": 60.0}


def free_port() -> int:
    # Any address: the TCP store listens on every interface, so the port must be
    # free on all of them, not only on the master's.
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def node_plan(rank: int, port: int, tmp_path: Path, **fields: Any) -> PreflightPlan:
    values: dict[str, Any] = {
        "node_rank": rank,
        "nodes": 2,
        "master_addr": MASTER,
        "node_addr": NODE_ADDRS[rank],
        "port": port,
        "checkpoint_uri": str(tmp_path / "ckpt"),
        **FAST,
        **fields,
    }
    return PreflightPlan(**values)


def job_in(run_dir: Path, python: str = sys.executable, **env: str) -> JobRuntime:
    """A job whose command is ``python train.py``: its interpreter is this test's own
    (the project's venv, which has torch) unless told otherwise."""
    return job_runtime([python, "train.py"], {**os.environ, **env}, cwd=None, run_dir=run_dir)


def run_nodes(
    plans: list[PreflightPlan], tmp_path: Path, gpus: GpuSource | None = None,
    python: str = sys.executable,
) -> list[PreflightFigures]:
    """Every plan's preflight at once, one thread per node, in plan order; each node
    with a run folder of its own."""
    with ThreadPoolExecutor(max_workers=len(plans)) as pool:
        futures = [
            pool.submit(run_preflight, plan, gpus,
                        job_in(tmp_path / f"node-{plan.node_rank}", python))
            for plan in plans
        ]  # fmt: skip
        return [f.result(timeout=120) for f in futures]


def gang(tmp_path: Path, **fields: Any) -> list[PreflightFigures]:
    port = free_port()
    return run_nodes([node_plan(rank, port, tmp_path, **fields) for rank in (0, 1)], tmp_path)


def check(figures: PreflightFigures, name: str) -> PreflightCheck:
    return next(c for c in figures.checks if c.name == name)


@pytest.mark.timeout(60)
def test_two_nodes_measure_the_same_bandwidth_and_pass(tmp_path: Path) -> None:
    first, second = gang(tmp_path)
    assert first.passed and second.passed, (first.reason, second.reason)
    assert first.busbw_gbps is not None and first.busbw_gbps > 0
    assert second.busbw_gbps == first.busbw_gbps  # the slowest rank's time, on both
    assert first.backend == "gloo" and first.world_size == 2
    assert first.reason == second.reason == ""
    assert check(first, Name.GANG).ok
    assert check(first, Name.CHECKPOINT).ok
    assert not list((tmp_path / "ckpt").iterdir())  # the probes were removed
    assert 0 < first.seconds < 60
    assert first.failed_rank is first.failed_check is first.failed_reason is None
    # Measured by the job's own interpreter, which it names.
    python = check(first, Name.JOB_PYTHON)
    assert python.ok and not python.skipped and sys.executable in python.detail
    assert check(first, Name.TORCH).ok and check(first, Name.PROCESS_GROUP).ok
    assert check(first, Name.TORCH_GPUS).skipped  # a CPU gang needs no CUDA


@pytest.mark.timeout(60)
def test_a_threshold_no_loopback_reaches_fails_every_node(tmp_path: Path) -> None:
    # Three nodes: their links are timed one pair at a time too, and every one is under
    # the floor, so the fabric is at fault, not a node.
    port = free_port()
    plans = [node_plan(rank, port, tmp_path, nodes=3, min_busbw_gbps=1e6) for rank in range(3)]
    first, second, third = run_nodes(plans, tmp_path)
    assert not first.passed and not second.passed and not third.passed
    assert first.reason == second.reason == third.reason
    assert first.reason.startswith("bus bandwidth ")
    assert first.reason.endswith(" GB/s below 1000000 GB/s")
    assert first.min_busbw_gbps == 1e6
    bandwidth = check(second, Name.BANDWIDTH)
    assert not bandwidth.ok and bandwidth.reason is Why.BELOW_FLOOR
    # The gang's bandwidth, not one node's: no node is named.
    assert (first.failed_rank, first.failed_check, first.failed_reason) == (
        None, Name.BANDWIDTH, Why.BELOW_FLOOR)  # fmt: skip


@pytest.mark.timeout(60)
def test_one_unwritable_checkpoint_location_fails_the_whole_gang(tmp_path: Path) -> None:
    # Root ignores permissions; a path under a regular file cannot be created by anyone.
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    port = free_port()
    plans = [
        node_plan(0, port, tmp_path),
        node_plan(1, port, tmp_path, checkpoint_uri=str(blocker / "ckpt")),
    ]
    first, second = run_nodes(plans, tmp_path)
    assert not first.passed and not second.passed
    assert first.reason == second.reason
    assert first.reason.startswith("node 1: checkpoint location not writable: ")
    assert check(first, Name.CHECKPOINT).ok  # node 0's own location is fine
    assert not check(first, Name.GANG).ok
    assert not check(second, Name.CHECKPOINT).ok
    for figures in (first, second):
        assert figures.failed_rank == 1
        assert figures.failed_check is Name.CHECKPOINT
        assert figures.failed_reason is Why.CHECKPOINT_UNWRITABLE
    # The bandwidth is measured all the same.
    assert first.busbw_gbps is not None and first.busbw_gbps == second.busbw_gbps


def test_the_one_node_both_of_whose_links_are_slow_is_named() -> None:
    # links[k] is the link into node k from node k-1.
    assert preflight.slow_node([9.0, 2.0, 2.0, 9.0], floor=5.0) == 1
    assert preflight.slow_node([2.0, 9.0, 9.0, 2.0], floor=5.0) == 3  # the ring wraps
    assert preflight.slow_node([9.0, 2.0, 9.0, 9.0], floor=5.0) is None  # one link: which end?
    assert preflight.slow_node([2.0, 2.0, 2.0], floor=5.0) is None  # the fabric's, not a node's
    assert preflight.slow_node([2.0, 2.0, 9.0, 2.0, 2.0], floor=5.0) is None  # two nodes
    assert preflight.slow_node([2.0, 9.0], floor=5.0) is None  # two nodes share their link
    assert preflight.slow_node([], floor=5.0) is None


def test_a_slow_node_under_the_floor_is_named_with_its_links(tmp_path: Path) -> None:
    plan = node_plan(0, 29500, tmp_path, nodes=4, min_busbw_gbps=5.0)
    spec = preflight_worker.WorkerSpec(backend="gloo", nodes=4, node_rank=0, size_bytes=4,
                                       iterations=1, warmup=0, timeout_seconds=1.0)  # fmt: skip
    result = preflight_worker.WorkerResult(
        rank=0, world_size=4, python=sys.executable, python_version="3.11",
        torch_version="2", cuda_devices=0, seconds_per_iteration=1.0, busbw_gbps=3.0,
        size_bytes=4, link_gbps=[9.0, 9.0, 2.0, 2.5],
    )  # fmt: skip
    job = job_in(tmp_path)
    outcome = preflight._outcome(plan, spec, job, WorkerOutcome(result=result))
    figures = preflight._figures(plan, "gloo", [], outcome, 1.0)
    assert not figures.passed
    assert (figures.failed_rank, figures.failed_check, figures.failed_reason) == (
        2, Name.NODE_LINK, Why.BELOW_FLOOR)  # fmt: skip
    said = "node 2: its links carry 2 GB/s in from node 1 and 2.5 GB/s out to node 3"
    assert figures.reason.startswith(f"{said}; bus bandwidth 3 GB/s below 5")


@pytest.mark.timeout(60)
def test_a_peer_that_never_arrives_ends_at_the_timeout(tmp_path: Path) -> None:
    # Two gangs of two, each missing a node: the master alone, and node 1 alone
    # (whose store never answers). Both run at once to halve the wait.
    timeout = 4.0
    alone = [
        node_plan(0, free_port(), tmp_path, timeout_seconds=timeout),
        node_plan(1, free_port(), tmp_path, timeout_seconds=timeout),
    ]
    start = time.monotonic()
    results = run_nodes(alone, tmp_path)
    assert time.monotonic() - start < timeout + 5
    for figures in results:
        assert not figures.passed
        assert figures.reason == "preflight timed out after 4 s"
        assert figures.busbw_gbps is None
        assert figures.failed_rank is None  # which peer hung is not known here
        assert (figures.failed_check, figures.failed_reason) == (
            Name.PROCESS_GROUP, Why.TIMED_OUT)  # fmt: skip
        # Torch is not failed for the peer's absence: passed, as the worker said before it
        # went to wait for its peer, or unknown where the deadline came first (a loaded
        # machine may take longer than the timeout to import torch).
        torch = check(figures, Name.TORCH)
        assert torch.ok and (not torch.skipped or torch.detail == "no answer from the worker")
        assert timeout <= figures.seconds < timeout + 5


@pytest.mark.timeout(30)
def test_a_world_of_one_measures_nothing_and_passes(tmp_path: Path) -> None:
    plan = PreflightPlan(
        node_rank=0, nodes=1, master_addr=MASTER, port=free_port(), checkpoint_uri=str(tmp_path)
    )
    figures = run_preflight(plan, None, job_in(tmp_path))
    assert figures.passed, figures.reason
    assert figures.busbw_gbps is None
    assert figures.world_size == 1
    bandwidth = check(figures, Name.BANDWIDTH)
    assert bandwidth.skipped and "no peer" in bandwidth.detail
    assert check(figures, Name.CHECKPOINT).ok
    assert figures.seconds < 5  # no worker was started


@pytest.mark.timeout(30)
def test_one_node_with_several_local_processes_measures_between_them(tmp_path: Path) -> None:
    plan = PreflightPlan(
        node_rank=0, nodes=1, local_procs=2, master_addr="127.0.0.1", port=free_port(), **FAST
    )
    figures = run_preflight(plan, None, job_in(tmp_path))
    assert figures.passed, figures.reason
    assert figures.world_size == 2
    assert figures.busbw_gbps is not None and figures.busbw_gbps > 0


def recording(tmp_path: Path, gpus: int, name: str = "NVIDIA A100-SXM4-80GB") -> RecordedSource:
    moment = [{"util_pct": 0.0, "mem_used_gb": 0.5, "mem_total_gb": 80.0}] * gpus
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"gpus": [name] * gpus, "samples": [moment]}))
    return RecordedSource(path)


def single_node(**fields: Any) -> PreflightPlan:
    # One node, one process (gloo on CPU): the node checks without a gang.
    values: dict[str, Any] = {
        "node_rank": 0,
        "nodes": 1,
        "master_addr": MASTER,
        "port": 29500,
        "backend": "gloo",
    }
    return PreflightPlan(**{**values, **fields})


@pytest.mark.timeout(30)
def test_fewer_gpus_than_offered_fail_the_count_check(tmp_path: Path) -> None:
    plan = single_node(expect_gpus=8, expect_gpu_model="A100", expect_gpu_memory_gb=80)
    figures = run_preflight(plan, recording(tmp_path, gpus=4), job_in(tmp_path))
    assert not figures.passed
    assert figures.reason == "node 0: expected 8 GPUs, found 4"
    assert not check(figures, Name.GPU_COUNT).ok
    assert check(figures, Name.GPU_MODEL).ok
    assert check(figures, Name.GPU_MEMORY).ok
    assert check(figures, Name.GPU_DRIVER).ok


@pytest.mark.timeout(30)
def test_gpus_as_offered_pass(tmp_path: Path) -> None:
    plan = single_node(expect_gpus=4, expect_gpu_model="A100", expect_gpu_memory_gb=80)
    figures = run_preflight(plan, recording(tmp_path, gpus=4), job_in(tmp_path))
    assert figures.passed, figures.reason
    gpu_checks = [check(figures, name) for name in preflight._GPU_CHECKS]
    assert all(c.ok and not c.skipped for c in gpu_checks)


@pytest.mark.timeout(30)
def test_wrong_model_and_small_memory_fail(tmp_path: Path) -> None:
    plan = single_node(expect_gpus=2, expect_gpu_model="H100", expect_gpu_memory_gb=141)
    figures = run_preflight(plan, recording(tmp_path, gpus=2), job_in(tmp_path))
    assert not figures.passed
    assert "expected H100 GPUs, found NVIDIA A100-SXM4-80GB" in figures.reason
    assert "expected 141 GB per GPU, GPU 0 has 80.0 GB" in figures.reason
    assert not check(figures, Name.GPU_MODEL).ok
    assert not check(figures, Name.GPU_MEMORY).ok


@pytest.mark.timeout(30)
def test_no_driver_on_a_gpu_offering_fails(tmp_path: Path) -> None:
    plan = single_node(expect_gpus=8, expect_gpu_model="H100")
    figures = run_preflight(plan, None, job_in(tmp_path))
    assert not figures.passed
    assert figures.reason == "node 0: no NVIDIA driver answers (NVML)"
    assert check(figures, Name.GPU_COUNT).skipped


@pytest.mark.timeout(30)
def test_simulated_gpus_are_skipped_not_passed(tmp_path: Path) -> None:
    plan = single_node(expect_gpus=8, expect_gpu_model="H100", simulated=True)
    for gpus in (None, recording(tmp_path, gpus=1)):
        figures = run_preflight(plan, gpus, job_in(tmp_path))
        assert figures.passed, figures.reason
        for name in preflight._GPU_CHECKS:
            gpu_check = check(figures, name)
            assert gpu_check.skipped and gpu_check.detail == preflight.SIMULATED


def test_the_backend_follows_the_gpus(tmp_path: Path) -> None:
    readings = recording(tmp_path, gpus=2).sample()
    plan = single_node(backend=None)
    assert preflight._default_backend(plan, readings) == "nccl"
    assert preflight._default_backend(plan, []) == "gloo"
    assert preflight._default_backend(single_node(backend=None, simulated=True), readings) == "gloo"


def no_torch_python(folder: Path) -> str:
    """A job interpreter without torch: this Python, isolated (``-I``) and without its
    site-packages (``-S``), behind a script as a venv's ``bin/python`` would be."""
    folder.mkdir(parents=True, exist_ok=True)
    python = folder / "python3"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    python.chmod(0o755)
    return str(python)


@pytest.mark.timeout(30)
def test_a_job_python_without_torch_fails_naming_the_node(tmp_path: Path) -> None:
    # Two processes on one node: a gang that needs the all-reduce, so torch.
    plan = PreflightPlan(node_rank=0, nodes=1, local_procs=2, master_addr="127.0.0.1",
                         port=free_port(), **FAST)  # fmt: skip
    python = no_torch_python(tmp_path / "venv" / "bin")
    figures = run_preflight(plan, None, job_in(tmp_path / "run", python))
    assert not figures.passed
    assert (figures.failed_rank, figures.failed_check, figures.failed_reason) == (
        0, Name.TORCH, Why.TORCH_MISSING)  # fmt: skip
    assert figures.reason == f"node 0: torch is not installed for {sys.executable}"
    assert check(figures, Name.JOB_PYTHON).ok  # the interpreter ran; torch is what it lacks
    assert check(figures, Name.PROCESS_GROUP).skipped
    assert figures.busbw_gbps is None
    assert figures.seconds < 20  # at once, not at the timeout


@pytest.mark.timeout(30)
def test_one_process_checks_torch_only_when_the_job_says_it_uses_it(tmp_path: Path) -> None:
    python = no_torch_python(tmp_path / "bin")
    plan = single_node()
    quiet = run_preflight(plan, None, job_in(tmp_path / "a", python))
    assert quiet.passed, quiet.reason
    assert check(quiet, Name.TORCH).skipped and check(quiet, Name.BANDWIDTH).skipped
    declared = run_preflight(single_node(torch=True), None, job_in(tmp_path / "b", python))
    assert not declared.passed
    assert (declared.failed_check, declared.failed_reason) == (Name.TORCH, Why.TORCH_MISSING)
    # With torch there, one process passes with no peer to measure against.
    real = run_preflight(single_node(torch=True), None, job_in(tmp_path / "c"))
    assert real.passed, real.reason
    assert check(real, Name.TORCH).ok and check(real, Name.BANDWIDTH).skipped


@pytest.mark.timeout(30)
def test_a_job_that_does_not_use_torch_skips_the_gang_and_says_so(tmp_path: Path) -> None:
    plan = PreflightPlan(node_rank=0, nodes=1, local_procs=2, master_addr="127.0.0.1",
                         port=free_port(), torch=False, **FAST)  # fmt: skip
    figures = run_preflight(plan, None, job_in(tmp_path, no_torch_python(tmp_path / "bin")))
    assert figures.passed, figures.reason
    bandwidth = check(figures, Name.BANDWIDTH)
    assert bandwidth.skipped and "[preflight] torch = false" in bandwidth.detail


@pytest.mark.timeout(30)
def test_a_job_python_that_is_not_there_fails(tmp_path: Path) -> None:
    plan = PreflightPlan(node_rank=0, nodes=1, local_procs=2, master_addr="127.0.0.1",
                         port=free_port(), **FAST)  # fmt: skip
    job = job_in(tmp_path, SPOTD_PREFLIGHT_PYTHON="/nowhere/bin/python3")
    figures = run_preflight(plan, None, job)
    assert not figures.passed
    assert (figures.failed_rank, figures.failed_check, figures.failed_reason) == (
        0, Name.JOB_PYTHON, Why.PYTHON_MISSING)  # fmt: skip
    assert "'/nowhere/bin/python3' not found" in figures.reason


@pytest.mark.timeout(30)
def test_gpus_torch_cannot_see_fail_the_node(tmp_path: Path) -> None:
    # NCCL with one GPU per process: this torch is a CPU build and sees no CUDA device.
    plan = PreflightPlan(node_rank=0, nodes=1, local_procs=2, master_addr="127.0.0.1",
                         port=free_port(), backend="nccl", timeout_seconds=25)  # fmt: skip
    figures = run_preflight(plan, None, job_in(tmp_path))
    assert not figures.passed
    assert (figures.failed_rank, figures.failed_check, figures.failed_reason) == (
        0, Name.TORCH_GPUS, Why.NO_GPU)  # fmt: skip
    assert "sees 0 CUDA device(s) of the node's 2" in figures.reason
    assert "timed out" not in figures.reason
    assert figures.seconds < 20


FAKE_ENGINE = """#!/bin/sh
# A container engine's stand-in: logs its argv, then runs what follows the image.
# The image "bare" has a shell and nothing on its PATH.
printf '%s\\n' "$@" > "{log}.$$"
while [ "$1" != "{image}" ]; do shift; done
shift
if [ "{image}" = bare ]; then shift; PATH=/nowhere exec /bin/sh "$@"; fi
exec "$@"
"""


def fake_engine(tmp_path: Path, image: str) -> tuple[Path, Path]:
    log = tmp_path / "engine-argv"
    engine = tmp_path / "engine"
    engine.write_text(FAKE_ENGINE.format(log=log, image=image))
    engine.chmod(0o755)
    return engine, log


@pytest.mark.timeout(30)
def test_in_an_image_the_workers_run_as_the_jobs_command_would(tmp_path: Path) -> None:
    engine, _ = fake_engine(tmp_path, "trainer:1")
    run_dir = tmp_path / "run"
    plan = PreflightPlan(node_rank=0, nodes=1, local_procs=2, master_addr="127.0.0.1",
                         port=free_port(), **FAST)  # fmt: skip
    job = job_in(run_dir, SPOTD_IMAGE="trainer:1", SPOTD_CONTAINER_ENGINE=str(engine))
    figures = run_preflight(plan, None, job)
    assert figures.passed, figures.reason
    runs = [p.read_text().splitlines() for p in tmp_path.glob("engine-argv.*")]
    assert len(runs) == 2  # one container per process
    for argv in runs:
        assert argv[:2] == ["run", "--rm"]
        assert f"--volume={run_dir}:{run_dir}" in argv  # where the worker's file is
        assert "--env=SPOTD_PREFLIGHT_SPEC" in argv and "--env=RANK" in argv
        after = argv[argv.index("trainer:1") + 1 :]
        assert after[0] == sys.executable  # the command's own interpreter, in the image
        assert Path(after[1]).parent.parent == run_dir


@pytest.mark.timeout(30)
def test_an_image_without_python_fails_with_python_missing(tmp_path: Path) -> None:
    engine, _ = fake_engine(tmp_path, "bare")
    plan = PreflightPlan(node_rank=0, nodes=1, local_procs=2, master_addr="127.0.0.1",
                         port=free_port(), **FAST)  # fmt: skip
    env = {"SPOTD_IMAGE": "bare", "SPOTD_CONTAINER_ENGINE": str(engine)}
    job = job_runtime(["./train.sh"], {**os.environ, **env}, cwd=None, run_dir=tmp_path / "run")
    figures = run_preflight(plan, None, job)
    assert not figures.passed
    assert (figures.failed_check, figures.failed_reason) == (Name.JOB_PYTHON, Why.PYTHON_MISSING)
    assert "no python3 or python on the PATH (/nowhere)" in figures.reason


def test_a_rank_outside_the_gang_is_refused() -> None:
    with pytest.raises(ValueError, match="node_rank 2 is not below nodes 2"):
        PreflightPlan(node_rank=2, nodes=2, master_addr=MASTER, port=29500)


@pytest.mark.parametrize(
    ("expected", "name", "matches"),
    [
        ("A100", "NVIDIA A100-SXM4-80GB", True),
        ("a100", "NVIDIA A100 80GB PCIe", True),
        ("H100", "NVIDIA H100 80GB HBM3", True),
        ("H100-NVL", "NVIDIA H100 NVL", True),
        ("A10G", "NVIDIA A10G", True),
        ("L4", "NVIDIA L4", True),
        ("V100", "Tesla V100-SXM2-16GB", True),
        ("A10", "NVIDIA A100-SXM4-40GB", False),
        ("L4", "NVIDIA L40S", False),
        ("H100-NVL", "NVIDIA H100 80GB HBM3", False),
        ("", "anything", True),
    ],
)
def test_gpu_model_matches_words(expected: str, name: str, matches: bool) -> None:
    assert gpu_model_matches(expected, name) is matches


@pytest.mark.parametrize(
    ("world", "busbw"),
    [(2, 1.0), (4, 1.5), (8, 1.75)],
)
def test_bus_bandwidth_is_nccl_tests_definition(world: int, busbw: float) -> None:
    # 1 GB in 1 s is an algbw of 1 GB/s; busbw scales it by 2 (n - 1) / n.
    assert bus_bandwidth_gbps(1_000_000_000, 1.0, world) == pytest.approx(busbw)


def test_a_worker_without_its_spec_prints_one_failure_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert preflight_worker.main({"RANK": "3"}) == preflight_worker.EXIT_FAILED
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    failure = preflight_worker.WorkerFailure(**json.loads(lines[0]))
    assert failure.rank == 3
    assert failure.reason == preflight_worker.BAD_REQUEST
    assert preflight_worker.SPEC_VARIABLE in failure.error
