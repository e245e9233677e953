"""The notice source of an agent on a simulated node: the node's status file.

A cloud tells a VM of its preemption through a metadata service; a simulated
node's VM process writes it into the node's status file instead (state
``notice`` and the wall-clock time it will kill the job), which this watcher
reads. It has the agent's :class:`~spotd.agent.watchers.NoticeWatcher` shape.
"""

from __future__ import annotations

import logging
from pathlib import Path

from spotd.core.agent_wire import ProviderNotice
from spotd.core.values import InstanceState

from .records import VmStatus

log = logging.getLogger(__name__)


class SimNoticeWatcher:
    """Reads ``<id>.state.json``; a ``notice`` state is a preemption notice."""

    def __init__(self, state_path: str, *, poll_interval: float = 0.1) -> None:
        self._path = Path(state_path) if state_path else None
        self._interval = poll_interval

    @property
    def poll_interval(self) -> float:
        """Seconds between two reads of the status file."""
        return self._interval

    def check(self) -> ProviderNotice | None:
        """A preemption notice while the VM says one came, else None."""
        if self._path is None:
            return None
        try:
            status = VmStatus.load(self._path)
        except (OSError, KeyError, ValueError) as exc:
            log.warning("cannot read the node's status %s: %s", self._path, exc)
            return None
        if status is None or status.notice_at is None:
            return None
        if status.state not in (InstanceState.NOTICE, InstanceState.PREEMPTED):
            return None
        return ProviderNotice("preemption", status.kill_at, "simulated market reclaims the node")

    def instance_id(self) -> str | None:
        """The id is the status file's name: ``<id>.state.json``."""
        if self._path is None:
            return None
        return self._path.name.removesuffix(".state.json")

    def job_ended(self) -> None:
        """Nothing to acknowledge on the simulated market."""

    def close(self) -> None:
        """Nothing to release."""
