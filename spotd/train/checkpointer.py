"""Saving a run's checkpoints with DCP, and agreeing with every rank when one is complete.

Each save goes into ``<uri>/step-XXXXXXXX/``, a folder rank 0 clears first. A regular
save runs in the background where torch has ``async_save`` (on the gloo checkpoint
group) and synchronously otherwise; an emergency save is always synchronous. At most
one save is in flight: the next save, :meth:`Checkpointer.wait` or a per-step
agreement that finds every rank's write done finishes it. Rank 0 writes the
``_COMPLETE`` marker only once every rank's write ended without error; a failed save
leaves a torn folder, logged, and training goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spotd import checkpoints as ck
from spotd.core.contracts import Clock
from spotd.core.errors import CheckpointError
from spotd.train import dcp
from spotd.train.budget import SaveBudget
from spotd.train.comm import Comm
from spotd.train.log import RankLog
from spotd.train.progress import ProgressReporter
from spotd.train.schedule import SaveSchedule

if TYPE_CHECKING:
    from torch.distributed.checkpoint.storage import StorageWriter

__all__ = ["Checkpointer"]

_BIG = 1e18  # stands for "no deadline" in a MAX reduction of negated seconds left


@dataclass
class _Pending:
    """A save every rank started at the same step, not yet agreed to be finished."""

    step: int
    folder: str
    future: Future[Any]
    clock: Clock
    started: float
    finished: float | None = None

    def on_done(self, _future: Future[Any]) -> None:
        # Runs on the writer thread: only take the time, the rest is the loop's job.
        self.finished = self.clock.monotonic()

    def done(self) -> bool:
        return self.future.done()

    def error(self) -> BaseException | None:
        """This rank's failure, once done; None if it succeeded (or is running)."""
        return self.future.exception() if self.future.done() else None

    def wait(self) -> BaseException | None:
        """Block until this rank's write is done; return its failure, if any."""
        try:
            self.future.result()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            return exc  # reported and agreed on with the other ranks, never swallowed
        return None

    def duration(self) -> float:
        return (self.finished or self.clock.monotonic()) - self.started


