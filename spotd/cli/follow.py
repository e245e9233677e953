"""``spotd logs --follow``: a job's output as it comes, read from the daemon's API."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from spotd.core.states import JobStatus

if TYPE_CHECKING:
    from spotd.cli.client import Client
    from spotd.daemon.views import JobView

Write = Callable[[str | None, str], None]
"""Takes a node's header (None while the same node goes on) and its new output."""


def follow_logs(
    client: Client,
    ref: str,
    write: Write,
    *,
    every: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> JobView:
    """Write the output of job ``ref``'s nodes as it grows, every ``every`` seconds,
    until the job has ended; return the ended job.

    The daemon serves each node's whole output so far; what was written before is
    skipped. The job is read before its output, so the last round, after the end,
    has all of it.
    """
    written: dict[str, int] = {}
    last: str | None = None
    while True:
        job = client.job(ref)
        for header, text in client.logs(job.id).items():
            start = written.get(header, 0)
            if len(text) < start:
                start = 0  # a node's output started again (a new file): all of it
            if len(text) > start:
                write(header if header != last else None, text[start:])
                last = header
            written[header] = len(text)
        if JobStatus(job.status).terminal:
            return job
        sleep(every)
