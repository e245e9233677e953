"""How a job's command runs inside its container image on a node.

Pure: the agent calls :func:`container_argv` once it knows the job's final
environment, with what the node has (a container engine, GPUs, fabric
devices). The container shares the node's network and IPC namespaces (NCCL,
the fabric and the rendezvous need the host's), sees the node's GPUs and the
fabric's devices, and mounts the job's working directory, its checkpoint
folder when that is a local path, and the agent's run folder (notice and
progress files, hostfile) at the same paths. ``--init`` makes a small init
process PID 1, so the SIGTERM of a preemption notice reaches the job's
processes at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from spotd.core.network import Fabric

FABRIC_DEVICES: dict[Fabric, tuple[str, ...]] = {
    Fabric.INFINIBAND: ("/dev/infiniband",),
    Fabric.ROCE: ("/dev/infiniband",),
    # EFA is driven through the same verbs devices (libfabric's efa provider).
    Fabric.EFA: ("/dev/infiniband",),
}
"""Device folders a job on each fabric needs in its container; TCPX/TCPXO and
Ethernet need only the host's network namespace."""

CONTAINER_WORKDIR = "/workdir"
"""Where the job's shipped working directory is mounted inside the container."""


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    """Everything but the environment that decides how the container is started."""

    engine: str
    """``docker`` or ``podman`` (the program on the node)."""
    image: str
    devices: tuple[str, ...] = ()
    """Device paths present on the node to pass in."""
    mounts: tuple[str, ...] = ()
    """Host paths mounted at the same path inside."""
    workdir: str | None = None
    """Host folder mounted at :data:`CONTAINER_WORKDIR`, where the command starts."""
    gpus: bool = False
    """Whether the node has NVIDIA GPUs to pass in."""
    name: str | None = None


def devices_for(fabric: Fabric) -> tuple[str, ...]:
    """The device folders a job on ``fabric`` needs inside its container."""
    return FABRIC_DEVICES.get(fabric, ())


def container_argv(plan: ContainerPlan, command: Sequence[str], env: Iterable[str]) -> list[str]:
    """The argv that runs ``command`` in ``plan``'s container with the variables ``env``.

    Variables are passed by name only (``-e NAME``): the engine takes each value
    from its own environment, so none appears on a command line.
    """
    argv = [plan.engine, "run", "--rm", "--init", "--network=host", "--ipc=host"]
    if plan.devices:
        # RDMA registers memory: locked pages must not be capped where it is used.
        argv.append("--ulimit=memlock=-1:-1")
    if plan.name:
        argv.append(f"--name={plan.name}")
    if plan.gpus:
        # Docker's NVIDIA runtime flag; podman reaches the GPUs through CDI.
        docker = plan.engine.endswith("docker")
        argv.append("--gpus=all" if docker else "--device=nvidia.com/gpu=all")
    argv += [f"--device={d}" for d in plan.devices]
    argv += [f"--volume={m}:{m}" for m in dict.fromkeys(plan.mounts)]
    if plan.workdir:
        argv += [f"--volume={plan.workdir}:{CONTAINER_WORKDIR}", f"--workdir={CONTAINER_WORKDIR}"]
    argv += [f"--env={name}" for name in sorted(set(env))]
    return [*argv, plan.image, *command]
