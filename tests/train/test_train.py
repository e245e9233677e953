"""spotd.train: stop agreement, marker rule, deadline skip, resume/reshard, progress.

The multi-rank cases run real processes on gloo over loopback: this file is also
the worker (``python tests/test_train.py SCENARIO``), started once per rank with
torch's env:// variables and a free port. Each worker prints one ``RESULT {json}``
line; the tests assert on those and on the files left behind.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from spotd import checkpoints as ck
from spotd.core.clock import WALL, ManualClock
from spotd.core.contracts import Clock
from spotd.core.errors import CheckpointError
from spotd.train import Notice, Run, SaveBudget, SignalFlag, read_notice, write_progress

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
SPOTD_VARS = (
    "SPOTD_CHECKPOINT_URI",
    "SPOTD_RESUME_FROM",
    "SPOTD_CHECKPOINT_INTERVAL_SECONDS",
    "SPOTD_NOTICE_FILE",
    "SPOTD_PROGRESS_FILE",
)


EPOCH = datetime(2026, 3, 2, tzinfo=UTC)


def _iso(delta_seconds: float, clock: Clock = WALL) -> str:
    """``delta_seconds`` after ``clock``'s now (a worker process's clock is the wall)."""
    return (clock.now() + timedelta(seconds=delta_seconds)).isoformat()


def _write_notice(path: Path, deadline: str | None) -> None:
    """Write a notice the way the agent does: temp file, then rename."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kind": "preemption", "deadline": deadline, "detail": "test"}))
    tmp.replace(path)


# --------------------------------------------------------------------------- torch-free


