#!/usr/bin/env python3
"""A tiny, deterministic training job that survives spot preemption.

It fits a ``dim x dim`` linear map by SGD. The batch of step ``n`` comes from
``np.random.default_rng(seed * 1_000_003 + n)``, so no RNG state is saved: weights
plus step are the whole state, and the final weights are bit-identical however
often the run is interrupted and resumed (on the same numpy build and CPU; BLAS
kernels may round differently on other hardware).

Contract with spotd (environment):

``SPOTD_CHECKPOINT_URI``
    Checkpoint folder (local path or fsspec URI). Unset or empty: no checkpoints.
``SPOTD_RESUME_FROM``
    A checkpoint folder to resume from. Unset or empty: resume from the latest
    complete checkpoint under ``SPOTD_CHECKPOINT_URI`` if there is one, else start
    fresh.
``SPOTD_JOB_ID``, ``SPOTD_ATTEMPT``, ``SPOTD_NODE_RANK``, ``SPOTD_NUM_NODES``
    Only printed.

Checkpoints follow :mod:`spotd.checkpoints`: ``<uri>/step-XXXXXXXX/`` holding
``weights.npy`` and ``state.json``, then the ``_COMPLETE`` marker last. One is
written every ``--ckpt-every`` steps, at the end, and at the first step boundary
after SIGTERM (the preemption notice), after which the job exits with 143, or 0
when the last step was already done.

Output lines (stdout, flushed): ``job ...``, ``checkpoint: <uri>`` and
``resumed from step N`` or ``fresh start``, ``step N/M loss=X`` at every
checkpoint, ``interrupted at step N`` on preemption, and finally exactly one
``digest: <sha256 of the final weights' bytes>``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from types import FrameType

import numpy as np
from numpy.typing import NDArray

from spotd import checkpoints as ck
from spotd.core.errors import CheckpointError

EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a shell reports for a job killed by TERM
EXIT_ERROR = 1
LEARNING_RATE = 0.05
WEIGHTS_FILE = "weights.npy"
STATE_FILE = "state.json"

Weights = NDArray[np.float64]


@dataclass
class StopFlag:
    """Set from the SIGTERM handler; the loop reads it at step boundaries."""

    requested: bool = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """Signal handler: only record the request, so no step is left half done."""
        del signum, frame
        self.requested = True


@dataclass(frozen=True)
class Config:
    """Command-line settings."""

    steps: int
    ckpt_every: int
    step_seconds: float
    dim: int
    seed: int
    kill_before_marker: int | None


def parse_args(argv: list[str] | None = None) -> Config:
    """Parse the command line into a :class:`Config`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=200, help="total SGD steps (200)")
    parser.add_argument("--ckpt-every", type=int, default=10, help="checkpoint period (10)")
    parser.add_argument(
        "--step-seconds", type=float, default=0.0,
        help="seconds per step, to emulate GPU time (paced: a step this host delays is "
        "made up by shorter waits after it)",
    )
    parser.add_argument("--dim", type=int, default=32, help="problem size (32)")
    parser.add_argument("--seed", type=int, default=0, help="data seed, >= 0 (0)")
    parser.add_argument(
        "--kill-before-marker",
        type=int,
        default=None,
        metavar="STEP",
        help="testing only: SIGKILL itself after writing checkpoint STEP's files, "
        "before its marker, to leave a torn checkpoint behind",
    )
    ns = parser.parse_args(argv)
    if ns.steps < 0 or ns.ckpt_every < 1 or ns.dim < 1 or ns.seed < 0 or ns.step_seconds < 0:
        parser.error(
            "need --steps >= 0, --ckpt-every >= 1, --dim >= 1, --seed >= 0, --step-seconds >= 0"
        )
    return Config(
        steps=ns.steps,
        ckpt_every=ns.ckpt_every,
        step_seconds=ns.step_seconds,
        dim=ns.dim,
        seed=ns.seed,
        kill_before_marker=ns.kill_before_marker,
    )


def weights_digest(weights: Weights) -> str:
    """SHA-256 of the weights' raw bytes (C order, float64)."""
    return hashlib.sha256(np.ascontiguousarray(weights, dtype=np.float64).tobytes()).hexdigest()


def target_weights(dim: int, seed: int) -> Weights:
    """The map the model should learn; a stream separate from every step's batch."""
    rng = np.random.default_rng([seed, 0x5EED])
    return rng.standard_normal((dim, dim))


def sgd_step(weights: Weights, target: Weights, step: int, seed: int) -> float:
    """Do step ``step`` in place on ``weights``; return the batch loss before it."""
    dim = weights.shape[0]
    rng = np.random.default_rng(seed * 1_000_003 + step)
    x = rng.standard_normal((dim, dim))
    y = x @ target + 0.01 * rng.standard_normal((dim, dim))
    residual = x @ weights - y
    loss = float(np.mean(residual * residual))
    weights -= LEARNING_RATE * (x.T @ residual) / dim
    return loss


