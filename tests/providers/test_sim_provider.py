"""The simulated providers, with real VM and job processes."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotd.core.errors import CapacityError
from spotd.core.network import Fabric
from spotd.core.values import Instance, InstanceState, LaunchRequest, Market, Offering, Pool
from spotd_sim import MarketConfig, SimClock, SimMarket, SimProvider, build_sim_providers
from spotd_sim.procs import signal_group
from spotd_sim.records import InstanceSpec, VmStatus

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
PY = sys.executable
WAIT_SECONDS = 60.0
"""The safety net of every wait here: a real process gets there in well under a second,
unless the machine is starved."""
RUNS_ON = "import time; time.sleep(600)"
"""A job that runs until the test stops it: its sleep only guards against a runaway
process, and is longer than any wait here."""

Sims = Callable[..., dict[str, SimProvider]]


# -- helpers --------------------------------------------------------------------


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def wait_for(check: Callable[[], bool], timeout: float = WAIT_SECONDS, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.02)


def states(provider: SimProvider, ids: list[str]) -> list[InstanceState]:
    return [i.state for i in provider.describe(ids)]


def wait_state(
    provider: SimProvider, ids: list[str], wanted: InstanceState, timeout: float = WAIT_SECONDS
) -> list[Instance]:
    wait_for(lambda: states(provider, ids) == [wanted] * len(ids), timeout, f"{ids} {wanted}")
    return list(provider.describe(ids))


def wait_ended(
    provider: SimProvider, ids: list[str], timeout: float = WAIT_SECONDS
) -> list[Instance]:
    wait_for(lambda: all(i.ended for i in provider.describe(ids)), timeout, f"{ids} ended")
    return list(provider.describe(ids))


def vm_status(root: Path, instance_id: str) -> VmStatus:
    status = VmStatus.load(root / f"{instance_id}.state.json")
    assert status is not None
    return status


def offering(provider: SimProvider, zone: str, instance_type: str) -> Offering:
    return next(
        o
        for o in provider.offerings()
        if o.pool.zone == zone and o.pool.instance_type == instance_type
    )


def request(
    off: Offering,
    script: str,
    *,
    token: str,
    market: Market = Market.ON_DEMAND,
    nodes: int = 1,
    tags: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    workdir: Path | None = None,
) -> LaunchRequest:
    return LaunchRequest(
        offering=off,
        market=market,
        nodes=nodes,
        client_token=token,
        tags=tags or {},
        command=(PY, "-c", script),
        env=env or {},
        workdir=None if workdir is None else str(workdir),
    )


def write_trace(path: Path, gap: float, data: list[int]) -> Path:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


def always_up(tmp_path: Path) -> Path:
    """A trace that keeps a pool's spot capacity up: only reclaim() takes a node back."""
    return write_trace(tmp_path / "up.json", 3600, [1])


@dataclass
class Wall:
    """POSIX time that moves only when the test moves it, for a :class:`SimClock`."""

    at: float

    def __call__(self) -> float:
        return self.at


def launch_lines(root: Path) -> list[str]:
    path = root / "launches.log"
    return path.read_text().splitlines() if path.exists() else []


def kill_everything(root: Path) -> None:
    """Last-resort cleanup: no VM or job process of this state dir survives the test."""
    for path in root.glob("*.state.json"):
        status = VmStatus.load(path)
        if status is None:
            continue
        if status.child_pid is not None:
            signal_group(status.child_pid, signal.SIGKILL, status.child_start)
        instance_id = path.name.removesuffix(".state.json")
        if status.pid is not None and alive(status.pid):
            cmdline = Path(f"/proc/{status.pid}/cmdline").read_bytes()
            if instance_id.encode() in cmdline:
                os.kill(status.pid, signal.SIGKILL)


