"""What an attempt's launch asks of its provider: the request, its tags and the nodes'
environment. Pure functions of the job, its attempt and the offering."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from spotd.core.agent_wire import JOB_TMPDIR
from spotd.core.fabric_env import fabric_environment
from spotd.core.spec import JobSpec
from spotd.core.values import AttemptRecord, GangRef, JobRecord, LaunchRequest, Offering
from spotd.engine.gang import gang_environment
from spotd.engine.placements import gang_chain
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB, TAG_OWNER
from spotd.engine.shipping import shipping_environment


def job_environment(
    job: JobRecord,
    attempt: AttemptRecord,
    offering: Offering,
    *,
    checkpoint_uri: str,
    interval_hours: float,
) -> dict[str, str]:
    """Everything the nodes of ``attempt`` are told before they boot.

    In order, later winning: the fabric's NCCL and libfabric variables (with
    the job's per-fabric overrides), the job's own ``[env]``, what the gang
    needs to assemble and pass preflight, and spotd's own variables. The
    agent adds the rest once the gang has assembled (rank, master, roster).
    """
    env = fabric_environment(
        offering.interconnect, job.spec.fabric_env, nodes=attempt.nodes,
        instance_type=offering.pool.instance_type,
    )  # fmt: skip
    env.update(job.spec.env)
    env.update(gang_environment(job.spec, attempt, offering))
    env.update(shipping_environment(job.spec, offering, checkpoint_uri))
    env.update(
        SPOTD_JOB_ID=job.id,
        SPOTD_ATTEMPT=str(attempt.seq),
        SPOTD_NUM_NODES=str(attempt.nodes),
        SPOTD_CHECKPOINT_URI=checkpoint_uri,
        SPOTD_RESUME_FROM=attempt.resume_from or "",
        SPOTD_CHECKPOINT_INTERVAL_SECONDS=str(round(interval_hours * 3600)),
    )
    if job.spec.team is not None:
        env["SPOTD_TEAM"] = job.spec.team  # where a provider keeps teams apart (a namespace)
    if "TMPDIR" in job.spec.env:
        env[JOB_TMPDIR] = "1"  # the job's own: the agent leaves it as it is
    return env


def attempt_environment(attempt: AttemptRecord) -> dict[str, str]:
    """What a node's environment says differently from one attempt of a job to the next
    in the same pool: all a node kept for the next attempt (:mod:`spotd.engine.repair`)
    is told when it rejoins. :func:`job_environment` gives a new node the same values."""
    env = {
        "SPOTD_ATTEMPT": str(attempt.seq),
        "SPOTD_RDZV_ID": attempt.client_token,
        "PET_RDZV_ID": attempt.client_token,
        "SPOTD_NUM_NODES": str(attempt.nodes),
        "PET_NNODES": str(attempt.nodes),
        "SPOTD_RESUME_FROM": attempt.resume_from or "",
    }
    if attempt.checkpoint_interval_hours is not None:
        seconds = round(attempt.checkpoint_interval_hours * 3600)
        env["SPOTD_CHECKPOINT_INTERVAL_SECONDS"] = str(seconds)
    return env


def max_run_seconds(spec: JobSpec) -> int | None:
    """The job's ``market.max_run_hours`` in whole seconds, as launch requests carry it."""
    hours = spec.market.max_run_hours
    return None if hours is None else max(1, round(hours * 3600))


def launch_request(
    job: JobRecord,
    attempt: AttemptRecord,
    offering: Offering,
    *,
    owner: str,
    checkpoint_uri: str,
    interval_hours: float,
) -> LaunchRequest:
    """The request that launches ``attempt``'s nodes; its client token makes a repeat
    of it (after a crash) start nothing new."""
    env = job_environment(job, attempt, offering, checkpoint_uri=checkpoint_uri,
                          interval_hours=interval_hours)  # fmt: skip
    return LaunchRequest(
        offering=offering,
        market=attempt.market,
        nodes=attempt.nodes,
        client_token=attempt.client_token,
        tags={TAG_JOB: job.id, TAG_ATTEMPT: str(attempt.seq), TAG_OWNER: owner},
        command=job.spec.command,
        env=env,
        # Shipped code runs where the node unpacks it, not at the submitter's path.
        workdir=None if job.spec.code is not None else job.spec.workdir,
        max_run_seconds=max_run_seconds(job.spec),
    )


def gang_ref(
    attempts: Sequence[AttemptRecord], opened: AttemptRecord, kept: tuple[str, ...], *, owner: str
) -> GangRef:
    """The running gang the new nodes of ``opened`` (a node repair) join: the placement
    objects of its origin (the attempt whose launch made them,
    :func:`spotd.engine.placements.gang_chain`) and its ``kept`` nodes."""
    held = replace(opened, instance_ids=kept)
    origin = gang_chain([held if a.seq == held.seq else a for a in attempts], held)[-1]
    return GangRef(
        client_token=origin.client_token,
        tags={TAG_JOB: origin.job_id, TAG_ATTEMPT: str(origin.seq), TAG_OWNER: owner},
        instance_ids=kept,
    )
