"""This node's preflight workers: started in the job's runtime, waited for, read.

:func:`run_workers` starts one :mod:`spotd.agent.preflight_worker` per local
process with the job's interpreter (:mod:`spotd.agent.job_python`), polls them
until all exited, one failed, or the deadline passed, kills what is left, and
turns what they printed into a :class:`WorkerOutcome`: local rank 0's result, or
the first failure as a typed :class:`~spotd.core.agent_wire.PreflightCheck`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from pydantic import TypeAdapter, ValidationError

from spotd.agent import preflight_worker as worker
from spotd.agent.job_python import JobRuntime, NoPython, write_worker
from spotd.agent.preflight_worker import SPEC_VARIABLE, WorkerFailure, WorkerResult, WorkerSpec
from spotd.core.agent_wire import IMAGE, PreflightCheck, PreflightCheckName, PreflightFailure
from spotd.core.contracts import Clock

_POLL_SECONDS = 0.05
_NOT_FOUND = 127
"""The shell's (and the container engines') exit when the program is not there."""
_ENGINE_SECONDS = 30.0
"""How long the container engine may take to remove a killed worker's container."""

_RESULT = TypeAdapter(WorkerResult)
_FAILURE = TypeAdapter(WorkerFailure)

STEP_OF: Mapping[str, tuple[PreflightCheckName, PreflightFailure]] = {
    worker.TORCH_MISSING: (PreflightCheckName.TORCH, PreflightFailure.TORCH_MISSING),
    worker.TORCH_BROKEN: (PreflightCheckName.TORCH, PreflightFailure.TORCH_BROKEN),
    worker.NO_GPU: (PreflightCheckName.TORCH_GPUS, PreflightFailure.NO_GPU),
    worker.PROCESS_GROUP_FAILED: (
        PreflightCheckName.PROCESS_GROUP,
        PreflightFailure.PROCESS_GROUP_FAILED,
    ),
    worker.ALLREDUCE_FAILED: (PreflightCheckName.BANDWIDTH, PreflightFailure.ALLREDUCE_FAILED),
    worker.BAD_REQUEST: (PreflightCheckName.JOB_PYTHON, PreflightFailure.OTHER),
}
"""A worker's failure reason -> the check it fails and why."""


@dataclass(frozen=True, slots=True)
class RankEnv:
    """The torch variables of this node's ranks."""

    node_rank: int
    local_procs: int
    world_size: int
    master_addr: str
    port: int

    def of(self, local_rank: int) -> dict[str, str]:
        """The variables of local rank ``local_rank``."""
        return {
            "RANK": str(self.node_rank * self.local_procs + local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_procs),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.port),
        }


@dataclass(frozen=True, slots=True)
class WorkerOutcome:
    """What this node's workers said."""

    result: WorkerResult | None = None
    """Local rank 0's last result: its figures when all finished, else (with
    ``failure``) how far it got before the gang; None when it printed none."""
    failure: PreflightCheck | None = None
    """The first failure, as the check it fails; None when every worker finished."""
    python: str = ""
    """The interpreter that ran local rank 0 and its version, as it said; empty when it
    said nothing."""

    @property
    def timed_out(self) -> bool:
        """The deadline ended the workers (a peer that never came, a hang)."""
        return self.failure is not None and self.failure.reason is PreflightFailure.TIMED_OUT


@dataclass
class _Worker:
    proc: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]
    local_rank: int
    container: list[str] | None = None
    """The engine's command that removes this worker's container; None on the host."""
    last: WorkerResult | WorkerFailure | None = field(default=None)


def failed(name: PreflightCheckName, reason: PreflightFailure, detail: str) -> PreflightCheck:
    """A failed check."""
    return PreflightCheck(name=name, ok=False, detail=detail, reason=reason)


def run_workers(
    ranks: RankEnv,
    spec: WorkerSpec,
    job: JobRuntime,
    *,
    timeout_seconds: float,
    deadline: float,
    clock: Clock,
) -> WorkerOutcome:
    """Run this node's ``ranks.local_procs`` workers to their end or to ``deadline``."""
    if isinstance(job.python, NoPython):
        return WorkerOutcome(failure=_no_python(job.python.detail))
    workers: list[_Worker] = []
    try:
        script = write_worker(job.run_dir)
        for local_rank in range(ranks.local_procs):
            workers.append(_start(ranks, spec, job, script, local_rank))
        failure = _wait(workers, deadline, clock, timeout_seconds)
    except OSError as exc:
        failure = _no_python(f"cannot start the job's python: {exc}")
    finally:
        _kill(workers)
    first = workers[0].last if workers else None
    result = first if isinstance(first, WorkerResult) else None
    python = f"python {first.python_version} at {first.python}" if first and first.python else ""
    measured = result is not None and (ranks.world_size == 1 or result.busbw_gbps is not None)
    if failure is None and not measured:
        failure = failed(PreflightCheckName.JOB_PYTHON, PreflightFailure.PYTHON_UNUSABLE,
                         "preflight worker 0 exited without its figures")  # fmt: skip
    return WorkerOutcome(result=result, failure=failure, python=python)


