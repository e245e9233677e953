"""The kernel's OOM kills in the agent's cgroup: the evidence that a job ran out of memory.

The job runs in the agent's own cgroup (its own process group, no cgroup of its
own), so the cgroup's ``oom_kill`` count rising while the job ran says the
kernel's OOM killer killed a process of the job. The agent reads the count before
it starts the job and after the job ends (:func:`oom_kill_count`); the difference
goes with its exit report. Where the machine does not say (no memory controller
to read, a job in a container's cgroup of its own), nothing is claimed: a SIGKILL
alone is said as the signal it is.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def oom_kill_count(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The ``oom_kill`` count of this process's memory cgroup (cgroup v2's
    ``memory.events``, else v1's ``memory.oom_control``); None where it cannot be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        relative = path.lstrip("/")
        if hierarchy == "0" and not controllers:
            found = _count(root / relative / "memory.events")
        elif "memory" in controllers.split(","):
            found = _count(root / "memory" / relative / "memory.oom_control")
        else:
            continue
        if found is not None:
            return found
    return None


def _count(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value) if value.strip().isdigit() else None
    return None


def kills_between(before: int | None, after: int | None) -> int | None:
    """OOM kills between two counts; None when either could not be read."""
    if before is None or after is None:
        return None
    return max(0, after - before)
