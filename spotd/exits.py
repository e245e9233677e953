"""A node's last word on its job, kept beside the job's checkpoints until the daemon reads it.

The agent reports the end of a job to the daemon over HTTP and retries for a
while. A daemon that is down for longer than that, on a node the market then
takes back, would never hear it: it would find the node preempted, take the
finished job for an interrupted one and run it again. So before it reports,
the agent writes the exit, with the preemption notice it saw if any, to the
one place that both the node and the daemon reach on every provider, the
job's checkpoint location::

    <checkpoint uri>/_spotd/<job id>/attempt-<n>/<instance id>.json

The daemon reads it only for nodes that ended without an exit report. The
folder sits beside the ``step-*`` checkpoints, which
:func:`spotd.checkpoints.list_complete` alone reads; nothing else is kept in it.
"""

from __future__ import annotations

import logging
import re

from pydantic import BaseModel, ConfigDict, ValidationError

from spotd.checkpoints import join, list_files, read_bytes, write_bytes
from spotd.core.agent_wire import ExitReport, NoticeReport

__all__ = ["FOLDER", "KeptExit", "keep_exit", "kept_exits"]

log = logging.getLogger(__name__)

FOLDER = "_spotd"
"""The folder of spotd's own files inside a job's checkpoint location."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class KeptExit(BaseModel):
    """How the job ended on one node, as its agent saw it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    exit: ExitReport
    notice: NoticeReport | None = None
    """The preemption notice the node had before the job ended, if any."""
    stopped: bool = False
    """Whether the agent had passed a stop on to the job (for a notice, or for the
    node's own shutdown) before it ended: then its exit may be the stop's. An exit
    without either is the job's own, whatever became of the node later."""


def _attempt_folder(root: str, job_id: str, attempt: int) -> str:
    return join(root, FOLDER, _UNSAFE.sub("_", job_id), f"attempt-{attempt}")


def keep_exit(root: str, kept: KeptExit) -> None:
    """Write ``kept`` under the checkpoint location ``root``, whole or not at all.

    Raises :class:`~spotd.core.errors.CheckpointError` when it cannot be written.
    """
    report = kept.exit
    name = _UNSAFE.sub("_", report.instance_id) + ".json"
    folder = _attempt_folder(root, report.job_id, report.attempt)
    write_bytes(join(folder, name), kept.model_dump_json().encode())


def kept_exits(root: str, job_id: str, attempt: int) -> dict[str, KeptExit]:
    """The exits kept for one attempt of a job, by instance id; ``{}`` when none.

    A file that is not a record of this job and attempt is skipped with a
    warning. Raises :class:`~spotd.core.errors.CheckpointError` when the
    location cannot be read.
    """
    found: dict[str, KeptExit] = {}
    for uri in list_files(_attempt_folder(root, job_id, attempt)):
        try:
            kept = KeptExit.model_validate_json(read_bytes(uri))
        except ValidationError as exc:
            log.warning("%s: not an exit record, skipped (%d error(s))", uri, exc.error_count())
            continue
        if (kept.exit.job_id, kept.exit.attempt) != (job_id, attempt):
            log.warning("%s: the exit of %s attempt %d, skipped", uri, kept.exit.job_id,
                        kept.exit.attempt)  # fmt: skip
            continue
        found[kept.exit.instance_id] = kept
    return found
