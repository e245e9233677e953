#!/usr/bin/env python3
"""A small DDP training job on gloo that survives spot preemption through spotd.train.

A 2-layer MLP fits a fixed random teacher on synthetic data. The batch of step
``n`` on rank ``r`` is drawn from a generator seeded with ``(seed, n, r)``, so no
RNG state is saved: model and optimizer (Adam) are the whole state, kept in a
``torch.distributed.checkpoint`` checkpoint by :class:`spotd.train.Run`. With the
same world size, the final parameters are bit-identical however often the run is
interrupted and resumed; with another world size the run resumes (DCP reshards)
but the data per step differs, so the result does too.

Run it on two nodes of two processes (this is what spotd's job command would be)::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 \\
        --master-addr HOST --master-port 29500 examples/train_ddp.py --steps 60

torchrun also reads ``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and
``PET_MASTER_PORT`` from the environment. Without torchrun (``python
examples/train_ddp.py``) it trains in one process, without a process group.

Environment from spotd (all optional; see :mod:`spotd.train`):
``SPOTD_CHECKPOINT_URI``, ``SPOTD_RESUME_FROM``,
``SPOTD_CHECKPOINT_INTERVAL_SECONDS``, ``SPOTD_NOTICE_FILE``,
``SPOTD_PROGRESS_FILE``. Without any, it trains uninterrupted and prints the
digest: the reference run.

Checkpoints: every ``--ckpt-every`` steps; without that option, every
``SPOTD_CHECKPOINT_INTERVAL_SECONDS`` when set, else every 10 steps; and at the end.
On SIGTERM (or a notice file) every rank stops at the same step, saves an emergency
checkpoint if it fits before the notice's deadline, and exits with 143.

Output on rank 0 (stdout, flushed): ``resumed from step N`` or ``fresh start``,
``step N/M loss=X`` at every checkpoint, ``interrupted at step N`` on preemption,
and at the very end exactly one ``digest: <sha256 of the final parameters>``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from spotd.train import ModelState, Run

EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a shell reports for a job killed by TERM
DEFAULT_CKPT_EVERY = 10
IN_DIM = 16
HIDDEN = 32
BATCH = 32
LEARNING_RATE = 1e-2


@dataclass(frozen=True)
class Config:
    """Command-line settings."""

    steps: int
    ckpt_every: int | None
    step_seconds: float
    seed: int


def parse_args(argv: list[str] | None = None) -> Config:
    """Parse the command line into a :class:`Config`."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=60, help="total steps (60)")
    parser.add_argument(
        "--ckpt-every",
        type=int,
        default=None,
        help="checkpoint period in steps (default: SPOTD_CHECKPOINT_INTERVAL_SECONDS "
        f"when set, else {DEFAULT_CKPT_EVERY})",
    )
    parser.add_argument(
        "--step-seconds", type=float, default=0.0, help="sleep per step, standing in for GPU time"
    )
    parser.add_argument("--seed", type=int, default=0, help="data and init seed, >= 0 (0)")
    ns = parser.parse_args(argv)
    if ns.steps < 0 or ns.seed < 0 or ns.step_seconds < 0 or (ns.ckpt_every or 1) < 1:
        parser.error("need --steps >= 0, --seed >= 0, --step-seconds >= 0, --ckpt-every >= 1")
    return Config(ns.steps, ns.ckpt_every, ns.step_seconds, ns.seed)


def say(line: str) -> None:
    """Print one output line on global rank 0 and flush, so it is seen before a kill."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(line, flush=True)


def build_model(seed: int) -> nn.Module:
    """The MLP, identically initialized on every rank (DDP also broadcasts rank 0's)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def teacher(seed: int) -> torch.Tensor:
    """The fixed map the model learns, from a stream separate from every batch."""
    gen = torch.Generator().manual_seed(seed * 7919 + 17)
    return torch.randn(IN_DIM, 1, generator=gen)


def batch(seed: int, step: int, rank: int, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Step ``step``'s batch on ``rank``: a function of its arguments only."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1009 + rank)
    x = torch.randn(BATCH, IN_DIM, generator=gen)
    y = torch.tanh(x @ target) + 0.01 * torch.randn(BATCH, 1, generator=gen)
    return x, y


def digest(model: nn.Module) -> str:
    """SHA-256 of the parameters' raw bytes, in ``named_parameters`` order."""
    h = hashlib.sha256()
    for _, param in model.named_parameters():
        h.update(param.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def settle_buckets(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Run DDP's first iteration on a zero loss, so every real step is reduced alike.

    DDP reduces its first iteration with one bucket in parameter order, then
    rebuilds its buckets in the order gradients became ready. With 3 or more ranks
    the layout decides in which order gloo sums each element, so a run resumed in a
    fresh process (first iteration again) would round differently from the
    uninterrupted run at the same step. A zero loss leaves the gradients zero and
    the optimizer untouched, and it is done on every start, fresh or resumed.
    """
    if not isinstance(model, DistributedDataParallel):
        return
    out = model(torch.zeros(1, IN_DIM))
    torch.autograd.backward(out.sum() * 0.0)
    optimizer.zero_grad(set_to_none=True)


def ckpt_every(cfg: Config) -> int | None:
    """Steps between checkpoints; None leaves it to SPOTD_CHECKPOINT_INTERVAL_SECONDS."""
    if cfg.ckpt_every is not None:
        return cfg.ckpt_every
    if os.environ.get("SPOTD_CHECKPOINT_INTERVAL_SECONDS", "").strip():
        return None
    return DEFAULT_CKPT_EVERY


def setup() -> int:
    """Join the process group when started by torchrun; return the global rank."""
    torch.set_num_threads(1)  # bitwise reproducible, and no oversubscription
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("gloo")
        return dist.get_rank()
    return 0


def train(cfg: Config, rank: int) -> int:
    """Train with checkpoints and preemption handling; return the exit code."""
    module = build_model(cfg.seed)
    model: nn.Module = DistributedDataParallel(module) if dist.is_initialized() else module
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    state = {"app": ModelState(model, optimizer)}
    target = teacher(cfg.seed)
    with Run.from_env(every_steps=ckpt_every(cfg)) as run:
        step = run.restore(state)
        say(f"resumed from step {step}" if run.resumed_from else "fresh start")
        loss = float("nan")
        shown = step  # last step whose "step N/M" line was printed
        settle_buckets(model, optimizer)
        while step < cfg.steps:
            x, y = batch(cfg.seed, step, rank, target)
            optimizer.zero_grad(set_to_none=True)
            out = nn.functional.mse_loss(model(x), y)
            torch.autograd.backward(out)
            optimizer.step()
            loss = float(out.detach())
            if cfg.step_seconds > 0:
                time.sleep(cfg.step_seconds)
            step += 1
            run.report(step, total_steps=cfg.steps)
            if run.should_stop(step):
                run.save(step, state, emergency=True)
                run.close()
                say(f"interrupted at step {step}")
                return EXIT_PREEMPTED
            if run.should_save(step):
                say(f"step {step}/{cfg.steps} loss={loss:.6f}")
                shown = step
                run.save(step, state)
        if step != shown:
            say(f"step {step}/{cfg.steps} loss={loss:.6f}")
        run.save(step, state)  # the final checkpoint; a no-op for a step already saved
    say(f"digest: {digest(module)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    cfg = parse_args(argv)
    rank = setup()
    try:
        return train(cfg, rank)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
