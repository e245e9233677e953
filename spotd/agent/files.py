"""The two files the agent shares with the job, in the agent's run folder.

``notice.json`` (``SPOTD_NOTICE_FILE``): written by the agent, atomically,
before it signals the job of a preemption notice::

    {"kind": "preemption", "deadline": "2026-12-01T20:31:05+00:00", "detail": "..."}

``deadline`` is the wall-clock time the node goes (null when the provider did
not say), so the job knows whether an emergency checkpoint can still finish.

``progress.json`` (``SPOTD_PROGRESS_FILE``): written by the job (``spotd.train``
does, from global rank 0: :mod:`spotd.train.progress`; it reads the notice with
:func:`spotd.train.read_notice`), read by the agent for every heartbeat::

    {"step": 1200, "total_steps": 5000, "checkpoint": "s3://.../step-00001200", "at": "..."}
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from spotd.core.agent_wire import ProviderNotice
from spotd.files import write_atomic

log = logging.getLogger(__name__)

NOTICE_FILE = "notice.json"
PROGRESS_FILE = "progress.json"


@dataclass(frozen=True, slots=True)
class Progress:
    """What the job last said of its progress; None where it said nothing."""

    step: int | None = None
    total_steps: int | None = None
    checkpoint: str | None = None


def write_notice(run_dir: Path, notice: ProviderNotice) -> None:
    """Publish the notice for the job: to a temporary name, then renamed."""
    body = {
        "kind": notice.kind,
        "deadline": notice.deadline.isoformat() if notice.deadline else None,
        "detail": notice.detail,
    }
    write_atomic(run_dir / NOTICE_FILE, json.dumps(body).encode())


def read_progress(run_dir: Path) -> Progress:
    """The job's progress file; an absent or unreadable one says nothing."""
    try:
        data = json.loads((run_dir / PROGRESS_FILE).read_text())
    except FileNotFoundError:
        return Progress()
    except (OSError, ValueError) as exc:
        log.warning("unreadable progress file: %s", exc)
        return Progress()
    if not isinstance(data, dict):
        return Progress()
    return Progress(
        step=_int_or_none(data.get("step")),
        total_steps=_int_or_none(data.get("total_steps")),
        checkpoint=str(data["checkpoint"]) if data.get("checkpoint") else None,
    )


def _int_or_none(value: object) -> int | None:
    # bool is an int to Python, not a step count.
    return value if isinstance(value, int) and not isinstance(value, bool) else None
