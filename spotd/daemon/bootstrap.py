"""Boot scripts that install spotd on a new VM and start the agent around the job.

One bash script serves every provider kind's carrier (``ProviderKind.boot``:
its name and size limit, in the kind's package; cloud-init runs a custom data
that starts with ``#!``). The template is rendered with autoescape off (this is
shell, not HTML) and every value passes through :func:`shlex.quote`; the only
text inserted verbatim is the operator's ``install`` line, which is a command.

Nothing secret but the agent token goes into the script, and the script writes
the token only into a root-only env file, never onto a command line. The
daemon's own token never leaves the daemon: :func:`bootstrap_for` derives the
per-attempt agent token from it and refuses a script that would contain it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from functools import cache

import jinja2

from spotd.agent.config import agent_settings, node_ids
from spotd.core.agent_wire import IMAGE
from spotd.core.agent_wire import agent_token as derive_agent_token
from spotd.core.errors import UnknownProviderKind
from spotd.core.kinds import BootCarrier
from spotd.core.values import LaunchRequest
from spotd.registry import load_kind

BootKind = str
"""The name of a provider kind whose nodes get a boot script (its ``boot`` is set)."""

DEFAULT_INSTALL = "pip install spotd"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("spotd.daemon", "templates"),
        # Shell, not HTML: HTML escaping would corrupt values; the `q` filter quotes them.
        autoescape=False,  # noqa: S701
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["q"] = shlex.quote
    return env


def render_bootstrap(
    kind: BootKind,
    request: LaunchRequest,
    *,
    daemon_url: str,
    agent_token: str,
    install: str = DEFAULT_INSTALL,
    python: str = "python3",
    registry_login: str = "",
) -> str:
    """The boot script for the nodes of ``request`` on provider ``kind``.

    A job with an image gets it pulled while the node boots, after the operator's
    ``registry_login`` line (a command, inserted as it is, like ``install``).

    ``request.tags`` must carry ``spotd-job`` and ``spotd-attempt``. ``python``
    is the interpreter the ``install`` line installed spotd for. Raises
    ValueError on an env name that is not a shell identifier, a missing tag, or
    a script over the carrier's size limit.
    """
    carrier = _carrier(kind)
    job_id, attempt = node_ids(request.tags)
    settings = agent_settings(kind, request, daemon_url=daemon_url, agent_token=agent_token)
    script = _environment().get_template("bootstrap.sh.j2").render(
        kind=kind,
        carrier=carrier.description,
        install=install,
        # The agent's settings last, so a job env cannot override them.
        env_lines=env_lines({**request.env, **settings}),
        launcher_lines=launcher_lines(request.command, request.workdir, python),
        job_id=job_id,
        attempt=attempt,
        image=request.env.get(IMAGE, ""),
        registry_login=registry_login,
    )
    if len(script.encode()) > carrier.max_bytes:
        raise ValueError(
            f"boot script is {len(script.encode())} bytes, over the {carrier.description} "
            f"limit of {carrier.max_bytes}: move large env values elsewhere"
        )
    return script


def _carrier(kind: str) -> BootCarrier:
    """The boot carrier of provider kind ``kind``; ValueError when it has none."""
    try:
        carrier = load_kind(kind).boot
    except UnknownProviderKind:
        carrier = None
    if carrier is None:
        raise ValueError(f"no bootstrap for provider kind {kind!r}")
    return carrier


def env_lines(env: Mapping[str, str]) -> list[str]:
    """``export NAME=<quoted value>`` lines, for a file that bash sources."""
    lines = []
    for name, value in env.items():
        if not _NAME.match(name):
            raise ValueError(f"environment variable name {name!r} is not a shell identifier")
        lines.append(f"export {name}={shlex.quote(value)}")
    return lines


def launcher_lines(command: tuple[str, ...], workdir: str | None, python: str) -> list[str]:
    """The script the service runs: source the env file, then exec the agent."""
    if not command:
        raise ValueError("the launch request has no command")
    agent = [python, "-m", "spotd.agent", "--", *command]
    lines = [
        "#!/bin/bash",
        "set -euo pipefail",
        "umask 022",  # the boot script's 077 is for its own secrets, not the job's files
        "set -a",
        '. "${BASH_SOURCE[0]%/*}/agent.env"',
        "set +a",
    ]
    if workdir:
        lines.append(f"cd {shlex.quote(workdir)}")
    lines.append(f"exec {shlex.join(agent)}")
    return lines


def bootstrap_for(
    kind: BootKind,
    *,
    daemon_url: str,
    daemon_token: str,
    install: str = DEFAULT_INSTALL,
    python: str = "python3",
    registry_login: str = "",
) -> Callable[[LaunchRequest], str]:
    """A ``request -> script`` function for a provider adapter.

    Each script carries the agent token of its request's client token, and
    never ``daemon_token`` itself (a ValueError if the job env would leak it).
    """
    if not daemon_token:
        raise ValueError("an empty daemon token would make every agent token guessable")

    def render(request: LaunchRequest) -> str:
        inputs = [*request.env.values(), *request.command, request.workdir or "", install]
        if any(daemon_token in value for value in inputs):
            raise ValueError("the boot script would contain the daemon's token; refusing it")
        return render_bootstrap(
            kind,
            request,
            daemon_url=daemon_url,
            agent_token=derive_agent_token(daemon_token, request.client_token),
            install=install,
            python=python,
            registry_login=registry_login,
        )

    return render