# -- fixtures -------------------------------------------------------------------


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[Sims]:
    """Build sim providers on a fresh state dir; kill all their processes afterwards."""
    made: list[tuple[Path, list[SimProvider]]] = []

    def make(
        *,
        speed: float = 3600.0,
        boot_seconds: float = 1.0,
        traces: dict[str, Path] | None = None,
        name: str = "state",
        lifetimes: bool = False,
    ) -> dict[str, SimProvider]:
        root = tmp_path / name
        providers = build_sim_providers(
            root,
            seed=7,
            speed=speed,
            mean_up_hours=6.0,
            mean_down_hours=2.0,
            boot_seconds=boot_seconds,
            traces=traces,
            sim_epoch=EPOCH,
            lifetimes=lifetimes,
        )
        made.append((root, providers))
        return {p.name: p for p in providers}

    yield make
    for root, providers in made:
        kill_everything(root)
        for p in providers:
            p._reap()


# -- clock ----------------------------------------------------------------------


def test_clock_is_shared_through_the_state_dir(tmp_path: Path) -> None:
    wall = Wall(1_800_000_000.0)
    first = SimClock(tmp_path, 3600.0, sim_epoch=EPOCH, wall=wall)
    wall.at += 5  # a later process: the epoch it proposes loses to the stored one
    second = SimClock(tmp_path, 3600.0, sim_epoch=datetime(2030, 1, 1, tzinfo=UTC), wall=wall)
    reader = SimClock.open(tmp_path, wall=wall)
    assert first.sim_epoch == second.sim_epoch == reader.sim_epoch == EPOCH
    assert first.now() == second.now() == reader.now() == EPOCH + timedelta(hours=5)
    wall.at += 1
    assert first.now() == EPOCH + timedelta(hours=6)
    assert first.seconds_to_real(7200) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="speed"):
        SimClock(tmp_path, 60.0)


def test_sim_time_runs_at_speed(tmp_path: Path) -> None:
    wall = Wall(1_800_000_000.0)
    clock = SimClock(tmp_path, 1000.0, wall=wall)
    start = clock.now()
    wall.at += 0.25
    assert clock.now() - start == timedelta(seconds=250)
    wall.at += 2
    assert clock.now() - start == timedelta(seconds=2250)


# -- offerings ------------------------------------------------------------------


def test_offerings_of_the_three_providers(sims: Sims) -> None:
    providers = sims()
    assert sorted(providers) == ["sim-aws", "sim-azure", "sim-gcp"]
    notice = {"sim-aws": 120, "sim-gcp": 30, "sim-azure": 30}
    for name, provider in providers.items():
        offerings = provider.offerings()
        assert len(offerings) >= 10
        for o in offerings:
            assert o.pool.provider == name
            assert o.spot_price is not None and o.on_demand_price is not None
            assert 0 < o.spot_price < o.on_demand_price
            assert o.capacity in (0.0, 1.0)
            assert o.interconnect.gbps_per_gpu > 0
            assert o.notice_seconds == notice[name]
    aws = {o.pool.instance_type for o in providers["sim-aws"].offerings()}
    assert {"p5.48xlarge", "p4d.24xlarge", "g6e.xlarge", "p3.2xlarge", "g5.xlarge"} <= aws
    h100 = offering(providers["sim-azure"], "eastus-1", "Standard_ND96isr_H100_v5")
    assert h100.interconnect.fabric is Fabric.INFINIBAND
    assert h100.gpus_per_node == 8


# -- launch, run, exit ------------------------------------------------------------

JOB_WAITS_FOR_GO = """
import json, os, pathlib, time
while not pathlib.Path(os.environ["GO"]).exists():
    time.sleep(0.01)
rank = os.environ["SPOTD_NODE_RANK"]
pathlib.Path(f"out-{rank}.json").write_text(json.dumps(dict(os.environ)))
print("hello from rank", rank, flush=True)
raise SystemExit(3)
"""


