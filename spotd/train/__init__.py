"""Training-side library: a job's half of the spotd contract.

spotd starts a training job with a few environment variables (all optional) and
expects three things back: checkpoints it can resume from, a quick and orderly stop
when the node is being preempted, and a progress file. :class:`Run` does all three
for a PyTorch job, on any number of ranks, with ``torch.distributed.checkpoint``
(DCP)::

    import torch.distributed as dist
    from spotd.train import ModelState, Run

    dist.init_process_group("gloo")          # or nccl; skip it for a local run
    run = Run.from_env(every_steps=100)
    state = {"app": ModelState(ddp_model, optimizer)}
    step = run.restore(state)
    while step < total:
        ...one training step...
        step += 1
        run.report(step, total_steps=total)
        if run.should_stop(step):
            run.save(step, state, emergency=True)
            run.close()
            raise SystemExit(143)
        if run.should_save(step):
            run.save(step, state)
    run.save(step, state)
    run.close()

The environment it reads (:meth:`Run.from_env`):

``SPOTD_CHECKPOINT_URI``
    Folder (path or fsspec URI) of ``step-XXXXXXXX/`` checkpoints, each complete once
    its ``_COMPLETE`` marker exists (:mod:`spotd.checkpoints`). Unset: no saving.
``SPOTD_RESUME_FROM``
    A complete checkpoint folder to resume from. Unset or empty: the latest complete
    one under ``SPOTD_CHECKPOINT_URI``, else a fresh start. Never a torn folder.
``SPOTD_CHECKPOINT_INTERVAL_SECONDS``
    How often a regular save is due.
``SPOTD_NOTICE_FILE``
    The agent's preemption notice (JSON with the kill ``deadline``), written before
    it sends SIGTERM; its presence alone is a stop request.
``SPOTD_PROGRESS_FILE``
    Where global rank 0 reports step, total and last complete checkpoint; beside it,
    every rank keeps its own step and pid (``progress-rank-<rank>.json``), which the
    daemon's hang watch reads (:mod:`spotd.train.ranks`).

The rules (collective decisions, marker after every rank's shards, skipping an
emergency save that cannot finish before the deadline) are in :mod:`spotd.train.run`.

This package imports without torch (torch is imported where it is used), so
:func:`read_notice`, :func:`write_progress` and even a torch-free :class:`Run`
(stop flag and progress only) work in any Python job.
"""

from __future__ import annotations

from spotd.train.budget import SaveBudget
from spotd.train.dcp import ModelState
from spotd.train.progress import write_progress
from spotd.train.run import Run, WriterFactory
from spotd.train.signals import Notice, SignalFlag, read_notice

__all__ = [
    "ModelState",
    "Notice",
    "Run",
    "SaveBudget",
    "SignalFlag",
    "WriterFactory",
    "read_notice",
    "write_progress",
]
