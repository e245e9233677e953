"""The per-step decision every rank shares: stop? save? is the background save done?

One small MAX all-reduce per step answers all three, so ``should_stop`` and
``should_save`` of the same step cost one collective between them. Once the ranks
agreed to stop, no further collective is made: every rank learned it from the same
reduction (or the same emergency save call), so all of them skip it alike.
"""

from __future__ import annotations

from spotd.train.checkpointer import Checkpointer
from spotd.train.comm import Comm
from spotd.train.preemption import Preemption

__all__ = ["StepAgreement"]


class StepAgreement:
    """The stop and save decisions of one run, one reduction per step."""

    def __init__(self, comm: Comm, preemption: Preemption, checkpoints: Checkpointer) -> None:
        self._comm = comm
        self._preemption = preemption
        self._checkpoints = checkpoints
        self._decided: tuple[int, bool, bool] | None = None  # (step, stop, save)

    def decide(self, step: int) -> tuple[bool, bool]:
        """(stop, save) at ``step``: the same on every rank. Collective, once per step."""
        if self._decided is not None and self._decided[0] == step:
            return self._decided[1], self._decided[2]
        if self._preemption.agreed:
            return True, False
        local = [
            1.0 if self._preemption.seen_here() else 0.0,
            1.0 if self._checkpoints.due(step) else 0.0,
            *self._checkpoints.vote(),
        ]
        stop, due, running, failed = self._comm.max(local)
        self._checkpoints.tally(running, failed)
        if stop > 0:
            self._preemption.agree()
        stopping = self._preemption.agreed
        decision = (stopping, due > 0 and not stopping)
        self._decided = (step, *decision)
        return decision