def test_launch_runs_the_command_until_it_exits(sims: Sims, tmp_path: Path) -> None:
    aws = sims()["sim-aws"]
    go, work = tmp_path / "go", tmp_path / "work"
    req = request(
        offering(aws, "us-east-1a", "p4d.24xlarge"),
        JOB_WAITS_FOR_GO,
        token="job1-attempt1",
        nodes=2,
        tags={"job": "job1"},
        env={"GO": str(go), "SPOTD_JOB_ID": "job1", "SPOTD_NUM_NODES": "2"},
        workdir=work,
    )
    instances = aws.launch(req)
    ids = [i.id for i in instances]
    assert len(ids) == 2 and all(i.startswith("sim-aws-") for i in ids)
    assert all(i.state in (InstanceState.PENDING, InstanceState.RUNNING) for i in instances)
    assert all(i.tags == {"job": "job1"} and i.market is Market.ON_DEMAND for i in instances)

    wait_state(aws, ids, InstanceState.RUNNING)
    go.touch()
    ended = wait_ended(aws, ids)
    assert [i.state for i in ended] == [InstanceState.EXITED] * 2
    assert [i.exit_code for i in ended] == [3, 3]
    for rank, inst in enumerate(ended):
        assert inst.launched_at is not None and inst.ended_at is not None
        assert inst.ended_at > inst.launched_at
        env = json.loads((work / f"out-{rank}.json").read_text())
        assert env["SPOTD_NODE_RANK"] == str(rank)
        assert env["SPOTD_INSTANCE_ID"] == inst.id
        assert env["SPOTD_JOB_ID"] == "job1" and env["SPOTD_NUM_NODES"] == "2"
        assert "PATH" in env  # the VM's environment passes through
        assert "SPOTD_SIM_VM_LOCK_FD" not in env
        assert aws.logs(inst.id) == f"hello from rank {rank}\n"
        status = vm_status(work.parent / "state", inst.id)
        assert status.running_at is not None and status.ended_at is not None
        vm_pid = status.pid
        assert vm_pid is not None
        wait_for(lambda: not alive(vm_pid), what="VM process gone")  # noqa: B023
    spec = json.loads((tmp_path / "state" / f"{ids[0]}.spec.json").read_text())
    assert spec["price"] == 32.77 and spec["client_token"] == "job1-attempt1"


def test_launch_is_idempotent_by_client_token(sims: Sims, tmp_path: Path) -> None:
    gcp = sims()["sim-gcp"]
    req = request(
        offering(gcp, "us-central1-a", "a2-highgpu-1g"),
        RUNS_ON,
        token="tok-1",
        nodes=3,
    )
    first = [i.id for i in gcp.launch(req)]
    again = [i.id for i in gcp.launch(req)]
    # A restarted daemon: a fresh provider object on the same state dir.
    restarted = build_sim_providers(
        tmp_path / "state", seed=7, speed=3600.0, mean_up_hours=6.0,
        mean_down_hours=2.0, boot_seconds=1.0,
    )[1]  # fmt: skip
    assert restarted.name == "sim-gcp"
    after_restart = [i.id for i in restarted.launch(req)]
    assert first == again == after_restart
    lines = launch_lines(tmp_path / "state")
    assert sorted(lines) == sorted(f"tok-1 {i}" for i in first)
    gcp.terminate(first)
    assert states(gcp, first) == [InstanceState.TERMINATED] * 3


