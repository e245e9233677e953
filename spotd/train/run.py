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
  at close.

Library messages go, one line each, prefixed ``spotd.train:``, to stderr from rank
0 (or to the ``log`` callable given).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from spotd import checkpoints as ck
from spotd.core.errors import CheckpointError
from spotd.train import dcp
from spotd.train.budget import SaveBudget
from spotd.train.comm import Comm
from spotd.train.progress import write_progress
from spotd.train.signals import Notice, SignalFlag, read_notice

if TYPE_CHECKING:
    from torch.distributed.checkpoint.storage import StorageWriter

__all__ = ["Run", "WriterFactory"]

WriterFactory = Callable[[str], "StorageWriter"]
"""Builds the DCP storage writer for one checkpoint folder URI."""

STATE_KEY = "_spotd"
"""Key under which the checkpoint keeps spotd's own state (the step)."""

_BIG = 1e18  # stands for "no deadline" in a MAX reduction of negated seconds left


@dataclass
class _Pending:
    """A save every rank started at the same step, not yet agreed to be finished."""

    step: int
    folder: str
    future: Future[Any]
    started: float
    finished: float | None = None

    def on_done(self, _future: Future[Any]) -> None:
        # Runs on the writer thread: only take the time, the rest is the loop's job.
        self.finished = time.monotonic()

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
        return (self.finished or time.monotonic()) - self.started


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


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
    storage writer (local: ``FileSystemWriter``; other URIs: fsspec).
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
        async_save: bool = True,
        handle_signals: bool = True,
        writer_factory: WriterFactory | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if every_steps is not None and every_steps < 1:
            raise ValueError(f"every_steps must be >= 1, got {every_steps}")
        self.checkpoint_uri = checkpoint_uri or None
        self._resume_from = resume_from or None
        self._resume_latest = resume_latest
        self.interval_seconds = interval_seconds
        self.every_steps = every_steps
        self._notice_file = notice_file
        self._progress_file = progress_file
        self.budget = SaveBudget(first_save_seconds, save_factor, save_margin_seconds)
        self._progress_every = progress_every_seconds
        self._async_wanted = async_save
        self._async: bool | None = None  # decided at the first save, when torch is needed
        self._writer_factory: WriterFactory = writer_factory or dcp.make_writer
        self._log = log or _stderr
        self._comm = Comm()
        self._signals = SignalFlag()
        if handle_signals:
            self._signals.install()

        self._pending: _Pending | None = None
        self._decided: tuple[int, bool, bool] | None = None  # (step, stop, save)
        self._stopping = False
        self._notice: Notice | None = None
        self._saved_step = 0  # last step every rank agreed was saved (or resumed from)
        # Whether _saved_step means anything yet: the same on every rank, unlike
        # last_checkpoint, which rank 0 keeps back when it could not write the marker.
        self._saved_any = False
        self._attempted_step = 0
        self._last_save_started = time.monotonic()
        self.last_checkpoint: str | None = None
        """URI of the last complete checkpoint: written by this run, or resumed from."""
        self.resumed_from: str | None = None
        """URI of the checkpoint :meth:`restore` loaded, or None after a fresh start."""
        self._step = 0
        self._total_steps: int | None = None
        self._progress_written_at: float | None = None
        self._progress_checkpoint: str | None = None
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
    def signal_received(self) -> signal.Signals | None:
        """The signal this rank itself got (SIGTERM), if any; no collective."""
        return self._signals.received

    @property
    def stop_requested(self) -> bool:
        """This rank's own view (no collective): a signal or a notice file was seen."""
        return self._stopping or self._local_stop()

    def time_left(self) -> float | None:
        """Seconds until this node's kill per the notice file; None when unknown."""
        notice = read_notice(self._notice_file)
        return None if notice is None else notice.seconds_left()

    # ----------------------------------------------------------------- resume

    def restore(self, state: Mapping[str, Any]) -> int:
        """Load the resume checkpoint into ``state`` in place; return its step (0 if fresh).

        ``state`` maps names to DCP-savable values: ``Stateful`` objects such as
        :class:`~spotd.train.ModelState`, tensors, or nested dicts of them; the same
        mapping must be passed to :meth:`save`. Collective.
        """
        folder = self._agreed_resume_folder()
        if folder is None:
            self._say("no checkpoint to resume from: fresh start")
            self._after_restore(0, None)
            return 0
        payload: dict[str, Any] = {**state, STATE_KEY: {"step": -1}}
        dcp.load(payload, dcp.make_reader(folder), self._comm.ckpt_group)
        step = int(payload[STATE_KEY]["step"])
        if step < 0:
            raise CheckpointError(f"{folder}: no step recorded under {STATE_KEY!r}")
        self._say(f"resumed from {folder} at step {step} (world size {self.world_size})")
        self._after_restore(step, folder)
        return step

    def _agreed_resume_folder(self) -> str | None:
        """Rank 0 picks the folder and every rank gets its choice (or its error)."""
        choice: str | None = None
        if self.is_main:
            try:
                folder = self._resume_folder()
                choice = "none:" if folder is None else f"ok:{folder}"
            except CheckpointError as exc:
                choice = f"error:{exc}"
        agreed = self._comm.broadcast(choice) or "none:"
        kind, _, value = agreed.partition(":")
        if kind == "error":
            raise CheckpointError(value)
        return value if kind == "ok" else None

    def _resume_folder(self) -> str | None:
        if self._resume_from is not None:
            if not ck.is_complete(self._resume_from):
                raise CheckpointError(
                    f"{self._resume_from}: no {ck.MARKER} marker; refusing to resume from a "
                    "checkpoint that was not completely written"
                )
            return self._resume_from
        if self._resume_latest and self.checkpoint_uri is not None:
            latest = ck.latest_complete(self.checkpoint_uri)
            return None if latest is None else latest.uri
        return None

    def _after_restore(self, step: int, folder: str | None) -> None:
        self._saved_step = self._attempted_step = self._step = step
        self._saved_any = folder is not None  # rank 0 broadcast it: the same everywhere
        self._last_save_started = time.monotonic()
        self.last_checkpoint = self.resumed_from = folder
        self._write_progress(force=True)

    # ------------------------------------------------------------- decisions

    def should_stop(self, step: int) -> bool:
        """Whether any rank learned of a preemption; the same answer on every rank.

        Collective. Once True it stays True (without further collectives).
        """
        return self._poll(step)[0]

    def should_save(self, step: int) -> bool:
        """Whether a regular checkpoint is due at ``step``; the same answer on every rank.

        Due when ``step`` is a multiple of ``every_steps`` or ``interval_seconds``
        have passed since the last save started (on any rank), and ``step`` was not
        saved yet. Always False without a checkpoint URI. Collective.
        """
        return self._poll(step)[1]

    def _poll(self, step: int) -> tuple[bool, bool]:
        """One all-reduce per step: stop flag, save due, and the pending save's state."""
        if self._decided is not None and self._decided[0] == step:
            return self._decided[1], self._decided[2]
        if self._stopping:
            # Every rank learned it from the same reduction (or the same emergency
            # save call), so all of them skip the collective from here on.
            return True, False
        pending = self._pending
        local = [
            1.0 if self._local_stop() else 0.0,
            1.0 if self._save_due(step) else 0.0,
            1.0 if pending is not None and not pending.done() else 0.0,
            1.0 if pending is not None and pending.error() is not None else 0.0,
        ]
        stop, due, running, failed = self._comm.max(local)
        if pending is not None and running == 0:
            # Every rank's write is done: this reduction was the barrier.
            self._finish(pending, failed=failed > 0)
        self._stopping = self._stopping or stop > 0
        decision = (self._stopping, due > 0 and not self._stopping)
        self._decided = (step, *decision)
        return decision

    def _local_stop(self) -> bool:
        if self._signals.received is not None:
            return True
        if self._notice is None:
            self._notice = read_notice(self._notice_file)
        return self._notice is not None

    def _save_due(self, step: int) -> bool:
        if self.checkpoint_uri is None or step <= self._attempted_step:
            return False
        if self.every_steps is not None and step % self.every_steps == 0:
            return True
        elapsed = time.monotonic() - self._last_save_started
        return self.interval_seconds is not None and elapsed >= self.interval_seconds

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
            return self._emergency_save(step, state)
        self._drain()  # one save in flight at a time: back-pressure, and order
        if step == self._saved_step and self._saved_any:
            return self.last_checkpoint
        return self._write(step, state, wait=not self._use_async())

    def wait(self) -> str | None:
        """Block until a pending save is complete everywhere (marked); return the latest
        complete checkpoint. Collective."""
        self._drain()
        return self.last_checkpoint

    def _emergency_save(self, step: int, state: Mapping[str, Any]) -> str | None:
        self._stopping = True
        self._drain()
        if step == self._saved_step and self._saved_any:
            self._say(f"step {step} is already checkpointed at {self.last_checkpoint}")
            return self.last_checkpoint
        if not self._emergency_fits(step):
            return None
        return self._write(step, state, wait=True)

    def _emergency_fits(self, step: int) -> bool:
        """Agree whether a save fits before the earliest kill; log the decision."""
        left = self.time_left()
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
        assert self.checkpoint_uri is not None
        folder = ck.join(self.checkpoint_uri, ck.checkpoint_name(step))
        self._prepare_folder(folder)
        payload: dict[str, Any] = {**state, STATE_KEY: {"step": step}}
        writer = self._writer_factory(folder)
        self._attempted_step = step
        self._last_save_started = started = time.monotonic()
        future = self._launch(payload, writer, background=not wait)
        pending = _Pending(step=step, folder=folder, future=future, started=started)
        future.add_done_callback(pending.on_done)
        self._pending = pending
        if wait:
            self._drain()
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
        except BaseException as exc:  # DCP's CheckpointException; agreed on in _drain
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
        if self.is_main:
            try:
                dcp.remove_folder(folder)
            except OSError as exc:
                self._say(f"could not clear {folder} before writing it: {exc}")
        self._comm.barrier()

    def _drain(self) -> None:
        """Wait for the pending save on this rank, agree with all ranks, finish it."""
        pending = self._pending
        if pending is None:
            return
        error = pending.wait()
        (failed,) = self._comm.max([1.0 if error is not None else 0.0])
        self._finish(pending, failed=failed > 0)

    def _finish(self, pending: _Pending, *, failed: bool) -> None:
        """Every rank's write of ``pending`` is done: rank 0 marks it, or all log it torn."""
        self._pending = None
        error = pending.error()
        if error is not None:
            self._say(f"rank {self.rank}: writing step {pending.step} failed: {error!r}", True)
        if failed:
            self._say(
                f"checkpoint at step {pending.step} failed; {pending.folder} stays without "
                f"{ck.MARKER} and will never be resumed from"
            )
            return
        self.budget.record(pending.duration())
        self._saved_step = pending.step
        self._saved_any = True
        if self.is_main:
            try:
                ck.mark_complete(pending.folder)
            except CheckpointError as exc:
                self._say(f"could not mark {pending.folder} complete: {exc}")
                return
        self.last_checkpoint = pending.folder
        self._step = max(self._step, pending.step)
        self._write_progress(force=True)

    # --------------------------------------------------------------- progress

    def report(self, step: int, total_steps: int | None = None, *, force: bool = False) -> None:
        """Tell the agent how far training got (rank 0 writes; other ranks only remember).

        Cheap to call every step: the file is rewritten at most every
        ``progress_every_seconds``, unless ``force`` or a new checkpoint completed.
        Not collective.
        """
        self._step = step
        if total_steps is not None:
            self._total_steps = total_steps
        self._write_progress(force=force)

    def _write_progress(self, *, force: bool) -> None:
        if not self.is_main or self._progress_file is None:
            return
        now = time.monotonic()
        stale = (
            self._progress_written_at is None
            or now - self._progress_written_at >= self._progress_every
            or self._progress_checkpoint != self.last_checkpoint
        )
        if not (force or stale):
            return
        try:
            write_progress(self._progress_file, self._step, self._total_steps, self.last_checkpoint)
        except OSError as exc:
            self._say(f"cannot write progress file {self._progress_file}: {exc}")
        self._progress_written_at = now
        self._progress_checkpoint = self.last_checkpoint

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
                self._drain()
                # Only once no save is in flight: one left running (wait=False) still
                # needs the group, and the process is on its way out anyway.
                self._comm.close()
            self._write_progress(force=True)
        finally:
            self._signals.restore()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(wait=exc_type is None)

    # -------------------------------------------------------------------- log

    def _say(self, message: str, all_ranks: bool = False) -> None:
        """One log line; from rank 0 only unless ``all_ranks``."""
        if all_ranks or self.is_main:
            self._log(f"spotd.train: {message}")
