"""Multi-node gangs end to end: the daemon, the simulated market and real agents.

Every node is a real VM process with its own loopback address, running the
real agent, which joins its gang over the daemon's HTTP API, runs the real
preflight (gloo all-reduce) and only then the job's command.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import fast_settings
from gang_support import job_until

from spotd.cli.client import Client
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd
from spotd.daemon.process import Daemon
from spotd.daemon.views import JobView
from spotd_sim import SimProvider

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SHOW_ENV = (
    "import json, os; "
    "keys = [k for k in os.environ if k.startswith(('SPOTD_', 'PET_', 'NCCL_', 'FI_'))]; "
    "env = {k: os.environ[k] for k in keys if k != 'SPOTD_AGENT_TOKEN'}; "
    "env['hostfile'] = open(os.environ['SPOTD_HOSTFILE']).read(); "
    "print('ENV ' + json.dumps(env), flush=True); import time; time.sleep(2)"
)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    yield from _daemon(tmp_path, boot_seconds=60)


@pytest.fixture
def slow_boot_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """Nodes boot in 5 real seconds, not 0.1: time for a test to stall one before it
    is up, however loaded the machine."""
    yield from _daemon(tmp_path, boot_seconds=3000)


def _daemon(tmp_path: Path, *, boot_seconds: float) -> Iterator[Daemon]:
    d = Daemon(fast_settings(tmp_path, speed=600, cooldown_hours=50.0, replan_seconds=3600,
                             boot_seconds=boot_seconds))  # fmt: skip
    d.start()
    try:
        yield d
    finally:
        d.stop()


def client_of(d: Daemon) -> Client:
    return Client(f"http://127.0.0.1:{d.port}", d.settings.token_file.read_text())


def gang_spec(code: str, **extra: object) -> JobSpec:
    body: dict[str, object] = {
        "name": "gang",
        "command": [sys.executable, "-c", code],
        # A small model: the 12.5 Gbps per GPU of GCP's A2 will do (the rule for a
        # 2-node job of unknown size asks 200, which only Azure's ND has here).
        "resources": {"gpus": ["A100"], "gpus_per_node": 8, "nodes": 2, "min_gbps_per_gpu": 10},
        "market": {"regions": ["us-east-1", "eastus", "us-central1"]},
    }
    body.update(extra)
    return JobSpec.model_validate(body)


def ended(job: JobView) -> bool:
    return JobStatus(job.status).terminal


def test_every_node_gets_the_roster_its_rank_and_the_fabric_env(daemon: Daemon) -> None:
    client = client_of(daemon)
    job = client.submit(gang_spec(SHOW_ENV))
    job = job_until(client, job.id, ended, 90)
    assert job.status == "succeeded", client.events(job.id)
    envs = [
        json.loads(line.removeprefix("ENV "))
        for text in client.logs(job.id).logs.values()
        for line in text.splitlines()
        if line.startswith("ENV ")
    ]
    assert len(envs) == 2
    attempt = job.attempts[-1]
    assert attempt.gang is not None
    addresses = attempt.gang.addresses
    assert len(set(addresses)) == 2 and all(a.startswith("127.") for a in addresses)
    assert "127.0.0.1" not in addresses
    assert sorted(e["SPOTD_NODE_RANK"] for e in envs) == ["0", "1"]
    for env in envs:
        assert env["PET_NODE_RANK"] == env["SPOTD_NODE_RANK"]
        assert env["PET_NNODES"] == env["SPOTD_NUM_NODES"] == "2"
        assert env["PET_MASTER_ADDR"] == env["SPOTD_MASTER_ADDR"] == addresses[0]
        assert env["PET_MASTER_PORT"] == env["SPOTD_MASTER_PORT"]
        assert env["SPOTD_NODE_IPS"] == ",".join(addresses)
        assert env["PET_RDZV_ID"] == f"{job.id}-a{attempt.seq}"
        assert env["hostfile"] == "".join(f"{a} slots=8\n" for a in addresses)
        assert env["SPOTD_NOTICE_FILE"] and env["SPOTD_PROGRESS_FILE"]
    # The fabric's variables reached the job: p4d's EFA, Azure's InfiniBand, GCP's A2 sockets.
    assert any(k.startswith(("FI_", "NCCL_")) for k in envs[0])
    pf = attempt.gang.preflight
    assert pf is not None and pf.passed and pf.backend == "gloo" and pf.world_size == 2
    assert pf.busbw_gbps is not None and pf.busbw_gbps > 0
    running = next(e for e in client.events(job.id) if e.to_status == "running")
    assert "preflight passed, bus bandwidth" in running.detail


def test_a_node_that_never_boots_ends_the_gang_as_lost_and_it_is_relaunched(
    slow_boot_daemon: Daemon,
) -> None:
    daemon = slow_boot_daemon
    client = client_of(daemon)
    spec = gang_spec("print('ran', flush=True)", gang={"timeout": "8s"},
                     preflight={"timeout": "30s"})  # fmt: skip
    job = client.submit(spec)
    first = job_until(client, job.id, lambda j: bool(j.attempts and j.attempts[0].instance_ids), 30)
    a1 = first.attempts[0]
    provider = daemon.engine.providers[a1.provider]
    assert isinstance(provider, SimProvider)
    provider.stall(a1.instance_ids[1])
    job = job_until(client, job.id, lambda j: len(j.attempts) >= 2, 90)
    lost = job.attempts[0]
    assert lost.end_reason == AttemptEnd.LOST
    events = client.events(job.id)
    detail = next(e.detail for e in events if e.cause == "lost")
    assert "gang did not assemble in 38 s" in detail
    # Nothing ran on the partial gang: the healthy node's agent never started the command.
    assert not any("ran" in text.splitlines() for text in client.logs(job.id).logs.values())
    assert lost.gang is None or lost.gang.started == 0
    job = job_until(client, job.id, ended, 90)
    assert job.status == "succeeded"
    assert len(job.attempts) == 2


def test_a_preflight_below_its_threshold_fails_cools_and_moves_the_job(
    daemon: Daemon,
) -> None:
    client = client_of(daemon)
    spec = gang_spec("print('ran')", preflight={"min_busbw_gbps": 10_000})
    job = client.submit(spec)
    job = job_until(client, job.id, lambda j: len(j.attempts) >= 2, 120)
    first, second = job.attempts[0], job.attempts[1]
    assert first.end_reason == AttemptEnd.PREFLIGHT_FAILED
    assert first.gang is not None and first.gang.preflight is not None
    assert not first.gang.preflight.passed
    assert first.gang.preflight.min_busbw_gbps == 10_000
    assert (second.provider, second.region) != (first.provider, first.region)
    failed = next(e for e in client.events(job.id) if e.cause == "preflight-failed")
    assert "preflight failed, bus bandwidth" in failed.detail
    assert "below" in failed.detail
    client.cancel(job.id)
    ledger = [e for e in daemon.engine.store.ledger(job_id=job.id) if e.attempt == first.seq]
    assert ledger and sum(e.usd for e in ledger) > 0


def test_gpu_utilisation_is_watched_shown_and_flagged_in_the_report(
    daemon: Daemon, tmp_path: Path
) -> None:
    from datetime import timedelta

    from spotd.billing.report_model import build_report
    from spotd.cli.render.jobs import gang_lines

    # A recorded NVML session of an 8-GPU node whose last GPU idles: a data-pipeline stall.
    record = tmp_path / "nvml.json"
    busy = {"util_pct": 97.0, "mem_used_gb": 70.0, "mem_total_gb": 80.0}
    idle = {"util_pct": 31.0, "mem_used_gb": 20.0, "mem_total_gb": 80.0}
    record.write_text(json.dumps(
        {"gpus": ["NVIDIA A100-SXM4-80GB"] * 8, "samples": [[busy] * 7 + [idle]]}
    ))
    client = client_of(daemon)
    spec = JobSpec.model_validate({
        "name": "starved", "command": [sys.executable, "-c", "import time; time.sleep(10)"],
        "env": {"SPOTD_AGENT_NVML_RECORD": str(record)},
        "resources": {"gpus": ["A100"], "gpus_per_node": 8},
    })  # fmt: skip
    job = client.submit(spec)
    job = job_until(client, job.id, ended, 90)
    assert job.status == "succeeded", client.events(job.id)
    # The report prices the share from the attempt's running (compute) hours: it ran.
    assert job.attempts[-1].running_at is not None, client.events(job.id)
    gang = job.attempts[-1].gang
    assert gang is not None and gang.gpus
    (node,) = gang.gpus
    assert node.util_pct == [97.0] * 7 + [31.0]
    assert node.samples >= 2 and node.low_share == 1.0 and node.mean_lowest_pct == 31.0
    assert any("GPUs of" in line and "97 97 31 % now" in line for line in gang_lines(job))
    store = daemon.engine.store
    # The engine bills an attempt right after the transition that ended it (once its
    # nodes are stopped): a status read may come between the two.
    limit = time.monotonic() + 20
    while not store.ledger(job_id=job.id) and time.monotonic() < limit:
        time.sleep(0.1)
    now = daemon.engine.clock.now()
    report = build_report(store, since=now - timedelta(days=1), until=now + timedelta(hours=1),
                          job_id=job.id)  # fmt: skip
    (flagged,) = report.underused
    assert flagged.job_id == job.id and flagged.low_share == 1.0 and flagged.gpu_hours > 0
    assert any("sat under 85 %" in f for f in report.findings)
