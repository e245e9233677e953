"""What the nodes are told of the job's code, setup, secrets and image.

Variables only, no values that are secret: the code's archive and digest, the
setup lines, the names of the secrets (the agent fetches their values from the
daemon over its authenticated API), the image and what the container needs of
the node (the fabric's devices, a local checkpoint folder). The agent on the
node acts on them before it starts the job (docs/agent.md).
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from spotd.core.agent_wire import (
    CODE_SHA256,
    CODE_URI,
    CONTAINER_DEVICES,
    CONTAINER_MOUNTS,
    IMAGE,
    SECRETS,
    SETUP,
)
from spotd.core.container import devices_for
from spotd.core.spec import JobSpec
from spotd.core.values import Offering


def shipping_environment(spec: JobSpec, offering: Offering, checkpoint_uri: str) -> dict[str, str]:
    """The variables that ship ``spec``'s code, setup, secrets and image to its nodes."""
    env: dict[str, str] = {}
    if spec.code is not None:
        env[CODE_URI] = spec.code.uri
        env[CODE_SHA256] = spec.code.sha256
    if spec.setup:
        env[SETUP] = json.dumps(list(spec.setup))
    if spec.secrets:
        env[SECRETS] = ",".join(spec.secrets)
    if spec.image is not None:
        env[IMAGE] = spec.image
        env[CONTAINER_DEVICES] = ",".join(devices_for(offering.interconnect.fabric))
        local = local_path(checkpoint_uri)
        env[CONTAINER_MOUNTS] = local or ""
    return env


def local_path(uri: str) -> str | None:
    """The folder of a checkpoint URI that is a path on the node, None for a remote one."""
    if "::" in uri:
        return None
    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        return parts.path if parts.scheme else uri
    return None
