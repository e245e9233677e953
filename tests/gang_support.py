"""Helpers for tests of what a gang's nodes are told: the engine's request and the script."""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from spotd.cli.client import Client
from spotd.core.network import Fabric
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import AttemptRecord, JobRecord, LaunchRequest, Market, Offering
from spotd.daemon.views import JobView
from spotd.engine.launching import job_environment

FABRIC_MARKS = {
    Fabric.EFA: ("FI_PROVIDER", "efa"),
    Fabric.INFINIBAND: ("NCCL_IB_TIMEOUT", "22"),
    Fabric.ROCE: ("NCCL_IB_GID_INDEX", "3"),
    Fabric.TCPX: ("NCCL_NET", "GPUDirectTCPX_v7"),
    Fabric.TCPXO: ("NCCL_NET", "FasTrak"),
    Fabric.ETHERNET: ("NCCL_SOCKET_IFNAME", "^lo,docker"),
}
"""One variable per fabric that its nodes must get from spotd's table."""


def gang_request(
    offering: Offering,
    *,
    nodes: int = 2,
    client_token: str = "j-gang-a3",
    tags: Mapping[str, str] | None = None,
) -> LaunchRequest:
    """The request the engine makes for attempt 3 of a ``nodes``-node job on ``offering``."""
    spec = JobSpec.model_validate({
        "name": "gang", "command": ["torchrun", "--nproc-per-node", "8", "train.py"],
        "resources": {"gpus": [offering.gpu], "gpus_per_node": offering.gpus_per_node,
                      "nodes": nodes},
    })  # fmt: skip
    now = datetime(2026, 12, 1, tzinfo=UTC)
    job = JobRecord(id="j-gang", name="gang", spec=spec, status=JobStatus.PROVISIONING,
                    failure=None, submitted_at=now, updated_at=now)  # fmt: skip
    attempt = AttemptRecord(
        id=1, job_id=job.id, seq=3, pool=offering.pool, market=Market.SPOT, nodes=nodes,
        price_per_node_hour=10.0, client_token=client_token, instance_ids=(), resume_from=None,
        started_at=now, running_at=None, ended_at=None, end_reason=None,
    )  # fmt: skip
    env = job_environment(job, attempt, offering, checkpoint_uri="s3://b/ck", interval_hours=0.5)
    return LaunchRequest(
        offering=offering, market=Market.SPOT, nodes=nodes, client_token=client_token,
        tags=dict(tags or {"spotd-job": job.id, "spotd-attempt": "3"}),
        command=spec.command, env=env,
    )  # fmt: skip


def script_env(script: str) -> dict[str, str]:
    """The variables a boot script writes into the agent's env file, unquoted."""
    match = re.search(r"^# >>> spotd env\n(.*?)^# <<< spotd env$", script, re.M | re.S)
    assert match, "no env section in the boot script"
    values = {}
    for line in match.group(1).splitlines():
        if line.startswith("printf "):
            (export,) = shlex.split(line.split(" ", 2)[2].rsplit(" >>", 1)[0])
            name, _, value = export.removeprefix("export ").partition("=")
            values[name] = shlex.split(value)[0] if value else ""
    return values


def assert_gang_env(env: Mapping[str, str], fabric: Fabric, *, nodes: int = 2) -> None:
    """Rendezvous and fabric variables as every node of the gang must get them."""
    assert env["PET_NNODES"] == env["SPOTD_NUM_NODES"] == str(nodes)
    assert env["PET_RDZV_ID"] == env["SPOTD_RDZV_ID"]
    assert float(env["SPOTD_GANG_TIMEOUT_SECONDS"]) > 0
    assert env["SPOTD_PREFLIGHT"] == "1"
    name, value = FABRIC_MARKS[fabric]
    assert env[name] == value, (fabric, name, env.get(name))


def job_until(
    client: Client, job_id: str, done: Callable[[JobView], bool], timeout: float
) -> JobView:
    """Ask the daemon for the job until ``done(job)`` holds; fail after ``timeout`` real
    seconds (a safety net, not a measure), with the job's events."""
    limit = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if done(job):
            return job
        if time.monotonic() > limit:
            raise AssertionError(f"{job_id} stuck in {job.status}: {client.events(job_id)}")
        time.sleep(0.2)