def test_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import spotd.train as t\n"
        "run = t.Run.from_env({})\n"
        "assert run.world_size == 1 and run.is_main\n"
        "assert run.should_stop(1) is False and run.should_save(1) is False\n"
        "assert run.save(1, {}) is None\n"
        "run.close()\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    # and importing it does not pull torch in when torch is there
    lazy = subprocess.run(
        [sys.executable, "-c", "import sys, spotd.train; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert lazy.stdout.strip() == "False", lazy.stderr


def test_read_notice(tmp_path: Path) -> None:
    path = tmp_path / "notice.json"
    assert read_notice(None) is None
    assert read_notice(path) is None
    path.write_text(
        json.dumps(
            {"kind": "preemption", "deadline": "2026-12-01T20:31:05.123+00:00", "detail": "x"}
        )
    )
    notice = read_notice(path)
    assert notice is not None and notice.kind == "preemption" and notice.detail == "x"
    assert notice.deadline == datetime(2026, 12, 1, 20, 31, 5, 123000, tzinfo=UTC)
    now = datetime(2026, 12, 1, 20, 31, 0, 123000, tzinfo=UTC)
    assert notice.seconds_left(now) == pytest.approx(5.0)
    path.write_text(json.dumps({"kind": "preemption", "deadline": None}))
    assert read_notice(path) == Notice("preemption", None, "")
    path.write_text("{not json")
    broken = read_notice(path)
    assert broken is not None and broken.deadline is None and broken.kind == "unknown"


def test_signal_flag_chains_and_restores() -> None:
    calls: list[int] = []

    def previous(signum: int, frame: object) -> None:
        calls.append(signum)

    old = signal.signal(signal.SIGTERM, previous)
    try:
        flag = SignalFlag()
        assert flag.install()
        # To this thread, the main one; Python's handlers have run when it returns.
        signal.raise_signal(signal.SIGTERM)
        assert flag.received == signal.SIGTERM
        assert calls == [signal.SIGTERM]
        flag.restore()
        assert signal.getsignal(signal.SIGTERM) is previous
        # only the main thread may install handlers: elsewhere it declines
        other = SignalFlag()
        outcome: list[bool] = []
        thread = threading.Thread(target=lambda: outcome.append(other.install()))
        thread.start()
        thread.join()
        assert outcome == [False]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_save_budget() -> None:
    budget = SaveBudget(first_estimate=None)
    assert budget.estimate() is None
    assert SaveBudget.fits(None, None) and SaveBudget.fits(None, 0.5)
    assert not SaveBudget.fits(None, -1.0)
    budget = SaveBudget(first_estimate=4.0, factor=1.5, margin_seconds=2.0)
    assert budget.estimate() == pytest.approx(8.0)
    budget.record(1.0)
    budget.record(3.0)
    assert budget.estimate() == pytest.approx(6.5)  # the longest recent save counts
    assert SaveBudget.fits(6.5, 7.0) and not SaveBudget.fits(6.5, 6.0)


def test_progress_file_and_notice_without_torch(tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    write_progress(progress, 3, 10, "s3://b/step-00000002")
    data = json.loads(progress.read_text())
    assert data["step"] == 3 and data["total_steps"] == 10
    assert data["checkpoint"] == "s3://b/step-00000002"
    assert datetime.fromisoformat(data["at"]).tzinfo is not None
    notice = tmp_path / "notice.json"
    env = {"SPOTD_PROGRESS_FILE": str(progress), "SPOTD_NOTICE_FILE": str(notice)}
    clock = ManualClock(EPOCH)
    with Run.from_env(env, progress_every_seconds=3600, clock=clock) as run:
        run.report(5, total_steps=9)
        assert json.loads(progress.read_text())["step"] == 5
        clock.advance(60)
        run.report(6)  # throttled: soon after the last write, nothing new to say
        assert json.loads(progress.read_text())["step"] == 5
        assert not run.should_stop(6)
        _write_notice(notice, _iso(60, clock))
        assert run.should_stop(7) and run.should_stop(8)
        clock.advance(10)
        assert run.time_left() == pytest.approx(50)
    final = json.loads(progress.read_text())  # close() writes the last report
    assert final["step"] == 6 and final["total_steps"] == 9 and final["checkpoint"] is None


# ------------------------------------------------------------------ torch, one process


def _digest(*tensors: Any) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _model_and_optim(seed: int = 0) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    return model, optim


def _train_step(model: Any, optim: Any, step: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(step)
    x = torch.randn(5, 8, generator=gen)
    optim.zero_grad()
    torch.autograd.backward(model(x).square().mean())
    optim.step()


@needs_torch
@pytest.mark.timeout(60)
def test_save_restore_and_torn_folders(tmp_path: Path) -> None:
    from spotd.train import ModelState

    uri = str(tmp_path / "ckpt")
    progress = tmp_path / "progress.json"
    model, optim = _model_and_optim()
    state = {"app": ModelState(model, optim)}
    with Run(checkpoint_uri=uri, every_steps=2, progress_file=progress) as run:
        assert run.restore(state) == 0
        for step in range(1, 6):
            _train_step(model, optim, step)
            if run.should_save(step):
                run.save(step, state)
        assert run.wait() == ck.join(uri, "step-00000004")
        expected = _digest(*model.parameters())
        run.report(5, total_steps=5, force=True)
    assert json.loads(progress.read_text())["checkpoint"] == ck.join(uri, "step-00000004")
    assert [c.step for c in ck.list_complete(uri)] == [2, 4]
    weights_at_4 = expected  # step 5's update came after the save at 4; recompute below

    # a torn checkpoint at a later step (all files but the marker) is never resumed
    torn = tmp_path / "ckpt" / "step-00000009"
    torn.mkdir()
    for f in (tmp_path / "ckpt" / "step-00000004").iterdir():
        if f.name != ck.MARKER:
            (torn / f.name).write_bytes(f.read_bytes())
    fresh_model, fresh_optim = _model_and_optim(seed=1)
    with Run(checkpoint_uri=uri) as again:
        assert again.restore({"app": ModelState(fresh_model, fresh_optim)}) == 4
        assert again.resumed_from == ck.join(uri, "step-00000004")
    # replaying step 5 from the checkpoint lands on the same weights
    _train_step(fresh_model, fresh_optim, 5)
    assert _digest(*fresh_model.parameters()) == weights_at_4
    with (
        Run(checkpoint_uri=uri, resume_from=str(torn)) as explicit,
        pytest.raises(CheckpointError, match="_COMPLETE"),
    ):
        explicit.restore({"app": ModelState(*_model_and_optim())})


@needs_torch
@pytest.mark.timeout(60)
def test_async_save_keeps_the_values_at_save_time(tmp_path: Path) -> None:
    import torch

    uri = str(tmp_path / "ckpt")
    state = {"w": torch.arange(1000, dtype=torch.float64)}
    with Run(checkpoint_uri=uri) as run:
        run.restore(state)
        folder = run.save(3, state)
        state["w"] += 1.0  # training goes on while the write runs
        assert run.wait() == folder
    loaded = {"w": torch.zeros(1000, dtype=torch.float64)}
    with Run(checkpoint_uri=uri) as again:
        assert again.restore(loaded) == 3
    assert torch.equal(loaded["w"], torch.arange(1000, dtype=torch.float64))


def _slow_writer_factory(
    delay: float = 0.0, fail_steps: tuple[int, ...] = (), clock: ManualClock | None = None
) -> Callable[[str], Any]:
    """Writers that take ``delay`` seconds of ``clock`` (moving it: nothing sleeps) and
    fail at ``fail_steps``."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    class SlowWriter(FileSystemWriter):
        def __init__(self, folder: str) -> None:
            super().__init__(folder)
            self.folder = Path(folder)

        def write_data(self, plan: Any, planner: Any) -> Any:
            if clock is not None:
                clock.advance(delay)
            if int(self.folder.name.removeprefix("step-")) in fail_steps:
                raise OSError("injected write failure")
            return super().write_data(plan, planner)

    return SlowWriter


@needs_torch
@pytest.mark.timeout(60)
def test_emergency_save_skipped_when_it_cannot_fit(tmp_path: Path) -> None:
    import torch

    uri = str(tmp_path / "ckpt")
    notice = tmp_path / "notice.json"
    lines: list[str] = []
    state = {"w": torch.ones(10)}
    clock = ManualClock(EPOCH)
    with Run(
        checkpoint_uri=uri,
        notice_file=notice,
        writer_factory=_slow_writer_factory(0.5, clock=clock),
        save_factor=1.5,
        save_margin_seconds=1.0,
        log=lines.append,
        clock=clock,
    ) as run:
        run.restore(state)
        run.save(1, state)
        assert run.wait() == ck.join(uri, "step-00000001")
        (measured,) = run.budget.measured
        assert measured == pytest.approx(0.5)
        # estimate 0.5 * 1.5 + 1 = 1.75 s; the node dies in 1 s
        _write_notice(notice, _iso(1.0, clock))
        assert run.should_stop(2)
        assert run.save(2, state, emergency=True) is None
        assert not (tmp_path / "ckpt" / "step-00000002").exists()
    skip = [ln for ln in lines if "skipping the emergency checkpoint at step 2" in ln]
    assert len(skip) == 1, lines
    assert "step-00000001" in skip[0]

    # with time to spare it saves, and the save is complete when save() returns
    _write_notice(notice, _iso(120, clock))
    with Run(
        checkpoint_uri=uri,
        notice_file=notice,
        first_save_seconds=0.5,
        log=lines.append,
        clock=clock,
    ) as run:
        run.restore(state)
        assert run.should_stop(3)
        assert run.save(3, state, emergency=True) == ck.join(uri, "step-00000003")
        assert ck.is_complete(ck.join(uri, "step-00000003"))
    assert any("emergency checkpoint at step 3" in ln for ln in lines)


@needs_torch
@pytest.mark.timeout(60)
def test_failed_write_leaves_no_marker(tmp_path: Path) -> None:
    import torch

    uri = str(tmp_path / "ckpt")
    lines: list[str] = []
    state = {"w": torch.ones(10)}
    with Run(
        checkpoint_uri=uri, writer_factory=_slow_writer_factory(fail_steps=(2,)), log=lines.append
    ) as run:
        run.restore(state)
        run.save(1, state)
        run.save(2, state)  # drains the save of step 1, then fails in the background
        assert run.wait() == ck.join(uri, "step-00000001")
        assert run.last_checkpoint == ck.join(uri, "step-00000001")
    assert [c.step for c in ck.list_complete(uri)] == [1]
    assert any("checkpoint at step 2 failed" in ln for ln in lines), lines

    # the synchronous path (async_save=False, or an emergency save) fails the same way
    with Run(
        checkpoint_uri=uri,
        writer_factory=_slow_writer_factory(fail_steps=(3,)),
        async_save=False,
        log=lines.append,
    ) as run:
        assert run.restore(state) == 1
        assert run.save(3, state) is None
        assert run.save(3, state, emergency=True) is None
    assert [c.step for c in ck.list_complete(uri)] == [1]


# ----------------------------------------------------------------------- multi-process


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(scenario: str, world: int, tmp: Path, **extra: str) -> list[subprocess.Popen[str]]:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if k not in SPOTD_VARS}
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
            T_DIR=str(tmp),
            **extra,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE), scenario],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def _results(procs: list[subprocess.Popen[str]], timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    results = []
    for code, out, err in outputs:
        assert code == 0, f"worker failed ({code}):\n{out}\n{err}"
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert len(lines) == 1, out + err
        result = json.loads(lines[0].removeprefix("RESULT "))
        result["stderr"] = err
        results.append(result)
    return results


def _wait_until(cond: Callable[[], bool], procs: list[subprocess.Popen[str]], what: str) -> None:
    deadline = time.monotonic() + 45
    while not cond():
        for proc in procs:
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"a worker exited waiting for {what}:\n{out}\n{err}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _latest(uri: str) -> int:
    latest = ck.latest_complete(uri)
    return -1 if latest is None else latest.step


@needs_torch
@pytest.mark.timeout(120)
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(tmp_path: Path) -> None:
    uri = str(tmp_path / "ckpt")
    procs = _launch("stop", 3, tmp_path, SPOTD_CHECKPOINT_URI=uri)
    _wait_until(lambda: _latest(uri) >= 4, procs, "the checkpoint of step 4")
    procs[1].send_signal(signal.SIGTERM)  # rank 1 alone is told
    results = _results(procs)

    stopped = {r["stopped_at"] for r in results}
    saved = {r["saved"] for r in results}
    assert len(stopped) == 1 and len(saved) == 1, results
    (step,) = stopped
    assert step > 4
    assert [r["got_signal"] for r in results] == [False, True, False]
    folder = ck.join(uri, ck.checkpoint_name(step))
    assert saved == {folder}
    assert ck.is_complete(folder) and _latest(uri) == step
    # progress: global rank 0 only, with the step and the last complete checkpoint
    progress = json.loads((tmp_path / "progress-0.json").read_text())
    assert progress["step"] == step and progress["checkpoint"] == folder
    assert progress["total_steps"] == STOP_TOTAL_STEPS
    assert not (tmp_path / "progress-1.json").exists()
    assert not (tmp_path / "progress-2.json").exists()
    # ... and every rank its own file beside it, at the step it stopped at (hang watch).
    for rank in range(3):
        kept = json.loads((tmp_path / f"progress-rank-{rank}.json").read_text())
        assert (kept["rank"], kept["step"]) == (rank, step) and kept["pid"] > 0


@needs_torch
@pytest.mark.timeout(120)
def test_marker_only_after_every_rank_wrote(tmp_path: Path) -> None:
    uri = str(tmp_path / "ckpt")
    root = tmp_path / "ckpt"
    violations: list[str] = []
    procs = _launch("marker", 2, tmp_path, SPOTD_CHECKPOINT_URI=uri)

    # Watch from outside too: a marker must never sit next to a missing shard.
    def watch() -> None:
        while any(p.poll() is None for p in procs):
            for folder in root.glob("step-*"):
                if (folder / ck.MARKER).exists() and len(list(folder.glob("*.distcp"))) < 2:
                    violations.append(folder.name)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = _results(procs)
    finally:
        watcher.join()
    assert violations == []
    slow = results[1]
    # rank 1 looked for the marker just before writing its (late) shard: never there
    assert slow["marker_before_my_write"] == {"3": False, "6": False, "9": False}
    for step in (3, 6):
        folder = root / ck.checkpoint_name(step)
        marker_time = (folder / ck.MARKER).stat().st_mtime_ns
        shards = [*folder.glob("*.distcp"), folder / ".metadata"]
        assert len(shards) == 3
        assert all(f.stat().st_mtime_ns <= marker_time for f in shards)
    # step 9 failed on rank 1: no marker, never resumed from
    assert (root / "step-00000009").is_dir()
    assert not (root / "step-00000009" / ck.MARKER).exists()
    assert _latest(uri) == 6
    assert {r["resumed"] for r in results} == {6}
    assert "checkpoint at step 9 failed" in results[0]["stderr"]


@needs_torch
@pytest.mark.timeout(120)
def test_deadline_too_close_skips_the_save_on_every_rank(tmp_path: Path) -> None:
    uri = str(tmp_path / "ckpt")
    procs = _launch("deadline", 2, tmp_path, SPOTD_CHECKPOINT_URI=uri)
    results = _results(procs)
    for r in results:
        # phase 1: rank 1's notice leaves 1 s, the save needs ~9.5 s: both skip
        assert r["short"] == {"stopped_at": 3, "saved": None}
        # phase 2: 10 minutes left: both save the same step
        assert r["long"] == {"stopped_at": 5, "saved": ck.join(uri, "step-00000005")}
    assert results[0]["got_notice"] == [False, False]  # rank 0 learned it by agreement
    assert results[1]["got_notice"] == [True, True]
    assert not (tmp_path / "ckpt" / "step-00000003").exists()
    assert ck.is_complete(ck.join(uri, "step-00000005"))
    skip = [
        ln
        for ln in results[0]["stderr"].splitlines()
        if "skipping the emergency checkpoint at step 3" in ln
    ]
    assert len(skip) == 1, results[0]["stderr"]
    assert "skipping" not in results[1]["stderr"]  # one line, from rank 0


@pytest.fixture(scope="module")
def world2_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    """Step 7 saved by 2 ranks (DDP model + Adam, a table sharded in 2); its digests."""
    if not HAS_TORCH:
        pytest.skip("torch is not installed")
    tmp = tmp_path_factory.mktemp("world2")
    (saved,) = {json.dumps(r["digests"]) for r in _results(_launch("reshard_save", 2, tmp))}
    folder = ck.join(str(tmp / "ckpt"), "step-00000007")
    assert ck.is_complete(folder)
    assert len(list(Path(folder).glob("*.distcp"))) == 2  # one shard file per rank
    return folder, json.loads(saved)


@needs_torch
@pytest.mark.timeout(150)
def test_resume_from_world_2_in_one_process(world2_checkpoint: tuple[str, dict[str, str]]) -> None:
    import torch

    from spotd.train import ModelState

    folder, expected = world2_checkpoint
    # no process group and no DDP: the sharded table comes back whole
    model, optim = _model_and_optim(seed=5)
    table = torch.zeros(10, 4)
    with Run(resume_from=folder) as run:
        assert run.restore({"app": ModelState(model, optim), "table": table}) == 7
    assert torch.equal(table, torch.arange(40.0).reshape(10, 4))
    assert _digest(*model.parameters()) == expected["model"]
    assert _digest(*(s["exp_avg"] for s in optim.state.values())) == expected["exp_avg"]


@needs_torch
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_resume_from_world_2_on_3_ranks(
    world2_checkpoint: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    folder, expected = world2_checkpoint
    # three uneven shards of the table; model and optimizer replicated again
    results = _results(_launch("reshard_load", 3, tmp_path, SPOTD_RESUME_FROM=folder))
    for r in results:
        assert r["step"] == 7
        assert r["digests"] == expected
        assert r["table_ok"]


# ----------------------------------------------------------------------------- workers


STOP_TOTAL_STEPS = 100_000
"""Steps of the "stop" workers: 50 minutes at their pace, longer than the test may take,
so only the signal the test sends ends them, however late it comes."""


def _worker_stop(rank: int, world: int, tmp: Path) -> dict[str, Any]:
    import torch

    state = {"w": torch.zeros(64)}
    run = Run.from_env(every_steps=4, progress_file=tmp / f"progress-{rank}.json")
    run.restore(state)
    stopped_at, saved = -1, None
    total = STOP_TOTAL_STEPS
    for step in range(1, total + 1):
        time.sleep(0.03)
        state["w"] += 1.0
        run.report(step, total_steps=total)
        if run.should_stop(step):
            stopped_at, saved = step, run.save(step, state, emergency=True)
            break
        if run.should_save(step):
            run.save(step, state)
    got_signal = run.signal_received is not None
    run.close()
    return {"stopped_at": stopped_at, "saved": saved, "got_signal": got_signal}


def _worker_marker(rank: int, world: int, tmp: Path) -> dict[str, Any]:
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    seen: dict[str, bool] = {}

    class LateWriter(FileSystemWriter):
        """Rank 1 writes its shard a second late (and fails at step 9)."""

        def __init__(self, folder: str) -> None:
            super().__init__(folder)
            self.folder = Path(folder)

        def write_data(self, plan: Any, planner: Any) -> Any:
            step = int(self.folder.name.removeprefix("step-"))
            time.sleep(1.0)
            seen[str(step)] = (self.folder / ck.MARKER).exists()
            if step == 9:
                raise OSError("injected failure on rank 1")
            return super().write_data(plan, planner)

    factory = LateWriter if rank == 1 else None
    state = {"w": torch.arange(256.0) + rank * 1000}
    run = Run.from_env(every_steps=3, writer_factory=factory)
    run.restore(state)
    for step in range(1, 12):
        time.sleep(0.05)
        if run.should_save(step):
            run.save(step, state)
    run.close()
    again = Run.from_env()
    resumed = again.restore({"w": torch.zeros(256)})
    again.close()
    return {"marker_before_my_write": seen, "resumed": resumed}


def _worker_deadline(rank: int, world: int, tmp: Path) -> dict[str, Any]:
    import torch

    notice = tmp / f"notice-{rank}.json"
    state = {"w": torch.zeros(16)}
    out: dict[str, Any] = {"got_notice": []}
    for phase, notice_at, left in (("short", 3, 1.0), ("long", 5, 600.0)):
        notice.unlink(missing_ok=True)
        run = Run.from_env(notice_file=notice, first_save_seconds=5.0)
        run.restore(state)
        result: dict[str, Any] = {"stopped_at": None, "saved": None}
        for step in range(1, 50):
            time.sleep(0.02)
            if rank == 1 and step == notice_at:
                _write_notice(notice, _iso(left))  # the agent, on rank 1's node only
            if run.should_stop(step):
                out["got_notice"].append(read_notice(notice) is not None)
                result = {"stopped_at": step, "saved": run.save(step, state, emergency=True)}
                break
        run.close()
        out[phase] = result
    return out


def _reshard_state(world: int, fill: Any) -> tuple[dict[str, Any], Any, Any, Any]:
    """The state a resharding worker saves or loads: DDP model + Adam, a sharded table."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.nn.parallel import DistributedDataParallel

    from spotd.train import ModelState

    model, optim = _model_and_optim(seed=dist.get_rank() + 11)
    ddp = DistributedDataParallel(model)
    mesh = init_device_mesh("cpu", (world,))
    table = distribute_tensor(fill.clone(), mesh, [Shard(0)])
    return {"app": ModelState(ddp, optim), "table": table}, ddp, optim, table


def _worker_reshard_save(rank: int, world: int, tmp: Path) -> dict[str, Any]:
    import torch

    state, ddp, optim, _table = _reshard_state(world, torch.arange(40.0).reshape(10, 4))
    for step in range(3):
        _train_step(ddp, optim, step * 10 + rank)  # DDP averages the ranks' gradients
    with Run(checkpoint_uri=str(tmp / "ckpt")) as run:
        run.restore(state)
        run.save(7, state)
    digests = {
        "model": _digest(*ddp.parameters()),
        "exp_avg": _digest(*(s["exp_avg"] for s in optim.state.values())),
    }
    return {"digests": digests}


def _worker_reshard_load(rank: int, world: int, tmp: Path) -> dict[str, Any]:
    import torch

    state, ddp, optim, table = _reshard_state(world, torch.zeros(10, 4))
    with Run.from_env() as run:
        step = run.restore(state)
    full = table.full_tensor()
    digests = {
        "model": _digest(*ddp.parameters()),
        "exp_avg": _digest(*(s["exp_avg"] for s in optim.state.values())),
    }
    ok = bool(torch.equal(full, torch.arange(40.0).reshape(10, 4)))
    return {"step": step, "digests": digests, "table_ok": ok}


WORKERS: dict[str, Callable[[int, int, Path], dict[str, Any]]] = {
    "stop": _worker_stop,
    "marker": _worker_marker,
    "deadline": _worker_deadline,
    "reshard_save": _worker_reshard_save,
    "reshard_load": _worker_reshard_load,
}


def _worker_main(scenario: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        result = WORKERS[scenario](
            dist.get_rank(), dist.get_world_size(), Path(os.environ["T_DIR"])
        )
    finally:
        dist.destroy_process_group()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    _worker_main(sys.argv[1])
