"""What ``GET /v1/jobs/{ref}/logs`` answers: each node's output, and a cursor to ask
for only what comes after it.

No web framework and nothing of the engine here: the CLI's client reads these.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel


class LogSource(StrEnum):
    """Where a node's output was read from."""

    AGENT = "agent"
    """What the node's agent shipped to the daemons (kept in the store)."""
    PROVIDER = "provider"
    """The provider's own record of the node (a node whose agent never reported)."""


class NodeLogView(BaseModel):
    """One node's output in an answer: bytes ``[start, end)`` of it, as text."""

    header: str
    """``attempt <n> <pool> <instance id>``: the key of its text in :attr:`LogsView.logs`."""
    attempt: int
    node: int
    """The node's rank in its attempt (its place in the attempt's instances)."""
    instance_id: str
    source: LogSource
    start: int
    end: int
    skipped: int = 0
    """Bytes between the offset asked for (0 without a cursor) and ``start`` that are
    not kept (the daemons keep a job's newest ``[agent] log_keep_bytes``)."""


class LogsView(BaseModel):
    """The output of each node of each attempt (after the cursor asked with, if any)."""

    logs: dict[str, str]
    """Each node's text, by its header, oldest attempt first."""
    nodes: list[NodeLogView] = []
    cursor: str = ""
    """Pass back as ``after`` to get only the output that came since."""


CursorKey = tuple[int, str, LogSource]
"""A node in a cursor: its attempt, its instance id, and where its output was read."""


def encode_cursor(offsets: Mapping[CursorKey, int]) -> str:
    """An opaque cursor for ``offsets`` (where each node's output was read up to)."""
    items = [[attempt, iid, str(source), end] for (attempt, iid, source), end in offsets.items()]
    raw = json.dumps(items, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> dict[CursorKey, int]:
    """The offsets of a cursor :func:`encode_cursor` made; ValueError for anything else."""
    if not cursor:
        return {}
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        items = json.loads(raw)
    except ValueError as exc:  # binascii's, the decoder's and JSON's errors are all one
        raise ValueError("not a log cursor this daemon made") from exc
    if not isinstance(items, list):
        raise ValueError("not a log cursor this daemon made")
    return dict(_entry(item) for item in items)


def _entry(item: object) -> tuple[CursorKey, int]:
    if not (isinstance(item, list) and len(item) == 4):
        raise ValueError("not a log cursor this daemon made")
    attempt, iid, source, end = item
    if not (type(attempt) is int and isinstance(iid, str) and type(end) is int and end >= 0):
        raise ValueError("not a log cursor this daemon made")
    try:
        return (attempt, iid, LogSource(source)), end
    except ValueError as exc:
        raise ValueError("not a log cursor this daemon made") from exc