def save_checkpoint(uri: str, step: int, weights: Weights, cfg: Config) -> str:
    """Write checkpoint ``step`` under ``uri`` (files first, marker last); return its URI."""
    folder = ck.join(uri, ck.checkpoint_name(step))
    if ck.is_complete(folder):
        # Same step means same weights (the run is deterministic): nothing to add.
        return folder
    buf = io.BytesIO()
    np.save(buf, weights, allow_pickle=False)
    ck.write_bytes(ck.join(folder, WEIGHTS_FILE), buf.getvalue())
    state = {
        "step": step,
        "dim": cfg.dim,
        "seed": cfg.seed,
        "weights_sha256": weights_digest(weights),
    }
    ck.write_bytes(ck.join(folder, STATE_FILE), json.dumps(state, indent=1).encode())
    if cfg.kill_before_marker == step:
        os.kill(os.getpid(), signal.SIGKILL)
    ck.mark_complete(folder)
    return folder


def load_checkpoint(folder: str, cfg: Config) -> tuple[int, Weights]:
    """Read (step, weights) from a complete checkpoint folder, checking it fits."""
    if not ck.is_complete(folder):
        raise CheckpointError(f"{folder}: no {ck.MARKER} marker; refusing a torn checkpoint")
    try:
        state = json.loads(ck.read_bytes(ck.join(folder, STATE_FILE)))
        weights = np.load(
            io.BytesIO(ck.read_bytes(ck.join(folder, WEIGHTS_FILE))), allow_pickle=False
        )
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{folder}: unreadable checkpoint: {exc}") from exc
    if state.get("dim") != cfg.dim or state.get("seed") != cfg.seed:
        raise CheckpointError(
            f"{folder}: written with dim={state.get('dim')} seed={state.get('seed')}, "
            f"this run has dim={cfg.dim} seed={cfg.seed}"
        )
    if weights.dtype != np.float64 or weights.shape != (cfg.dim, cfg.dim):
        raise CheckpointError(f"{folder}: weights are {weights.dtype} {weights.shape}")
    if weights_digest(weights) != state.get("weights_sha256"):
        raise CheckpointError(f"{folder}: weights do not match the digest in {STATE_FILE}")
    step = state.get("step")
    if not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{folder}: bad step {step!r} in {STATE_FILE}")
    return step, np.ascontiguousarray(weights, dtype=np.float64)


def find_resume_point(ckpt_uri: str | None) -> str | None:
    """The checkpoint to resume from: SPOTD_RESUME_FROM, else our latest complete one."""
    explicit = os.environ.get("SPOTD_RESUME_FROM", "").strip()
    if explicit:
        return explicit
    if ckpt_uri:
        latest = ck.latest_complete(ckpt_uri)
        if latest is not None:
            return latest.uri
    return None


def say(line: str) -> None:
    """Print one output line and flush, so spotd sees progress before a kill."""
    print(line, flush=True)


def run(cfg: Config, stop: StopFlag) -> int:
    """Train, checkpointing as configured; return the process exit code."""
    env = os.environ
    say(
        f"job {env.get('SPOTD_JOB_ID', '-')} attempt {env.get('SPOTD_ATTEMPT', '-')} "
        f"node {env.get('SPOTD_NODE_RANK', '0')}/{env.get('SPOTD_NUM_NODES', '1')}"
    )
    ckpt_uri = env.get("SPOTD_CHECKPOINT_URI", "").strip() or None

    resume = find_resume_point(ckpt_uri)
    if resume is not None:
        step, weights = load_checkpoint(resume, cfg)
        say(f"checkpoint: {resume}")
        say(f"resumed from step {step}")
    else:
        step, weights = 0, np.zeros((cfg.dim, cfg.dim), dtype=np.float64)
        say("fresh start")
    target = target_weights(cfg.dim, cfg.seed)

    last_loss: float | None = None
    last_boundary = step

    def boundary() -> None:
        nonlocal last_boundary
        loss = "n/a" if last_loss is None else f"{last_loss:.6f}"
        say(f"step {step}/{cfg.steps} loss={loss}")
        if ckpt_uri is not None:
            save_checkpoint(ckpt_uri, step, weights, cfg)
        last_boundary = step

    # Paced against the start, not slept per step: a GPU's step takes its time whatever
    # the load of this host, and a run on a simulated clock then keeps step with it.
    paced_from, first = time.monotonic(), step
    while step < cfg.steps and not stop.requested:
        last_loss = sgd_step(weights, target, step, cfg.seed)
        if cfg.step_seconds > 0:
            due = paced_from + (step + 1 - first) * cfg.step_seconds
            time.sleep(max(0.0, due - time.monotonic()))
        step += 1
        if step % cfg.ckpt_every == 0:
            boundary()
    if step != last_boundary:
        boundary()

    if step < cfg.steps:
        say(f"interrupted at step {step}")
        return EXIT_PREEMPTED
    say(f"digest: {weights_digest(weights)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: install the SIGTERM handler first, then train."""
    stop = StopFlag()
    signal.signal(signal.SIGTERM, stop.handle)
    cfg = parse_args(argv)
    try:
        return run(cfg, stop)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
