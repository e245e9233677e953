"""The job's argv on the node: its command, or that command inside its image.

With ``SPOTD_IMAGE`` set, the agent starts the job through the node's
container engine (``SPOTD_CONTAINER_ENGINE``, else ``docker``, else
``podman`` on the PATH), with what :mod:`spotd.core.container` describes.
Only the devices of the fabric that the node really has are passed in. The
job's variables go in by name; the host's own (``PATH``, ``HOME``...) stay
out, so the image's hold inside.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from spotd.core.agent_wire import CONTAINER_DEVICES, CONTAINER_MOUNTS, IMAGE
from spotd.core.container import ContainerPlan, container_argv

ENGINE = "SPOTD_CONTAINER_ENGINE"
HOST_ONLY = frozenset({
    "PATH", "HOME", "HOSTNAME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "SHLVL",
    "TERM", "TMPDIR", "MAIL", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH",
    "_", "INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID", ENGINE,
})  # fmt: skip
"""The node's own variables, which must not shadow the image's."""
GPU_DEVICE = Path("/dev/nvidiactl")


def job_argv(
    command: Sequence[str], env: Mapping[str, str], *, cwd: Path | None, run_dir: Path, name: str
) -> list[str]:
    """``command``, wrapped in its container when the job has an image."""
    image = env.get(IMAGE)
    if not image:
        return list(command)
    engine = env.get(ENGINE) or shutil.which("docker") or shutil.which("podman") or "docker"
    devices = tuple(d for d in _listed(env, CONTAINER_DEVICES) if Path(d).exists())
    mounts = (*_listed(env, CONTAINER_MOUNTS), str(run_dir))
    plan = ContainerPlan(engine=engine, image=image, devices=devices, mounts=mounts,
                         workdir=str(cwd) if cwd else None, gpus=GPU_DEVICE.exists(),
                         name=name)  # fmt: skip
    return container_argv(plan, command, passed_names(env))


def passed_names(env: Mapping[str, str]) -> list[str]:
    """The names of the variables the container gets: the job's, not the host's."""
    return [n for n in env
            if n not in HOST_ONLY and not n.startswith(("SPOTD_AGENT_", "LC_"))]  # fmt: skip


def _listed(env: Mapping[str, str], name: str) -> list[str]:
    return [item for item in env.get(name, "").split(",") if item]
