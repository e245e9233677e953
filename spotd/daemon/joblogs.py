"""A job's output, node by node of each attempt, as its providers keep it.

What ``spotd logs`` prints (through ``GET /v1/jobs/{ref}/logs``) and the tail the
dashboard's job page shows.
"""

from __future__ import annotations

from collections.abc import Sequence

from spotd.core.values import AttemptRecord, JobRecord
from spotd.daemon.reader import Reader


def node_logs(reader: Reader, job: JobRecord) -> dict[str, str]:
    """Each node's output, under ``attempt <seq> <pool> <instance id>``, oldest first."""
    return dict(attempt_logs(reader, reader.store.attempts(job.id)))


def attempt_logs(reader: Reader, attempts: Sequence[AttemptRecord]) -> list[tuple[str, str]]:
    """The output of each node of ``attempts``, under the header :func:`node_logs` gives."""
    out: list[tuple[str, str]] = []
    for attempt in attempts:
        provider = reader.providers.get(attempt.pool.provider)
        for iid in attempt.instance_ids:
            key = f"attempt {attempt.seq} {attempt.pool} {iid}"
            out.append((key, provider.logs(iid) if provider else "(provider not enabled)"))
    return out


def tail(text: str, lines: int) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.splitlines()[-lines:])
