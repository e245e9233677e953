"""A hung gang for real: the DDP example on two simulated nodes of one torch process
each (torchrun, gloo), an embedded daemon, the real agents. One rank's worker is
stopped (SIGSTOP) mid-training: torchrun sees no death and the other rank blocks
in its all-reduce, so nothing exits. The daemon must see the steps stand for
``gang.hang_timeout``, name the stopped rank and its node, end the attempt
``hung`` and resume the job on a new gang from its last complete checkpoint.

(A SIGKILL is no hang here: torchrun notices its worker's death at once and exits,
and the node reports the exit; only a rank that lives and does nothing hangs.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from spotd import checkpoints as ck
from spotd.cli.client import Client
from spotd.cli.demo import stop_daemon
from spotd.cli.demo_ddp import TRAINER, DdpDemoOptions, ddp_settings, ddp_spec
from spotd.core.ranks import ranks_of
from spotd.core.spec import GangSpec, JobSpec
from spotd.core.states import JobStatus
from spotd.daemon.process import Daemon
from spotd.daemon.views import AttemptView, EventView, JobView

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

T = TypeVar("T")
STEPS = 100
OPTIONS = DdpDemoOptions(steps=STEPS, ckpt_every=10, step_seconds=0.05, quiet=True)
HANG_TIMEOUT = "5m"
"""On the daemon's clock: the simulated market runs 30x, so 10 real seconds, several
times the longest a healthy rank goes without a new step in its file (a second)."""


def hang_spec(root: Path) -> JobSpec:
    """The demo's job with one process a node and the hang watch on."""
    spec = ddp_spec(root, OPTIONS)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
               str(TRAINER), "--steps", str(STEPS), "--ckpt-every", str(OPTIONS.ckpt_every),
               "--step-seconds", str(OPTIONS.step_seconds)]  # fmt: skip
    gang = GangSpec(timeout=spec.gang.timeout, hang_timeout=HANG_TIMEOUT)  # type: ignore[arg-type]
    return JobSpec.model_validate({**spec.model_dump(), "command": command,
                                   "gang": gang.model_dump()})  # fmt: skip


def wait(found: Callable[[], T | None], what: str, seconds: float = 90.0) -> T:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (value := found()) is not None:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, Client]]:
    daemon = Daemon(ddp_settings(tmp_path, OPTIONS))
    daemon.start()
    try:
        token = ddp_settings(tmp_path, OPTIONS).token_file.read_text()
        yield daemon, Client(f"http://127.0.0.1:{daemon.port}", token)
    finally:
        stop_daemon(daemon)


def test_a_stopped_rank_is_found_named_and_the_job_resumes(
    tmp_path: Path, running: tuple[Daemon, Client]
) -> None:
    daemon, client = running
    job_id = client.submit(hang_spec(tmp_path)).id
    uri = str(tmp_path / "checkpoints")

    def training() -> AttemptView | None:
        attempts = client.job(job_id).attempts
        if not attempts:
            return None
        first = attempts[0]
        step = first.gang.step if first.gang else None
        saved = ck.latest_complete(uri)
        return first if step is not None and step >= 15 and saved is not None else None

    first = wait(training, "the first gang to train past a checkpoint")

    def rank1_pid() -> int | None:
        for report in daemon.engine.store.reports(job_id):
            for reading in ranks_of(report.ranks):
                if reading.rank == 1 and report.attempt == first.seq and reading.pid:
                    return reading.pid
        return None

    pid = wait(rank1_pid, "rank 1's pid in a heartbeat", 20)
    os.kill(pid, signal.SIGSTOP)
    try:

        def hang() -> EventView | None:
            return next((e for e in client.events(job_id) if e.cause == "hang"), None)

        def succeeded() -> JobView | None:
            job = client.job(job_id)
            assert job.status not in ("failed", "cancelled"), job
            return job if job.status == "succeeded" else None

        event = wait(hang, "the hang event", 60)
        done = wait(succeeded, "the job to finish on a new gang", 120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # its node is gone; never leave a stopped process

    # The event names the stopped rank and its node (rank 1 of the gang).
    assert event.facts.process_ranks == [1]
    assert event.facts.node == first.instance_ids[1] and event.facts.rank == 1
    assert event.facts.nodes == [first.instance_ids[1]]
    assert f"rank 1 (pid {pid}, stopped" in event.detail
    assert event.to_status == JobStatus.RECOVERING.value
    # Ended hung, then resumed from a complete checkpoint on a new gang, to the end.
    hung_attempt, *rest = done.attempts
    assert hung_attempt.end_reason == "hung" and rest
    resumed = rest[0].resume_from
    assert resumed is not None and ck.is_complete(resumed)
    assert 0 < int(Path(resumed).name.removeprefix("step-")) < STEPS
    assert set(rest[0].instance_ids).isdisjoint(first.instance_ids)
    assert rest[-1].end_reason == "succeeded"