def _no_python(detail: str) -> PreflightCheck:
    return failed(PreflightCheckName.JOB_PYTHON, PreflightFailure.PYTHON_MISSING, detail)


def _start(
    ranks: RankEnv, spec: WorkerSpec, job: JobRuntime, script: Path, local_rank: int
) -> _Worker:
    env = {**job.env, **ranks.of(local_rank), SPEC_VARIABLE: spec.to_json()}
    name = f"spotd-preflight-{uuid.uuid4().hex[:12]}-{local_rank}"
    argv = replace(job, env=env).argv(script, name)
    container = [argv[0], "rm", "--force", name] if job.env.get(IMAGE) else None
    # Files, not pipes: a worker blocked on a full pipe would stall its peers' collectives.
    stdout = tempfile.TemporaryFile()  # noqa: SIM115 (closed in _kill)
    stderr = tempfile.TemporaryFile()  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=job.cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            process_group=0,  # its own group, so a kill reaches anything it started
        )
    except OSError:
        stdout.close()
        stderr.close()
        raise
    return _Worker(proc, stdout, stderr, local_rank, container)


def _wait(
    workers: list[_Worker], deadline: float, clock: Clock, timeout_seconds: float
) -> PreflightCheck | None:
    """None when all exited 0; else the first failure, or the timeout at ``deadline``.

    Polls them all, so one worker's early failure ends the wait at once instead of
    leaving its local peers to hang on it until the deadline.
    """
    while True:
        codes = [w.proc.poll() for w in workers]
        for one, code in zip(workers, codes, strict=True):
            if code not in (None, 0):
                return _failure_of(one, code)
        if all(code == 0 for code in codes):
            return None
        if clock.monotonic() >= deadline:
            # The same words on every node: which peer hung is not known here.
            return failed(PreflightCheckName.PROCESS_GROUP, PreflightFailure.TIMED_OUT,
                          f"preflight timed out after {timeout_seconds:g} s")  # fmt: skip
        time.sleep(_POLL_SECONDS)


def _failure_of(one: _Worker, code: int) -> PreflightCheck:
    # The worker has exited: its files are complete.
    last = _parse(one.stdout)
    if isinstance(last, WorkerFailure):
        name, reason = STEP_OF.get(last.reason, (PreflightCheckName.OTHER, PreflightFailure.OTHER))
        return failed(name, reason, last.error)
    said = _last_line(one.stderr)
    if code == _NOT_FOUND and last is None:
        return failed(PreflightCheckName.JOB_PYTHON, PreflightFailure.PYTHON_MISSING,
                      f"the job's python was not found: {said}")  # fmt: skip
    return failed(PreflightCheckName.JOB_PYTHON, PreflightFailure.PYTHON_UNUSABLE,
                  f"preflight worker {one.local_rank} exited with {code}: {said}")  # fmt: skip


def _kill(workers: list[_Worker]) -> None:
    """Kill every worker's process group (a no-op for those that exited) and its
    container, keep its last line, close its files."""
    for one in workers:
        if one.proc.poll() is None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(one.proc.pid, signal.SIGKILL)
            if one.container is not None:
                # Killing the engine's client leaves the container running.
                with suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(one.container, stdin=subprocess.DEVNULL, capture_output=True,
                                   timeout=_ENGINE_SECONDS, check=False)  # fmt: skip
        one.proc.wait()
        one.last = _parse(one.stdout)
        one.stdout.close()
        one.stderr.close()


def _parse(stdout: IO[bytes]) -> WorkerResult | WorkerFailure | None:
    """The worker's last line that parses as a result or a failure."""
    stdout.seek(0)
    for line in reversed(stdout.read().decode(errors="replace").splitlines()):
        for adapter in (_FAILURE, _RESULT):
            with suppress(ValidationError):
                parsed: WorkerResult | WorkerFailure = adapter.validate_json(line)
                return parsed
    return None


def _last_line(stream: IO[bytes]) -> str:
    stream.seek(0)
    lines = [ln.strip() for ln in stream.read().decode(errors="replace").splitlines()]
    return next((ln for ln in reversed(lines) if ln), "no output")
