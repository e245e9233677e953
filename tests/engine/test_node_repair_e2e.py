"""Node repair end to end: a real 2-node torchrun job on the simulated market, drilled
on node 1.

Every node is a VM process with the real agent; the job is ``examples/train_ddp.py``
under torchrun (gloo, one process per node) checkpointing through ``spotd.train``.
A user drills node 1 of the running gang (``spotd drill JOB --node 1``): the market
reclaims it with its notice, both ranks agree to checkpoint and leave, node 0's agent
stands by, and the daemon replaces node 1 alone in the same pool. The job ends with
exactly one new node and the weights of an uninterrupted run of the same world size.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from engine_support import fast_settings
from gang_support import job_until
from loopback_support import wait_for

from spotd.agent.gang import free_port
from spotd.cli.client import Client
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd
from spotd.daemon.process import Daemon
from spotd.daemon.views import JobView
from spotd_sim import SimProvider

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TRAINER = Path(str(resources.files("spotd.examples") / "train_ddp.py"))
DIGEST = re.compile(r"^digest: ([0-9a-f]{64})$", re.M)
STEPS = ["--steps", "40", "--ckpt-every", "5", "--step-seconds", "0.05"]


def _spec(root: Path) -> JobSpec:
    return JobSpec.model_validate({
        "name": "repair",
        "command": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
                    str(TRAINER), *STEPS],
        "workdir": str(root),
        "env": {"OMP_NUM_THREADS": "1"},
        "resources": {"gpus": ["A100"], "gpus_per_node": 8, "nodes": 2, "min_gbps_per_gpu": 10},
        "market": {"type": "spot", "regions": ["us-east-1", "us-central1", "eastus"]},
        "checkpoint": {"uri": str(root / "checkpoints"), "size_gb": 0.001},
        "gang": {"timeout": "2m"},
        "preflight": {"timeout": "1m"},
    })  # fmt: skip


def _reference(root: Path) -> str:
    """The same training on one host, two ranks, never interrupted."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port("127.0.0.1")), str(TRAINER), *STEPS]  # fmt: skip
    tmp = root / "reference-tmp"
    tmp.mkdir()
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp,
                         timeout=120, check=True)  # fmt: skip
    return DIGEST.findall(run.stdout)[-1]


def _trained_some(job: JobView) -> bool:
    attempt = job.attempts[-1] if job.attempts else None
    if attempt is None or attempt.ended_at is not None or attempt.gang is None:
        return False
    return (attempt.gang.step or 0) >= 10


def test_a_gang_drilled_on_node_1_keeps_node_0_and_ends_with_an_uninterrupted_runs_weights(
    tmp_path: Path,
) -> None:
    daemon = Daemon(fast_settings(tmp_path, speed=30, boot_seconds=30, cooldown_hours=24.0,
                                  replan_seconds=3600))  # fmt: skip
    daemon.start()
    try:
        client = Client(f"http://127.0.0.1:{daemon.port}", daemon.settings.token_file.read_text())
        job = client.submit(_spec(tmp_path))
        first = job_until(client, job.id, _trained_some, 120).attempts[-1]
        provider = daemon.engine.providers[first.provider]
        assert isinstance(provider, SimProvider)
        client.drill(job.id, node=1)
        job = job_until(client, job.id, lambda j: JobStatus(j.status).terminal, 150)
        events = client.events(job.id)
        logs = client.logs(job.id).logs
        # The job's bill is written once its nodes are stopped, just after it ended.
        store = daemon.engine.store
        assert wait_for(lambda: {e.attempt for e in store.ledger(job_id=job.id)} == {1, 2})
        ledger = store.ledger(job_id=job.id)
    finally:
        daemon.stop()

    assert job.status == "succeeded", events
    assert [a.end_reason for a in job.attempts] == [AttemptEnd.PREEMPTED, AttemptEnd.SUCCEEDED]
    before, after = job.attempts
    # Node 0 kept at its rank, node 1 replaced by exactly one new node in the same pool.
    assert after.instance_ids[0] == before.instance_ids[0]
    assert after.instance_ids[1] not in before.instance_ids
    assert (after.provider, after.zone, after.instance_type) == (
        before.provider, before.zone, before.instance_type)  # fmt: skip
    assert len(provider.list_instances({"spotd-job": job.id})) == 3
    drill = next(e for e in events if e.cause == "drill")
    assert drill.facts.node == before.instance_ids[1] and drill.facts.rank == 1
    replaced = next(e for e in events if e.cause == "node replaced")
    assert "node 1" in replaced.detail and "node 0" in replaced.detail
    assert replaced.from_status == "recovering" and replaced.to_status == "provisioning"
    assert after.resume_from is not None
    # The kept node is billed once over both attempts: the ledger is the provider's bill.
    ids = sorted({*before.instance_ids, *after.instance_ids})
    assert sum(e.usd for e in ledger) == pytest.approx(provider.bill(ids), abs=0.011)
    digests = [d for text in logs.values() for d in DIGEST.findall(text)]
    assert digests and digests[-1] == _reference(tmp_path)
