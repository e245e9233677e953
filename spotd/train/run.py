"""One object a training loop asks where to resume, when to save and when to stop.

Use it on every rank, after ``torch.distributed.init_process_group`` (or without
one, for a plain local run)::

    run = Run.from_env()
    state = {"app": ModelState(model, optimizer)}
    step = run.restore(state)            # 0 on a fresh start
    while step < total:
        train_one_step(step)
        step += 1
        run.report(step, total_steps=total)
        if run.should_stop(step):        # agreed by every rank
            run.save(step, state, emergency=True)
            run.close()
            sys.exit(143)
        if run.should_save(step):        # agreed by every rank
            run.save(step, state)        # asynchronous where torch allows
    run.save(step, state)
    run.close()

``should_stop``, ``should_save``, ``save``, ``restore`` and ``close`` are
*collective*: every rank must call them at the same steps (the loop above does).
They cost one small all-reduce per step between them, shared by both ``should_*``
calls of the same step.

Rules it keeps
--------------
* **Resume.** ``SPOTD_RESUME_FROM`` when set; otherwise the latest complete
  checkpoint under ``SPOTD_CHECKPOINT_URI``, if any (``resume_latest=False`` turns
  that off); otherwise a fresh start. A folder without ``_COMPLETE`` is never
  loaded: an explicit one raises :class:`~spotd.core.errors.CheckpointError`, and the
  latest-complete search skips torn folders. DCP loads into the current world's
  state dict, so a checkpoint from a different world size is resharded.
* **Save.** Into ``<uri>/step-XXXXXXXX/`` with DCP. Regular saves use
  ``torch.distributed.checkpoint.async_save`` on a dedicated gloo group: the state
  is copied to CPU memory, the call returns, and the files are written on a
  background thread. Without ``async_save`` (older torch), with ``async_save=False``
  or without gloo, saves are synchronous. Global rank 0 writes the ``_COMPLETE``
  marker only after every rank's write finished without error: each rank checks its
  own future, one all-reduce tells every rank that all are done and all succeeded
  (the barrier), and only then rank 0 marks. A failed save leaves a torn folder,
  logged, and training goes on.
* **Stop.** A SIGTERM handler (main thread only; the previous handler is chained and
  restored by :meth:`Run.close`) and the notice file ``SPOTD_NOTICE_FILE`` set a
  local flag; ``should_stop`` all-reduces it (MAX), so every rank stops at the same
  step even when one rank alone got the signal.
* **Deadline.** An emergency save first finishes a pending one, then compares the
  time left before the kill (the notice's deadline, the smallest over all ranks)
  with the estimated save time (the longest recent save, or
  ``first_save_seconds``, times ``save_factor`` plus ``save_margin_seconds``, the
  largest over all ranks). If it cannot fit it is skipped on every rank and rank 0
  logs one line saying so. With no deadline known it is always attempted.
* **Progress.** Global rank 0 writes ``SPOTD_PROGRESS_FILE`` (step, total steps,
  last complete checkpoint, time) atomically at restore, after every completed
  checkpoint, at most every ``progress_every_seconds`` from :meth:`Run.report`, and
  at close. Every rank also keeps its own ``progress-rank-<rank>.json`` beside it
  (step and pid, :mod:`spotd.train.ranks`), at most every
  ``rank_file_every_seconds``, for the daemon's hang watch.

Library messages go, one line each, prefixed ``spotd.train:``, to stderr from rank
0 (or to the ``log`` callable given).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.train import dcp
from spotd.train.agreement import StepAgreement
from spotd.train.budget import SaveBudget
from spotd.train.checkpointer import Checkpointer
from spotd.train.comm import Comm
from spotd.train.dcp import WriterFactory
from spotd.train.log import RankLog
from spotd.train.preemption import Preemption
from spotd.train.progress import ProgressReporter
from spotd.train.ranks import RankFile, rank_file_beside
from spotd.train.resume import ResumeSource, load_checkpoint
from spotd.train.schedule import SaveSchedule

__all__ = ["Run", "WriterFactory"]


def _env_str(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def _env_float(env: Mapping[str, str], name: str) -> float | None:
    value = _env_str(env, name)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError as exc:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from exc
    return number if number > 0 else None


class Run:
    """Resume, checkpoint, stop and report for one training process (see the module doc).

    Create it on every rank at the same point, after ``init_process_group``: the
    constructor sets up a gloo group for checkpoint traffic, itself a collective.
    It installs the SIGTERM handler (main thread only) unless ``handle_signals`` is
    False. The key ``"_spotd"`` of the saved state is reserved (it holds the step).

    Every argument is optional; :meth:`from_env` fills them from the ``SPOTD_*``
    environment. ``every_steps`` and ``interval_seconds`` may both be set: a save is
    due when either says so. ``first_save_seconds`` is the save-time estimate used
    before a save has been measured. ``writer_factory`` replaces DCP's default
    storage writer (local: ``FileSystemWriter``; other URIs: fsspec). ``clock`` times
    the saves and the progress file and reads the notice's time left.

    The work is shared by a few parts: :class:`~spotd.train.preemption.Preemption`
    (signal and notice), :class:`~spotd.train.checkpointer.Checkpointer` (saves and
    markers), :class:`~spotd.train.agreement.StepAgreement` (the per-step
    collective), :class:`~spotd.train.progress.ProgressReporter` (the progress file)
    and :mod:`spotd.train.resume`.
    """

    def __init__(
        self,
        *,
        checkpoint_uri: str | None = None,
        resume_from: str | None = None,
        resume_latest: bool = True,
        interval_seconds: float | None = None,
        every_steps: int | None = None,
        notice_file: str | os.PathLike[str] | None = None,
        progress_file: str | os.PathLike[str] | None = None,
        first_save_seconds: float | None = None,
        save_factor: float = 1.5,
        save_margin_seconds: float = 2.0,
        progress_every_seconds: float = 5.0,
        rank_file_every_seconds: float = 1.0,
        async_save: bool = True,
        handle_signals: bool = True,
        writer_factory: WriterFactory | None = None,
        log: Callable[[str], None] | None = None,
        clock: Clock = WALL,
    ) -> None:
        schedule = SaveSchedule(every_steps, interval_seconds, clock)  # checks every_steps
        self.budget = SaveBudget(first_save_seconds, save_factor, save_margin_seconds)
        self._resume = ResumeSource(resume_from or None, resume_latest, checkpoint_uri or None)
        self._comm = Comm()
        self._say = RankLog(log, is_main=self._comm.is_main)
        self._preemption = Preemption(notice_file, clock, handle_signals=handle_signals)
        # Only global rank 0 writes the progress file; the others keep count.
        report_to = progress_file if self._comm.is_main else None
        self._progress = ProgressReporter(report_to, progress_every_seconds, clock, self._say)
        # Every rank keeps its own step: the daemon finds a hung gang's suspects by them.
        self._rank_file = RankFile(rank_file_beside(progress_file, self._comm.rank),
                                   self._comm.rank, rank_file_every_seconds, clock, self._say)
        self._checkpoints = Checkpointer(
            checkpoint_uri or None,
            comm=self._comm,
            schedule=schedule,
            budget=self.budget,
            progress=self._progress,
            say=self._say,
            time_left=self._preemption.time_left,
            clock=clock,
            writer_factory=writer_factory or dcp.make_writer,
            async_save=async_save,
        )
        self._agreement = StepAgreement(self._comm, self._preemption, self._checkpoints)
        self.resumed_from: str | None = None
        """URI of the checkpoint :meth:`restore` loaded, or None after a fresh start."""
        self._closed = False

    # ------------------------------------------------------------------ setup

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **options: Any) -> Self:
        """A Run configured from the ``SPOTD_*`` variables (``os.environ`` by default).

        Reads ``SPOTD_CHECKPOINT_URI``, ``SPOTD_RESUME_FROM``,
        ``SPOTD_CHECKPOINT_INTERVAL_SECONDS``, ``SPOTD_NOTICE_FILE`` and
        ``SPOTD_PROGRESS_FILE``; each unset or empty one leaves its feature off.
        Keyword ``options`` are passed to the constructor and win over the
        environment (e.g. ``every_steps=50``).
        """
        source = os.environ if env is None else env
        settings: dict[str, Any] = {
            "checkpoint_uri": _env_str(source, "SPOTD_CHECKPOINT_URI"),
            "resume_from": _env_str(source, "SPOTD_RESUME_FROM"),
            "interval_seconds": _env_float(source, "SPOTD_CHECKPOINT_INTERVAL_SECONDS"),
            "notice_file": _env_str(source, "SPOTD_NOTICE_FILE"),
            "progress_file": _env_str(source, "SPOTD_PROGRESS_FILE"),
        }
        settings.update(options)
        return cls(**settings)

    @property
    def rank(self) -> int:
        """Global rank (0 without a process group)."""
        return self._comm.rank

    @property
    def world_size(self) -> int:
        """Number of ranks (1 without a process group)."""
        return self._comm.world_size

    @property
    def is_main(self) -> bool:
        """Whether this is global rank 0."""
        return self._comm.is_main

    @property
    def checkpoint_uri(self) -> str | None:
        """Folder of this run's checkpoints; None: no saving."""
        return self._checkpoints.uri

    @property
    def every_steps(self) -> int | None:
        """A regular save is due at every multiple of this step (None: not by steps)."""
        return self._checkpoints.schedule.every_steps

    @property
    def interval_seconds(self) -> float | None:
        """A regular save is due this long after the last one started (None: not by time)."""
        return self._checkpoints.schedule.interval_seconds

    @property
    def last_checkpoint(self) -> str | None:
        """URI of the last complete checkpoint: written by this run, or resumed from."""
        return self._checkpoints.last_checkpoint

    @property
    def signal_received(self) -> signal.Signals | None:
        """The signal this rank itself got (SIGTERM), if any; no collective."""
        return self._preemption.signal_received

    @property
    def stop_requested(self) -> bool:
        """This rank's own view (no collective): a signal or a notice file was seen."""
        return self._preemption.requested

    def time_left(self) -> float | None:
        """Seconds until this node's kill per the notice file; None when unknown."""
        return self._preemption.time_left()

    # ----------------------------------------------------------------- resume

    def restore(self, state: Mapping[str, Any]) -> int:
        """Load the resume checkpoint into ``state`` in place; return its step (0 if fresh).

        ``state`` maps names to DCP-savable values: ``Stateful`` objects such as
        :class:`~spotd.train.ModelState`, tensors, or nested dicts of them; the same
        mapping must be passed to :meth:`save`. Collective.
        """
        folder = self._resume.agreed_folder(self._comm)
        if folder is None:
            self._say("no checkpoint to resume from: fresh start")
            step = 0
        else:
            step = load_checkpoint(folder, state, self._comm)
            self._say(f"resumed from {folder} at step {step} (world size {self.world_size})")
        self._checkpoints.resumed(step, folder)
        self.resumed_from = folder
        self._progress.resumed(step, folder)
        self._rank_file.report(step)
        return step

    # ------------------------------------------------------------- decisions

    def should_stop(self, step: int) -> bool:
        """Whether any rank learned of a preemption; the same answer on every rank.

        Collective. Once True it stays True (without further collectives).
        """
        return self._agreement.decide(step)[0]

    def should_save(self, step: int) -> bool:
        """Whether a regular checkpoint is due at ``step``; the same answer on every rank.

        Due when ``step`` is a multiple of ``every_steps`` or ``interval_seconds``
        have passed since the last save started (on any rank), and ``step`` was not
        saved yet. Always False without a checkpoint URI. Collective.
        """
        return self._agreement.decide(step)[1]

    # ------------------------------------------------------------------- save

    def save(self, step: int, state: Mapping[str, Any], *, emergency: bool = False) -> str | None:
        """Checkpoint ``state`` at ``step`` into ``<uri>/step-XXXXXXXX/``. Collective.

        A regular save returns the folder as soon as the state is staged (async) or
        written (sync); it becomes complete, and :attr:`last_checkpoint`, once every
        rank's write is agreed finished at a later ``should_*`` call, :meth:`wait`
        or :meth:`close`. An emergency save (after ``should_stop``) finishes any
        pending save, then writes synchronously and returns the completed folder,
        or None when it was skipped (no time left, see the module doc) or failed.
        A step already saved is not written again. Without a checkpoint URI it
        does nothing and returns None.
        """
        if self.checkpoint_uri is None:
            if emergency:
                self._say("no SPOTD_CHECKPOINT_URI: nothing to save before stopping")
            return None
        if emergency:
            self._preemption.agree()
            return self._checkpoints.save_before_stop(step, state)
        return self._checkpoints.save(step, state)

    def wait(self) -> str | None:
        """Block until a pending save is complete everywhere (marked); return the latest
        complete checkpoint. Collective."""
        self._checkpoints.wait()
        return self.last_checkpoint

    # --------------------------------------------------------------- progress

    def report(self, step: int, total_steps: int | None = None, *, force: bool = False) -> None:
        """Tell the agent how far training got (rank 0 writes; other ranks only remember).

        Cheap to call every step: the file is rewritten at most every
        ``progress_every_seconds``, unless ``force`` or a new checkpoint completed.
        Every rank also notes the step in its own file (:mod:`spotd.train.ranks`).
        Not collective.
        """
        self._progress.report(step, total_steps, force=force)
        self._rank_file.report(step)

    # ------------------------------------------------------------------ close

    def close(self, *, wait: bool = True) -> None:
        """Finish the pending save (collective unless ``wait=False``), write the progress
        file a last time and restore the previous signal handler. Idempotent.

        Call it before ``torch.distributed.destroy_process_group()``. ``wait=False``
        (used when leaving on an exception) abandons a pending save unmarked, since
        the other ranks may not be there to agree.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if wait:
                self._checkpoints.wait()
                # Only once no save is in flight: one left running (wait=False) still
                # needs the group, and the process is on its way out anyway.
                self._comm.close()
            self._progress.flush()
        finally:
            self._rank_file.close()
            self._preemption.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(wait=exc_type is None)