class Checkpointer:
    """The checkpoints one rank writes under ``uri``, and the last complete one.

    Every method that saves or waits is collective. ``time_left`` tells how long
    this node has (None: unknown), for deciding whether an emergency save fits.
    """

    def __init__(
        self,
        uri: str | None,
        *,
        comm: Comm,
        schedule: SaveSchedule,
        budget: SaveBudget,
        progress: ProgressReporter,
        say: RankLog,
        time_left: Callable[[], float | None],
        clock: Clock,
        writer_factory: dcp.WriterFactory,
        async_save: bool,
    ) -> None:
        self.uri = uri
        self.schedule = schedule
        self.budget = budget
        self._comm = comm
        self._progress = progress
        self._say = say
        self._time_left = time_left
        self._clock = clock
        self._writer_factory = writer_factory
        self._async_wanted = async_save
        self._async: bool | None = None  # decided at the first save, when torch is needed
        self._pending: _Pending | None = None
        self._saved_step = 0  # last step every rank agreed was saved (or resumed from)
        # Whether _saved_step means anything yet: the same on every rank, unlike
        # last_checkpoint, which rank 0 keeps back when it could not write the marker.
        self._saved_any = False
        self.last_checkpoint: str | None = None
        """URI of the last complete checkpoint: written by this run, or resumed from."""

    def due(self, step: int) -> bool:
        """This rank's view of whether a regular save is due at ``step``."""
        return self.uri is not None and self.schedule.due(step)

    def vote(self) -> list[float]:
        """This rank's part of the per-step MAX reduction: [save running, save failed]."""
        pending = self._pending
        return [
            1.0 if pending is not None and not pending.done() else 0.0,
            1.0 if pending is not None and pending.error() is not None else 0.0,
        ]

    def tally(self, running: float, failed: float) -> None:
        """Act on the reduced :meth:`vote`: with no rank still writing, finish the save."""
        if self._pending is not None and running == 0:
            # Every rank's write is done: the reduction was the barrier.
            self._finish(self._pending, failed=failed > 0)

    def resumed(self, step: int, folder: str | None) -> None:
        """The run restarts at ``step`` from ``folder`` (None: a fresh start)."""
        self._saved_step = step
        self._saved_any = folder is not None  # rank 0 broadcast it: the same everywhere
        self.schedule.restart(step)
        self.last_checkpoint = folder

    def save(self, step: int, state: Mapping[str, Any]) -> str | None:
        """A regular save of ``step`` (see :meth:`spotd.train.Run.save`)."""
        self.wait()  # one save in flight at a time: back-pressure, and order
        if self._saved(step):
            return self.last_checkpoint
        return self._write(step, state, wait=not self._use_async())

    def save_before_stop(self, step: int, state: Mapping[str, Any]) -> str | None:
        """The emergency save of ``step``: synchronous, skipped when it cannot fit."""
        self.wait()
        if self._saved(step):
            self._say(f"step {step} is already checkpointed at {self.last_checkpoint}")
            return self.last_checkpoint
        if not self._fits(step):
            return None
        return self._write(step, state, wait=True)

    def wait(self) -> None:
        """Wait for the pending save on this rank, agree with all ranks, finish it."""
        pending = self._pending
        if pending is None:
            return
        error = pending.wait()
        (failed,) = self._comm.max([1.0 if error is not None else 0.0])
        self._finish(pending, failed=failed > 0)

    def _saved(self, step: int) -> bool:
        return step == self._saved_step and self._saved_any

    def _fits(self, step: int) -> bool:
        """Agree whether a save fits before the earliest kill; log the decision."""
        left = self._time_left()
        estimate = self.budget.estimate()
        neg_left, est = self._comm.max(
            [-(left if left is not None else _BIG), estimate if estimate is not None else -1.0]
        )
        min_left = None if -neg_left >= _BIG / 2 else -neg_left
        max_estimate = None if est < 0 else est
        need = "unknown" if max_estimate is None else f"~{max_estimate:.1f}s"
        if SaveBudget.fits(max_estimate, min_left):
            have = "no deadline known" if min_left is None else f"{min_left:.1f}s left"
            self._say(f"emergency checkpoint at step {step} (needs {need}, {have})")
            return True
        resume = self.last_checkpoint or "nothing (fresh start)"
        self._say(
            f"skipping the emergency checkpoint at step {step}: it needs {need} but only "
            f"{min_left:.1f}s are left before the node is killed; a restart resumes from "
            f"{resume}"
        )
        return False

    def _use_async(self) -> bool:
        if self._async is None:
            ok = self._async_wanted and dcp.async_supported()
            if ok and self._comm.distributed and self._comm.ckpt_group is None:
                ok = False  # async_save needs a CPU (gloo) group for its background thread
            if self._async_wanted and not ok:
                self._say("asynchronous checkpoints unavailable here; saving synchronously")
            self._async = ok
        return self._async

    def _write(self, step: int, state: Mapping[str, Any], *, wait: bool) -> str | None:
        """Start (or, with ``wait``, do and finish) the save of ``step``; every rank."""
        assert self.uri is not None
        folder = ck.join(self.uri, ck.checkpoint_name(step))
        self._prepare_folder(folder)
        payload: dict[str, Any] = {**state, dcp.STATE_KEY: {"step": step}}
        writer = self._writer_factory(folder)
        started = self.schedule.started(step)
        future = self._launch(payload, writer, background=not wait)
        pending = _Pending(step=step, folder=folder, future=future, clock=self._clock,
                           started=started)  # fmt: skip
        future.add_done_callback(pending.on_done)
        self._pending = pending
        if wait:
            self.wait()
            return folder if self.last_checkpoint == folder else None
        return folder

    def _launch(
        self, payload: dict[str, Any], writer: StorageWriter, *, background: bool
    ) -> Future[Any]:
        """Run DCP's save; failures end up in the returned future, not raised here."""
        group = self._comm.ckpt_group
        try:
            if background:
                return dcp.start_async_save(payload, writer, group)
            dcp.save(payload, writer, group)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's CheckpointException; agreed on in wait()
            failed: Future[Any] = Future()
            failed.set_exception(exc)
            return failed
        done: Future[Any] = Future()
        done.set_result(None)
        return done

    def _prepare_folder(self, folder: str) -> None:
        """Rank 0 clears what an earlier attempt left in ``folder``; all wait for it.

        A torn folder may hold shards of another world size, and a complete one must
        lose its marker before any of its files change.
        """
        if self._comm.is_main:
            try:
                dcp.remove_folder(folder)
            except OSError as exc:
                self._say(f"could not clear {folder} before writing it: {exc}")
        self._comm.barrier()

    def _finish(self, pending: _Pending, *, failed: bool) -> None:
        """Every rank's write of ``pending`` is done: rank 0 marks it, or all log it torn."""
        self._pending = None
        error = pending.error()
        if error is not None:
            rank = self._comm.rank
            self._say(f"rank {rank}: writing step {pending.step} failed: {error!r}", True)
        if failed:
            self._say(
                f"checkpoint at step {pending.step} failed; {pending.folder} stays without "
                f"{ck.MARKER} and will never be resumed from"
            )
            return
        self.budget.record(pending.duration())
        self._saved_step = pending.step
        self._saved_any = True
        if self._comm.is_main:
            try:
                ck.mark_complete(pending.folder)
            except CheckpointError as exc:
                self._say(f"could not mark {pending.folder} complete: {exc}")
                return
        self.last_checkpoint = pending.folder
        self._progress.checkpointed(pending.step, pending.folder)
