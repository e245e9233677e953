"""examples/train_ddp.py: preempted and resumed, it ends on the reference digest.

The slow cases run it the way spotd would: two ``torchrun`` "nodes" of two workers
each on loopback (each torchrun in a session of its own, like a job's process
group), SIGTERM to one node's group, then a restart with ``SPOTD_RESUME_FROM``.
The fast case runs the example in this process, stopped by a notice file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from spotd import checkpoints as ck

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
STEPS = 60
SPOTD_VARS = (
    "SPOTD_CHECKPOINT_URI",
    "SPOTD_RESUME_FROM",
    "SPOTD_CHECKPOINT_INTERVAL_SECONDS",
    "SPOTD_NOTICE_FILE",
    "SPOTD_PROGRESS_FILE",
)


def _digest(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith("digest: ")]
    assert len(lines) == 1, out
    value = lines[0].removeprefix("digest: ")
    assert re.fullmatch(r"[0-9a-f]{64}", value)
    return value


def _latest(uri: str) -> int:
    latest = ck.latest_complete(uri)
    return -1 if latest is None else latest.step


# ------------------------------------------------------------------ fast, in-process


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    for name in (*SPOTD_VARS, "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    spec = importlib.util.spec_from_file_location("train_ddp_example", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look themselves up
    spec.loader.exec_module(module)
    yield module


@pytest.mark.timeout(120)
def test_single_process_notice_then_resume(
    example: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    steps = ["--steps", "30", "--ckpt-every", "5"]
    assert example.main(["--steps", "30"]) == 0
    reference = _digest(capsys.readouterr().out)

    uri = str(tmp_path / "ckpt")
    notice = tmp_path / "notice.json"
    monkeypatch.setenv("SPOTD_CHECKPOINT_URI", uri)
    monkeypatch.setenv("SPOTD_NOTICE_FILE", str(notice))

    def agent() -> None:  # the notice arrives once step 10 is safely checkpointed
        deadline = time.monotonic() + 60
        while _latest(uri) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        notice.write_text(json.dumps({"kind": "preemption", "deadline": None, "detail": ""}))

    thread = threading.Thread(target=agent)
    thread.start()
    code = example.main([*steps, "--step-seconds", "0.02"])
    thread.join()
    out = capsys.readouterr().out
    assert code == 143, out
    match = re.search(r"^interrupted at step (\d+)$", out, re.MULTILINE)
    assert match is not None, out
    stopped = int(match.group(1))
    assert 10 <= stopped < 30 and "digest:" not in out
    assert _latest(uri) == stopped

    notice.unlink()
    monkeypatch.setenv("SPOTD_RESUME_FROM", ck.join(uri, ck.checkpoint_name(stopped)))
    assert example.main(steps) == 0
    out = capsys.readouterr().out
    assert f"resumed from step {stopped}" in out.splitlines()
    assert _digest(out) == reference


# ----------------------------------------------------------------- slow, torchrun x 2


@pytest.fixture(scope="module", autouse=True)
def _own_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """torchrun leaves its torchelastic_* folders in TMPDIR: the tests' own, here (before
    the module's fixtures start any torchrun)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmp_path_factory.mktemp("torchrun-tmp")))
        yield


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(**spotd: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SPOTD_VARS}
    env.update(GLOO_SOCKET_IFNAME="lo", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="60", **spotd)
    return env


def _start(nodes: int, per_node: int, *args: str, **spotd: str) -> list[subprocess.Popen[str]]:
    """One torchrun per node, each the leader of its own process group."""
    port = _free_port()
    procs = []
    for node in range(nodes):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(nodes),
            "--node-rank",
            str(node),
            "--nproc-per-node",
            str(per_node),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            str(SCRIPT),
            "--steps",
            str(STEPS),
            *args,
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                env=_env(**spotd),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    return procs


@dataclass
class Finished:
    codes: list[int]
    out: str  # node 0's stdout, where global rank 0 prints
    err: str


def _finish(procs: list[subprocess.Popen[str]], timeout: float = 150) -> Finished:
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc in procs:
            results.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return Finished(
        codes=[p.returncode for p in procs],
        out=results[0][0],
        err="\n".join(e for _, e in results),
    )


def _run(nodes: int, per_node: int, *args: str, **spotd: str) -> Finished:
    done = _finish(_start(nodes, per_node, *args, **spotd))
    assert done.codes == [0] * nodes, done.out + done.err
    return done


@dataclass
class Preempted:
    uri: str
    stopped: int
    reference: str


@pytest.fixture(scope="module")
def preempted(tmp_path_factory: pytest.TempPathFactory) -> Preempted:
    """The reference digest (2 x 2, no spotd) and a 2 x 2 run preempted on node 1."""
    reference = _digest(_run(2, 2).out)
    root = tmp_path_factory.mktemp("ddp")
    uri = f"file://{root}/ckpt"
    progress = root / "progress.json"
    procs = _start(
        2,
        2,
        "--ckpt-every",
        "5",
        "--step-seconds",
        "0.05",
        SPOTD_CHECKPOINT_URI=uri,
        SPOTD_PROGRESS_FILE=str(progress),
    )
    deadline = time.monotonic() + 90
    while _latest(uri) < 10:
        assert all(p.poll() is None for p in procs), "a node exited before step 10"
        assert time.monotonic() < deadline, "no checkpoint of step 10 in time"
        time.sleep(0.02)
    os.killpg(procs[1].pid, signal.SIGTERM)  # the agent of node 1 signals its job
    done = _finish(procs)
    match = re.search(r"^interrupted at step (\d+)$", done.out, re.MULTILINE)
    assert match is not None, done.out + done.err
    stopped = int(match.group(1))
    assert 10 <= stopped < STEPS
    assert "digest:" not in done.out
    assert all(code != 0 for code in done.codes)  # neither node claims to have finished
    assert _latest(uri) == stopped  # the emergency checkpoint is complete
    report = json.loads(progress.read_text())
    assert report["step"] == stopped and report["total_steps"] == STEPS
    assert report["checkpoint"] == ck.join(uri, ck.checkpoint_name(stopped))
    return Preempted(uri=uri, stopped=stopped, reference=reference)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_preempted_then_resumed_matches_the_reference(preempted: Preempted) -> None:
    folder = ck.join(preempted.uri, ck.checkpoint_name(preempted.stopped))
    done = _run(
        2, 2, "--ckpt-every", "5", SPOTD_CHECKPOINT_URI=preempted.uri, SPOTD_RESUME_FROM=folder
    )
    assert f"resumed from step {preempted.stopped}" in done.out.splitlines()
    assert _digest(done.out) == preempted.reference
    assert _latest(preempted.uri) == STEPS


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_resume_on_fewer_ranks_reshards(preempted: Preempted, tmp_path: Path) -> None:
    folder = ck.join(preempted.uri, ck.checkpoint_name(preempted.stopped))
    other = f"file://{tmp_path}/ckpt"  # keep the 2 x 2 checkpoints out of it
    done = _run(1, 2, "--ckpt-every", "50", SPOTD_CHECKPOINT_URI=other, SPOTD_RESUME_FROM=folder)
    assert f"resumed from step {preempted.stopped}" in done.out.splitlines()
    _digest(done.out)  # the data per step depends on the world size, the digest too
    assert _latest(other) == STEPS
