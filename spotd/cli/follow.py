"""``spotd logs [--follow]``: a job's output, read from the daemon's API, as it comes.

Each answer ends with a cursor; the next request passes it back and gets only the
output that came since, node by node, so a poll costs what is new, not the whole
output again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from spotd.core.states import JobStatus

if TYPE_CHECKING:
    from spotd.cli.client import Client
    from spotd.daemon.logview import LogsView
    from spotd.daemon.views import JobView

Write = Callable[[str | None, str], None]
"""Takes a node's header (None while the same node goes on) and its new output."""
Gone = Callable[[str, int], None]
"""Told a node's header and how many bytes of its output before what follows are not
kept (the daemons keep a job's newest ``[agent] log_keep_bytes``)."""


def write_page(
    page: LogsView, write: Write, gone: Gone, *, last: str | None = None, empty: bool = False
) -> str | None:
    """Write each node's text of ``page``, its header only when the node changes from
    ``last`` (and for a node with no text only if ``empty``); the last header written."""
    for node in page.nodes:
        text = page.logs.get(node.header, "")
        if node.skipped:
            gone(node.header, node.skipped)
        if text or empty:
            write(node.header if node.header != last else None, text)
            last = node.header
    return last


def follow_logs(
    client: Client,
    ref: str,
    write: Write,
    gone: Gone,
    *,
    attempt: int | None = None,
    node: int | None = None,
    every: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> JobView:
    """Write the output of job ``ref``'s nodes (of ``attempt`` and ``node`` only, if
    given) as it grows, every ``every`` seconds, until the job has ended; return the
    ended job.

    The job is read before its output, so the last round, after the end, has all of
    it (its nodes ship the rest before they report the end).
    """
    cursor: str | None = None
    last: str | None = None
    while True:
        job = client.job(ref)
        page = client.logs(job.id, attempt=attempt, node=node, after=cursor)
        last = write_page(page, write, gone, last=last)
        cursor = page.cursor
        if JobStatus(job.status).terminal:
            return job
        sleep(every)