def test_interrupted_launch_is_completed_by_the_retry(
    sims: Sims, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    azure = sims()["sim-azure"]
    req = request(
        offering(azure, "eastus-1", "Standard_NC24ads_A100_v4"),
        "print('done')",
        token="crashy",
        nodes=2,
    )

    def crash(self: SimProvider, spec: object, lock_fd: int) -> None:
        raise RuntimeError("daemon died here")

    monkeypatch.setattr(SimProvider, "_spawn", crash)
    with pytest.raises(RuntimeError):
        azure.launch(req)
    monkeypatch.undo()
    # Records exist, no VM started: the instances wait, nothing is lost.
    pending = azure.list_instances({})
    assert [i.state for i in pending] == [InstanceState.PENDING] * 2
    assert launch_lines(tmp_path / "state") == []

    ids = [i.id for i in azure.launch(req)]
    assert ids == [i.id for i in pending]
    ended = wait_ended(azure, ids)
    assert [(i.state, i.exit_code) for i in ended] == [(InstanceState.EXITED, 0)] * 2
    assert sorted(launch_lines(tmp_path / "state")) == sorted(f"crashy {i}" for i in ids)


def test_terminating_a_never_started_instance_keeps_it_down(
    sims: Sims, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    aws = sims()["sim-aws"]
    req = request(offering(aws, "us-east-1a", "g5.xlarge"), "pass", token="t")

    def crash(self: SimProvider, spec: object, lock_fd: int) -> None:
        raise RuntimeError("daemon died here")

    monkeypatch.setattr(SimProvider, "_spawn", crash)
    with pytest.raises(RuntimeError):
        aws.launch(req)
    monkeypatch.undo()
    (inst,) = aws.list_instances({})
    aws.terminate([inst.id])
    assert aws.describe([inst.id])[0].state is InstanceState.TERMINATED
    assert aws.launch(req)[0].state is InstanceState.TERMINATED
    assert launch_lines(tmp_path / "state") == []


def test_a_command_that_cannot_start_exits_127(sims: Sims) -> None:
    gcp = sims()["sim-gcp"]
    req = request(offering(gcp, "us-east4-b", "g2-standard-4"), "", token="t")
    req = dataclasses.replace(req, command=("/nonexistent/trainer", "--x"))
    (inst,) = wait_ended(gcp, [gcp.launch(req)[0].id])
    assert (inst.state, inst.exit_code) == (InstanceState.EXITED, 127)
    assert "cannot start" in gcp.logs(inst.id)


def test_list_instances_by_tags(sims: Sims) -> None:
    providers = sims()
    aws, gcp = providers["sim-aws"], providers["sim-gcp"]
    off = offering(aws, "us-west-2b", "g5.xlarge")
    a = aws.launch(request(off, "pass", token="a", tags={"job": "a", "team": "x"}))
    b = aws.launch(request(off, "pass", token="b", nodes=2, tags={"job": "b", "team": "x"}))
    assert [i.id for i in aws.list_instances({"job": "a"})] == [a[0].id]
    assert {i.id for i in aws.list_instances({"team": "x"})} == {i.id for i in [*a, *b]}
    assert aws.list_instances({"job": "c"}) == []
    assert gcp.list_instances({}) == []
    wait_ended(aws, [i.id for i in [*a, *b]])
    # Ended instances are still listed.
    assert len(aws.list_instances({"team": "x"})) == 3


def test_describe_and_logs_of_unknown_ids(sims: Sims) -> None:
    providers = sims()
    aws, gcp = providers["sim-aws"], providers["sim-gcp"]
    inst = aws.launch(request(offering(aws, "us-east-2a", "g6e.xlarge"), "pass", token="t"))[0]
    assert aws.describe(["sim-aws-nope", "../etc", ""]) == []
    assert gcp.describe([inst.id]) == []
    assert [i.id for i in aws.describe(["nope", inst.id])] == [inst.id]
    assert aws.logs("sim-aws-nope") == ""
    assert gcp.logs(inst.id) == ""
    aws.terminate(["sim-aws-nope"])
    wait_ended(aws, [inst.id])


# -- terminate ------------------------------------------------------------------

JOB_WITH_HELPER = """
import os, pathlib, subprocess, sys, time
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
pathlib.Path(os.environ["PIDS"]).write_text(f"{os.getpid()} {helper.pid}")
time.sleep(600)
"""


def test_terminate_kills_the_whole_process_group(sims: Sims, tmp_path: Path) -> None:
    aws = sims()["sim-aws"]
    pids_file = tmp_path / "pids"
    inst = aws.launch(
        request(
            offering(aws, "us-east-1a", "p3.2xlarge"),
            JOB_WITH_HELPER,
            token="t",
            env={"PIDS": str(pids_file)},
        )
    )[0]
    wait_for(lambda: pids_file.exists() and " " in pids_file.read_text(), what="pids file")
    job_pid, helper_pid = map(int, pids_file.read_text().split())
    assert alive(job_pid) and alive(helper_pid)

    aws.terminate([inst.id])
    (done,) = aws.describe([inst.id])
    assert done.state is InstanceState.TERMINATED
    assert done.exit_code == -signal.SIGTERM
    wait_for(lambda: not alive(job_pid) and not alive(helper_pid), what="job processes gone")
    vm_pid = vm_status(tmp_path / "state", inst.id).pid
    assert vm_pid is not None
    wait_for(lambda: not alive(vm_pid), what="VM process gone")
    aws.terminate([inst.id])  # idempotent
    assert aws.describe([inst.id])[0].state is InstanceState.TERMINATED


def test_terminate_while_booting_never_starts_the_job(sims: Sims, tmp_path: Path) -> None:
    # 100 simulated days of boot, 40 real minutes: it boots until the test stops it.
    gcp = sims(boot_seconds=100 * 86_400)["sim-gcp"]
    marker = tmp_path / "ran"
    inst = gcp.launch(
        request(
            offering(gcp, "us-east4-a", "g2-standard-4"),
            f"open({str(marker)!r}, 'w')",
            token="t",
        )
    )[0]
    wait_for((tmp_path / "state" / f"{inst.id}.state.json").exists, what="VM up")
    assert gcp.describe([inst.id])[0].state is InstanceState.PENDING
    gcp.terminate([inst.id])
    assert gcp.describe([inst.id])[0].state is InstanceState.TERMINATED
    assert not marker.exists()


def test_sigterm_to_the_vm_ends_the_job(sims: Sims, tmp_path: Path) -> None:
    aws = sims()["sim-aws"]
    inst = aws.launch(request(offering(aws, "us-east-1c", "g5.xlarge"), RUNS_ON, token="t"))[0]
    wait_state(aws, [inst.id], InstanceState.RUNNING)
    status = vm_status(tmp_path / "state", inst.id)
    assert status.pid is not None and status.child_pid is not None
    os.kill(status.pid, signal.SIGTERM)
    (ended,) = wait_ended(aws, [inst.id])
    assert ended.state is InstanceState.TERMINATED
    wait_for(lambda: not alive(status.child_pid or 0), what="job gone")


def test_a_killed_vm_is_reported_ended_and_its_job_dies(sims: Sims, tmp_path: Path) -> None:
    aws = sims()["sim-aws"]
    inst = aws.launch(request(offering(aws, "us-east-1d", "g5.xlarge"), RUNS_ON, token="t"))[0]
    wait_state(aws, [inst.id], InstanceState.RUNNING)
    status = vm_status(tmp_path / "state", inst.id)
    assert status.pid is not None and status.child_pid is not None
    os.kill(status.pid, signal.SIGKILL)
    wait_for(lambda: not alive(status.pid or 0), what="VM gone")
    (ended,) = wait_ended(aws, [inst.id])
    assert ended.state is InstanceState.TERMINATED and ended.exit_code is None
    wait_for(lambda: not alive(status.child_pid or 0), what="job gone")


# -- spot market ----------------------------------------------------------------

JOB_TRAPS_SIGTERM = """
import os, pathlib, signal, sys, time
def on_term(signum, frame):
    pathlib.Path(os.environ["MARKER"]).write_text("checkpointed")
    if os.environ.get("EXIT_ON_TERM"):
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
pathlib.Path(os.environ["MARKER"] + ".ready").touch()
while True:
    time.sleep(0.01)
"""

JOB_IGNORES_SIGTERM = """
import os, pathlib, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(os.environ["MARKER"] + ".ready").touch()
while True:
    time.sleep(0.01)
"""


def test_spot_launch_into_a_down_pool_is_refused(sims: Sims, tmp_path: Path) -> None:
    down = write_trace(tmp_path / "down.json", 60, [0])
    aws = sims(traces={"us-west-2a": down})["sim-aws"]
    off = offering(aws, "us-west-2a", "p5.48xlarge")
    assert off.capacity == 0.0
    with pytest.raises(CapacityError) as info:
        aws.launch(request(off, "pass", token="spot", market=Market.SPOT))
    assert info.value.provider == "sim-aws" and info.value.code == "InsufficientCapacity"
    assert launch_lines(tmp_path / "state") == []
    # On-demand capacity is always there.
    inst = aws.launch(request(off, "pass", token="od"))[0]
    assert wait_ended(aws, [inst.id])[0].state is InstanceState.EXITED


def test_preemption_sends_sigterm_then_preempts(sims: Sims, tmp_path: Path) -> None:
    # The market takes both nodes back once both jobs run, whenever that is. GCP's 30 s
    # of notice last 10 real seconds at speed 3: the one real-time window left, in which
    # the jobs' SIGTERM handlers must run (a VM process reads the host's time, which no
    # test clock reaches); the test waits it out for the job that stays.
    gcp = sims(speed=3.0, boot_seconds=0, traces={"us-central1-a": always_up(tmp_path)})["sim-gcp"]
    off = offering(gcp, "us-central1-a", "a2-highgpu-1g")
    assert off.capacity == 1.0
    stays, leaves = tmp_path / "stays", tmp_path / "leaves"
    held = gcp.launch(
        request(off, JOB_TRAPS_SIGTERM, token="a", market=Market.SPOT, env={"MARKER": str(stays)})
    )[0]
    done = gcp.launch(
        request(
            off,
            JOB_TRAPS_SIGTERM,
            token="b",
            market=Market.SPOT,
            env={"MARKER": str(leaves), "EXIT_ON_TERM": "1"},
        )
    )[0]
    wait_for(lambda: Path(f"{stays}.ready").exists() and Path(f"{leaves}.ready").exists())
    assert states(gcp, [held.id, done.id]) == [InstanceState.RUNNING] * 2
    reclaimed = gcp.clock.now()
    gcp.reclaim(held.id)
    gcp.reclaim(done.id)
    wait_for(lambda: states(gcp, [held.id])[0] is InstanceState.NOTICE, what="notice")
    wait_for(stays.exists, what="SIGTERM marker")
    ended_held, ended_done = wait_ended(gcp, [held.id, done.id])
    # Trapped SIGTERM and kept going: killed when the 30 s notice ran out.
    assert ended_held.state is InstanceState.PREEMPTED
    assert ended_held.exit_code == -signal.SIGKILL
    # Saved its work and left with 0 during the notice: the job is done.
    assert leaves.read_text() == "checkpointed"
    assert (ended_done.state, ended_done.exit_code) == (InstanceState.EXITED, 0)
    status = vm_status(tmp_path / "state", held.id)
    assert status.notice_at is not None and status.ended_at is not None
    assert status.notice_at >= reclaimed
    # Not killed before the notice ran out (its timer is the VM's monotonic clock).
    assert (status.ended_at - status.notice_at).total_seconds() >= 30 - 3
    assert status.reason == "spot capacity reclaimed"


def test_a_pool_going_down_takes_back_a_booting_node(sims: Sims, tmp_path: Path) -> None:
    """The trace, not a test's hand, takes the node back: its pool is up and down in
    turns of half a real second, and the node boots for far longer, so the pool goes
    down while it boots, however late its VM process runs."""
    turn = 1800.0  # simulated seconds: half a real second at 3600x
    trace = write_trace(tmp_path / "trace.json", turn, [1, 0])
    gcp = sims(boot_seconds=1000 * turn, traces={"us-central1-a": trace})["sim-gcp"]
    off = offering(gcp, "us-central1-a", "a2-highgpu-1g")
    launched: list[Instance] = []
    tries = itertools.count()

    def launch_while_up() -> bool:  # refused while the pool is down: no node made then
        try:
            launched.extend(gcp.launch(request(off, RUNS_ON, token=f"t{next(tries)}",
                                               market=Market.SPOT)))  # fmt: skip
        except CapacityError as exc:
            assert exc.code == "InsufficientCapacity"
            return False
        return True

    wait_for(launch_while_up, what="a launch while the pool is up")
    (node,) = launched
    (ended,) = wait_ended(gcp, [node.id])
    assert (ended.state, ended.exit_code) == (InstanceState.PREEMPTED, None)
    status = vm_status(tmp_path / "state", node.id)
    assert status.running_at is None and status.child_pid is None, "the job never started"
    assert status.ended_at is not None and node.launched_at is not None
    down = gcp.market.next_change(off.pool, node.launched_at)
    assert down is not None and status.ended_at >= down
    assert status.reason == "spot capacity reclaimed while booting"


def test_a_job_ignoring_sigterm_is_killed_after_the_notice(sims: Sims, tmp_path: Path) -> None:
    # AWS gives 120 sim seconds of notice: 2 real seconds at speed 60. The market takes
    # the node back once its job runs (and ignores SIGTERM), whenever that is.
    up = always_up(tmp_path)
    aws = sims(speed=60.0, boot_seconds=0, traces={"us-east-1f": up})["sim-aws"]
    marker = tmp_path / "m"
    inst = aws.launch(
        request(
            offering(aws, "us-east-1f", "p3.2xlarge"),
            JOB_IGNORES_SIGTERM,
            token="t",
            market=Market.SPOT,
            env={"MARKER": str(marker)},
        )
    )[0]
    wait_for(Path(f"{marker}.ready").exists, what="job ready")
    aws.reclaim(inst.id)
    (ended,) = wait_ended(aws, [inst.id])
    assert ended.state is InstanceState.PREEMPTED and ended.exit_code == -signal.SIGKILL
    status = vm_status(tmp_path / "state", inst.id)
    assert status.notice_at is not None and status.ended_at is not None
    # Not killed before the notice ran out (its timer is the VM's monotonic clock, its
    # stamps the simulated one: a few simulated seconds of slack between the two). How
    # soon after it is a matter of speed, not of this test.
    assert (status.ended_at - status.notice_at).total_seconds() >= 115
    assert status.reason == "spot capacity reclaimed"
    assert status.child_pid is not None and not alive(status.child_pid)


def test_sim_provider_fits_the_provider_protocol(sims: Sims) -> None:
    contracts = pytest.importorskip("spotd.core.contracts")
    for provider in sims().values():
        assert isinstance(provider, contracts.Provider)


def test_a_market_with_lifetimes_takes_each_launch_back_on_its_schedule(
    sims: Sims, tmp_path: Path
) -> None:
    """Two runs of one seed: the same launches in a pool end after the same lifetimes,
    whatever real time passed between them, and a node is preempted when its runs out."""
    schedules = []
    for run, pause in (("one", 0.0), ("two", 0.4)):
        gcp = sims(speed=3600.0, lifetimes=True, name=run)["sim-gcp"]
        time.sleep(pause)  # the second run launches at other moments of simulated time
        off = offering(gcp, "us-central1-a", "a2-highgpu-1g")
        assert off.capacity == 1.0
        launched = [
            gcp.launch(request(off, RUNS_ON, token=f"{run}-{n}", market=Market.SPOT, nodes=2))
            for n in range(3)
        ]
        specs = [
            [InstanceSpec.load(tmp_path / run / f"{i.id}.spec.json") for i in nodes]
            for nodes in launched
        ]
        lifetimes = []
        for gang in specs:
            ends = {s.taken_back_at - s.launched_at for s in gang if s and s.taken_back_at}
            assert len(ends) == 1  # every node of a launch goes together
            lifetimes.append(ends.pop())
        schedules.append(lifetimes)
        gcp.terminate([i.id for nodes in launched for i in nodes])
    assert schedules[0] == schedules[1]
    assert schedules[0] == [gcp.market.lifetime(off.pool, n) for n in range(3)]
    # A retry of a launch (its client token) keeps its place in the schedule.
    again = gcp.launch(request(off, "pass", token="two-0", market=Market.SPOT, nodes=2))
    assert {i.id for i in again} == {i.id for i in launched[0]}


def test_a_node_is_preempted_when_its_lifetime_ends(sims: Sims, tmp_path: Path) -> None:
    # The first launch's lifetime in this pool is a real second at this speed, and the
    # node boots for two: its lifetime ends while it boots, however late its VM runs.
    # (How a running node is told and stopped: the reclaim tests above.)
    pool = Pool("sim-gcp", "us-central1", "us-central1-a", "a2-highgpu-1g")
    config = MarketConfig(seed=7, mean_up_hours=6.0, mean_down_hours=2.0, lifetimes=True)
    lifetime = SimMarket(config, epoch=EPOCH).lifetime(pool, 0)
    seconds = lifetime.total_seconds()
    gcp = sims(speed=seconds, boot_seconds=2 * seconds, lifetimes=True)["sim-gcp"]
    off = offering(gcp, pool.zone, pool.instance_type)
    (node,) = gcp.launch(request(off, RUNS_ON, token="a", market=Market.SPOT))
    (ended,) = wait_ended(gcp, [node.id])
    assert (ended.state, ended.exit_code) == (InstanceState.PREEMPTED, None)
    spec = InstanceSpec.load(tmp_path / "state" / f"{node.id}.spec.json")
    assert spec is not None and spec.taken_back_at == spec.launched_at + lifetime
    status = vm_status(tmp_path / "state", node.id)
    assert status.running_at is None, "the job never started"
    assert status.ended_at is not None and status.ended_at >= spec.taken_back_at
