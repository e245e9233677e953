"""spotd.engine.launching: what a launch tells the nodes."""

from __future__ import annotations

from spotd.core.agent_wire import JOB_TMPDIR
from spotd.core.network import Fabric, Interconnect
from spotd.core.values import AttemptRecord, JobRecord, JobStatus, Market, Offering, Pool
from spotd.engine.launching import launch_request
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB, TAG_OWNER
from tests.engine_support import EPOCH, spec

OFFERING = Offering(
    pool=Pool("fake", "r1", "r1a", "x.gpu"), gpu="A100", gpus_per_node=1, gpu_memory_gb=80,
    interconnect=Interconnect(Fabric.ETHERNET, 100.0), spot_price=1.0, on_demand_price=3.0,
    capacity=1.0,
)  # fmt: skip


def _request(**extra: object) -> dict[str, str]:
    job = JobRecord("j-1", "t", spec(**extra), JobStatus.PROVISIONING, None, EPOCH, EPOCH)
    attempt = AttemptRecord(1, "j-1", 2, OFFERING.pool, Market.SPOT, 1, 1.0, "j-1-a2", (),
                            None, EPOCH, None, None, None)  # fmt: skip
    request = launch_request(job, attempt, OFFERING, owner="d1", checkpoint_uri="/ck/j-1",
                             interval_hours=0.5)  # fmt: skip
    assert request.tags == {TAG_JOB: "j-1", TAG_ATTEMPT: "2", TAG_OWNER: "d1"}
    assert request.client_token == "j-1-a2"
    return dict(request.env)


def test_the_nodes_are_told_the_job_attempt_and_checkpoints() -> None:
    env = _request()
    assert (env["SPOTD_JOB_ID"], env["SPOTD_ATTEMPT"], env["SPOTD_CHECKPOINT_URI"]) == (
        "j-1", "2", "/ck/j-1")
    assert env["SPOTD_CHECKPOINT_INTERVAL_SECONDS"] == "1800"


def test_the_nodes_are_told_the_jobs_team_when_it_has_one() -> None:
    assert "SPOTD_TEAM" not in _request()
    assert _request(team="vision")["SPOTD_TEAM"] == "vision"


def test_a_job_that_names_its_own_tmpdir_keeps_it() -> None:
    assert JOB_TMPDIR not in _request()
    env = _request(env={"TMPDIR": "/scratch"})
    assert (env["TMPDIR"], env[JOB_TMPDIR]) == ("/scratch", "1")


def test_a_kept_node_rejoining_is_told_what_a_new_node_of_the_attempt_is() -> None:
    from dataclasses import replace

    from spotd.engine.launching import attempt_environment, job_environment

    job = JobRecord("j-1", "t", spec(resources={"gpus": ["A100"], "gpus_per_node": 1,
                                                "nodes": 2, "min_gbps_per_gpu": 10}),
                    JobStatus.PROVISIONING, None, EPOCH, EPOCH)  # fmt: skip
    attempt = AttemptRecord(1, "j-1", 3, OFFERING.pool, Market.SPOT, 2, 1.0, "j-1-a3", (),
                            "/ck/j-1/step-00000040", EPOCH, None, None, None,
                            checkpoint_interval_hours=0.5)  # fmt: skip
    new_node = job_environment(job, attempt, OFFERING, checkpoint_uri="/ck/j-1",
                               interval_hours=0.5)  # fmt: skip
    rejoining = attempt_environment(attempt)
    assert rejoining == {k: new_node[k] for k in rejoining}
    assert rejoining["SPOTD_RESUME_FROM"] == "/ck/j-1/step-00000040"
    assert attempt_environment(replace(attempt, resume_from=None))["SPOTD_RESUME_FROM"] == ""
