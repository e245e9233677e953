"""A new job: what is refused before it is stored."""

from __future__ import annotations

from datetime import datetime

from spotd import checkpoints
from spotd.core.contracts import JobStore
from spotd.core.errors import CheckpointError, SubmitRefused
from spotd.core.spec import JobSpec
from spotd.core.spec_io import passed_deadline, relative_paths
from spotd.core.values import JobRecord, SubmitWarning, SubmitWarningKind
from spotd.market.cache import unoffered_gpus


def refusal(spec: JobSpec, now: datetime, offered_gpus: frozenset[str] | None) -> None:
    """Raise SubmitRefused for a job this daemon could never run: a relative path (there
    is no job file here to resolve it against), a checkpoint location it has no way to
    open or write (a local one is probed here), a ``finish_by`` already past at ``now``,
    or GPU models that no provider offers (``offered_gpus``; None before any poll)."""
    if relative := relative_paths(spec):
        field, value = relative[0]
        raise SubmitRefused(
            f"{field}: {value!r} is a relative path, and the daemon has no job file to "
            "resolve it against; send an absolute path (spotd submit resolves it "
            "against the job file's folder)",
            field=field,
        )
    if spec.checkpoint.uri:
        try:
            checkpoints.check_location(spec.checkpoint.uri)
            # Here only: a stored job's location is not probed again at each pass.
            checkpoints.check_writable(spec.checkpoint.uri)
        except CheckpointError as exc:
            raise SubmitRefused(f"checkpoint.uri: {exc}", field="checkpoint.uri") from exc
    late = passed_deadline(spec, now)
    if late is not None:
        raise SubmitRefused(late, field="deadline.finish_by")
    problem = unoffered_gpus(spec.resources.gpus, offered_gpus)
    if problem is not None:
        raise SubmitRefused(f"resources.gpus: {problem}", field="resources.gpus")


def notify_warnings(spec: JobSpec, *, can_email: bool) -> list[SubmitWarning]:
    """What ``notify`` asks that will not happen, said at submit rather than left a
    silent no-op: email asked of a daemon that has no ``[email]`` (``can_email``), or a
    job-end email with no address to send it to. The job is stored all the same."""
    notify = spec.notify
    if (notify.on_end or notify.email) and not can_email:
        asked = "notify.on_end" if notify.on_end else "notify.email"
        return [SubmitWarning(
            SubmitWarningKind.NO_EMAIL,
            f"{asked} asks for email, and this daemon has no [email] SMTP host: no job-end "
            "email or budget alert is sent for this job",
        )]  # fmt: skip
    if notify.on_end and not notify.email:
        return [SubmitWarning(
            SubmitWarningKind.NO_ADDRESS,
            "notify.on_end asks for the job-end email, and notify.email names no address "
            "to send it to",
        )]  # fmt: skip
    return []


def submit(
    store: JobStore,
    spec: JobSpec,
    *,
    now: datetime,
    offered: frozenset[str] | None,
    idempotency_key: str | None = None,
) -> JobRecord:
    """Store a new job, pending, for the next pass to place; SubmitRefused, and nothing
    stored, for a job no daemon could ever run (:func:`refusal`; ``offered``: the GPU
    models the market offers). ``idempotency_key`` is stored with the job: the store
    returns the first job for a key it already has."""
    refusal(spec, now, offered)
    return store.create_job(spec, now=now, idempotency_key=idempotency_key)
