"""A real 2-node x 2-process torchrun job on the simulated market, through a preemption.

Every node is its own VM process on its own loopback address, with the real
agent; the job is ``examples/train_ddp.py`` under torchrun on gloo, writing
DCP checkpoints through ``spotd.train``. One node of the running gang is
reclaimed with its provider's notice; the job must resume from the last complete
checkpoint (never a torn one), the reclaimed node replaced beside the kept one,
and end with the weights of an uninterrupted run. The test's timeout catches a
rank that hangs.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from rich.console import Console

from spotd.checkpoints import MARKER, checkpoint_name
from spotd.cli.demo_ddp import DdpDemoOptions, run_ddp_demo

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]


def test_ddp_job_resumes_on_a_new_gang_from_the_last_complete_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The machine's temporary directory, to see that nothing is left in it.
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    # A torn checkpoint far ahead: shards written, no marker. It must never be resumed.
    torn = tmp_path / "checkpoints" / checkpoint_name(99_999_999)
    torn.mkdir(parents=True)
    (torn / "__0_0.distcp").write_bytes(b"half a shard")
    options = DdpDemoOptions(steps=70, preemptions=1, progress_per_attempt=20, keep=tmp_path,
                             quiet=True, timeout_seconds=250)  # fmt: skip
    summary = run_ddp_demo(options, Console(quiet=True))

    assert summary.status == "succeeded", summary
    assert summary.preemptions == 1
    first, *rest = summary.attempts
    assert first.end_reason == "preempted" and first.resume_from is None
    assert rest and rest[-1].end_reason == "succeeded"
    for attempt in summary.attempts:
        # Two nodes, each on an address of its own, and a preflight every gang passed. (A
        # node kept for the next attempt, beside the one that replaced the reclaimed node,
        # reports under that attempt.)
        assert attempt.nodes == 2 and attempt.addresses
        assert all(a.startswith("127.") and a != "127.0.0.1" for a in attempt.addresses)
        assert attempt.preflight is not None and attempt.preflight.passed
        assert attempt.preflight.world_size == 2
    assert len(set(rest[-1].addresses)) == 2
    resumed = rest[0].resume_from
    assert resumed is not None and Path(resumed) != torn
    assert (Path(resumed) / MARKER).exists()
    step = int(Path(resumed).name.removeprefix("step-"))
    assert 0 < step < options.steps
    # The same weights as the run that was never interrupted (same world size: bitwise).
    assert summary.result_digest == summary.reference_digest
    assert json.loads(summary.model_dump_json())["providers_used"]
    # torchrun's files (torchelastic_*) go with the folders of their runs: the nodes'
    # in their agents' run folders, the reference run's in the demo's folder (kept here).
    assert sorted(p.name for p in scratch.iterdir()) == []
    assert list((tmp_path / "reference-tmp").glob("torchelastic_*"))
