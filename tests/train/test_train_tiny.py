"""examples/train_tiny.py as real subprocesses: preemption, torn writes, resume."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from spotd import checkpoints as ck

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_tiny.py"
STEPS = 3000
"""Steps of every run: a fraction of a second unpaced, a minute at the 0.02 s a step of
the runs the tests preempt, so a run the test means to stop never ends before the
test's signal, however late that comes (a run the test has to wait for takes 5 steps)."""
SPOTD_VARS = (
    "SPOTD_CHECKPOINT_URI",
    "SPOTD_RESUME_FROM",
    "SPOTD_JOB_ID",
    "SPOTD_ATTEMPT",
    "SPOTD_NODE_RANK",
    "SPOTD_NUM_NODES",
)


def _env(ckpt: str | None = None, resume: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SPOTD_VARS}
    if ckpt is not None:
        env["SPOTD_CHECKPOINT_URI"] = ckpt
    if resume is not None:
        env["SPOTD_RESUME_FROM"] = resume
    return env


def _args(*extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--steps", str(STEPS), *extra]


def _run(*extra: str, ckpt: str | None = None, resume: str | None = None) -> str:
    proc = subprocess.run(
        _args(*extra),
        env=_env(ckpt, resume),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _digest(stdout: str) -> str:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("digest: ")]
    assert len(lines) == 1, stdout
    value = lines[0].removeprefix("digest: ")
    assert re.fullmatch(r"[0-9a-f]{64}", value)
    return value


@pytest.fixture(scope="module")
def reference_digest() -> str:
    """Digest of one uninterrupted run without checkpoints."""
    return _digest(_run())


def _start(ckpt: str, resume: str | None = None, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _args("--step-seconds", "0.02", "--ckpt-every", "5", *extra),
        env=_env(ckpt, resume),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(cond: Callable[[], bool], proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 20
    while not cond():
        assert proc.poll() is None, f"trainer exited early waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _latest_step(ckpt: str) -> int:
    latest = ck.latest_complete(ckpt)
    return -1 if latest is None else latest.step


def _preempt(ckpt: str, resume: str | None, after_step: int) -> int:
    """Run until a checkpoint past ``after_step`` exists, SIGTERM it, return its last step."""
    proc = _start(ckpt, resume)
    _wait_for(lambda: _latest_step(ckpt) > after_step, proc, f"a checkpoint after {after_step}")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 143, (out, err)
    match = re.search(r"^interrupted at step (\d+)$", out, re.MULTILINE)
    assert match is not None, out
    stopped = int(match.group(1))
    assert after_step < stopped < STEPS
    assert "digest:" not in out
    # the notice checkpoint is the step the job stopped at, and it is complete
    assert _latest_step(ckpt) == stopped
    return stopped


def _assert_consistent(ckpt_root: Path) -> None:
    """Every complete checkpoint holds the weights its state.json describes."""
    for info in ck.list_complete(str(ckpt_root)):
        folder = Path(info.uri)
        state = json.loads((folder / "state.json").read_text())
        weights = np.load(folder / "weights.npy", allow_pickle=False)
        assert state["step"] == info.step
        assert hashlib.sha256(weights.tobytes()).hexdigest() == state["weights_sha256"]


def test_uninterrupted_digest_is_stable(reference_digest: str, tmp_path: Path) -> None:
    again = _run()
    assert _digest(again) == reference_digest
    assert "fresh start" in again
    assert f"step {STEPS}/{STEPS} loss=" in again
    # checkpointing does not change the result
    with_ckpt = _run("--ckpt-every", "7", ckpt=str(tmp_path / "ckpt"))
    assert _digest(with_ckpt) == reference_digest
    assert _latest_step(str(tmp_path / "ckpt")) == STEPS


def test_sigterm_then_resume_gives_same_digest(reference_digest: str, tmp_path: Path) -> None:
    ckpt = f"file://{tmp_path}/ckpt"
    stopped = _preempt(ckpt, None, after_step=0)
    latest = ck.latest_complete(ckpt)
    assert latest is not None and latest.uri.startswith("file://")
    _assert_consistent(tmp_path / "ckpt")

    out = _run(ckpt=ckpt, resume=latest.uri)
    assert f"resumed from step {stopped}" in out.splitlines()
    assert _digest(out) == reference_digest


def test_sigkill_before_marker_leaves_torn_checkpoint(
    reference_digest: str, tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    proc = subprocess.run(
        _args("--ckpt-every", "10", "--kill-before-marker", "30"),
        env=_env(str(root)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL
    torn = root / ck.checkpoint_name(30)
    assert (torn / "weights.npy").is_file() and (torn / "state.json").is_file()
    assert not (torn / ck.MARKER).exists()
    assert [c.step for c in ck.list_complete(str(root))] == [10, 20]

    # spotd passes the latest complete one
    latest = ck.latest_complete(str(root))
    assert latest is not None
    out = _run(ckpt=str(root), resume=latest.uri)
    assert "resumed from step 20" in out.splitlines()
    assert _digest(out) == reference_digest
    # the torn folder was rewritten and is complete now
    assert ck.is_complete(str(torn))
    _assert_consistent(root)


def test_resume_refuses_a_torn_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    subprocess.run(
        _args("--ckpt-every", "10", "--kill-before-marker", "10"),
        env=_env(str(root)),
        capture_output=True,
        timeout=60,
        check=False,
    )
    proc = subprocess.run(
        _args(),
        env=_env(str(root), str(root / ck.checkpoint_name(10))),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert ck.MARKER in proc.stderr


def test_sigkill_at_random_moment_keeps_complete_checkpoints_whole(
    reference_digest: str, tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    # checkpoint every step with no sleep, so the kill very likely lands mid-write
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--steps", "100000", "--ckpt-every", "1"],
        env=_env(str(root)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for(lambda: _latest_step(str(root)) >= 5, proc, "some checkpoints")
    time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=20)
    _assert_consistent(root)
    steps = [c.step for c in ck.list_complete(str(root))]
    assert steps == list(range(1, steps[-1] + 1))

    # resuming the 100-step job from an early complete checkpoint matches the reference
    out = _run(ckpt=str(tmp_path / "other"), resume=str(root / ck.checkpoint_name(5)))
    assert "resumed from step 5" in out.splitlines()
    assert _digest(out) == reference_digest


def test_three_preemptions_give_same_digest(reference_digest: str, tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    resume: str | None = None
    stopped = 0
    for _ in range(3):
        stopped = _preempt(ckpt, resume, after_step=stopped)
        latest = ck.latest_complete(ckpt)
        assert latest is not None
        resume = latest.uri
    _assert_consistent(tmp_path / "ckpt")

    # the last attempt finds its checkpoint itself, without SPOTD_RESUME_FROM
    out = _run(ckpt=ckpt)
    assert f"resumed from step {stopped}" in out.splitlines()
    assert _digest(out) == reference_digest


def _load_trainer(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_tiny_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses resolve the script's string annotations through sys.modules
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("notice_during", "code"), [(STEPS - 1, 0), (42, 143)])
def test_notice_is_honoured_at_the_next_step_boundary(
    notice_during: int,
    code: int,
    reference_digest: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In-process so the notice lands during an exact step, which a real signal cannot.
    trainer = _load_trainer(monkeypatch)
    for var in SPOTD_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPOTD_CHECKPOINT_URI", str(tmp_path))
    stop = trainer.StopFlag()
    real_step = trainer.sgd_step

    def step_with_notice(weights: Any, target: Any, step: int, seed: int) -> float:
        if step == notice_during:
            stop.requested = True
        return float(real_step(weights, target, step, seed))

    monkeypatch.setattr(trainer, "sgd_step", step_with_notice)
    cfg = trainer.parse_args(["--steps", str(STEPS)])
    assert trainer.run(cfg, stop) == code
    out = capsys.readouterr().out
    # the step in progress is finished and checkpointed, no further step is started
    assert _latest_step(str(tmp_path)) == notice_during + 1
    if code == 0:
        assert _digest(out) == reference_digest
    else:
        assert f"interrupted at step {notice_during + 1}" in out.splitlines()
        assert "digest:" not in out


class PaceClock:
    """The trainer's ``time`` module, in-process: a clock that moves only by the
    trainer's sleeps and by a stop the test makes, so its pace is counted, not raced."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.slept += seconds
        self.now += seconds


def _paced_run(
    stop: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> PaceClock:
    """A 40-step run paced at 0.05 s a step, on a :class:`PaceClock`, whose host stops it
    for ``stop`` seconds in the step after its checkpoint of step 5."""
    trainer = _load_trainer(monkeypatch)
    for var in SPOTD_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SPOTD_CHECKPOINT_URI", str(tmp_path / f"ckpt-{stop:g}"))
    clock = PaceClock()
    monkeypatch.setattr(trainer, "time", clock)
    real_step = trainer.sgd_step

    def step_with_stop(weights: Any, target: Any, step: int, seed: int) -> float:
        if step == 5:  # the sixth step, right after the checkpoint of step 5
            clock.now += stop
        return float(real_step(weights, target, step, seed))

    monkeypatch.setattr(trainer, "sgd_step", step_with_stop)
    cfg = trainer.parse_args(["--steps", "40", "--ckpt-every", "5", "--step-seconds", "0.05"])
    assert trainer.run(cfg, trainer.StopFlag()) == 0
    assert _digest(capsys.readouterr().out)
    return clock


def test_step_seconds_paces_steps_so_a_delay_is_made_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stop of the process (a busy host) is made up after it: the run keeps the pace
    of --step-seconds on the whole, as a GPU would, instead of running late by the stop."""
    steady = _paced_run(0.0, tmp_path, monkeypatch, capsys)
    stopped = _paced_run(1.5, tmp_path, monkeypatch, capsys)
    # 40 steps of 0.05 s are 2 s, the 1.5 s stop included: it waits 1.5 s less. Slept
    # step by step after the stop, the run would end 1.5 s late, at 3.5 s.
    assert steady.now == pytest.approx(2.0) and steady.slept == pytest.approx(2.0)
    assert stopped.now == pytest.approx(2.0) and stopped.slept == pytest.approx(0.5)
