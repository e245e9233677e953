"""Before the gang: the node gets the job's code, its secrets, and runs its setup.

1. The code: the archive ``SPOTD_CODE_URI`` names is fetched, checked against
   ``SPOTD_CODE_SHA256`` and unpacked into the run folder (``code/``), where the
   job's command then starts. A node that has it already (a restarted agent)
   fetches nothing.
2. The secrets ``SPOTD_SECRETS`` names: asked of the daemon over the agent's
   own authenticated route, put in the job's environment only, never logged.
3. The setup lines of ``SPOTD_SETUP``, one ``bash -c`` each, in order, in the
   code folder, with the job's environment; their output goes to the node's
   (:mod:`spotd.agent.output`, so to ``spotd logs``), and the last of it into
   the exit report when one fails.

Any failure here ends the node in phase ``setup``: the daemon ends the attempt
as ``setup-failed`` and places the job again within its ``retry.setup_failures``.
"""

from __future__ import annotations

import collections
import json
import logging
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from spotd.core.agent_wire import CODE_SHA256, CODE_URI, MAX_EXIT_DETAIL, SECRETS, SETUP, Secrets
from spotd.core.spec import CodeRef
from spotd.ship.pack import WorkdirError
from spotd.ship.store import fetch

log = logging.getLogger(__name__)

EXIT_SETUP_FAILED = 78
"""The agent's exit when the node could not be prepared (EX_CONFIG), unless a setup
command gave its own code."""
TAIL_LINES = 40
"""Lines of a failed setup command's output kept for the exit report."""

AskSecrets = Callable[[], Secrets]
"""Asks the daemon for the job's secrets (raises ReportFailed or ReportRejected)."""
Write = Callable[[bytes], None]
"""Where the setup lines' output goes: the node's output, or the agent's stdout."""


def to_own_stdout(data: bytes) -> None:
    """``data`` to the agent's stdout (a node with no output file: no daemon)."""
    sys.stdout.write(data.decode(errors="replace"))
    sys.stdout.flush()


@dataclass(frozen=True, slots=True)
class NodeReady:
    """The node prepared: the job's environment and where its command starts."""

    env: dict[str, str]
    cwd: Path | None
    """The unpacked code folder; None when the job ships no code."""


@dataclass(frozen=True, slots=True)
class NodeFailed:
    """The node could not be prepared: the exit code and what went wrong."""

    exit_code: int
    detail: str


def prepare_node(
    env: Mapping[str, str],
    run_dir: Path,
    ask_secrets: AskSecrets | None,
    write: Write = to_own_stdout,
) -> NodeReady | NodeFailed:
    """Fetch the code, add the secrets, run the setup (its output to ``write``): ready,
    or why not."""
    job_env = dict(env)
    try:
        cwd = _code(job_env, run_dir)
    except WorkdirError as exc:
        return NodeFailed(EXIT_SETUP_FAILED, f"code: {exc}")
    failed = _secrets(job_env, ask_secrets)
    if failed is not None:
        return failed
    for line in _setup_lines(job_env):
        failed = _run_setup(line, job_env, cwd, write)
        if failed is not None:
            return failed
    return NodeReady(job_env, cwd)


def _code(env: Mapping[str, str], run_dir: Path) -> Path | None:
    uri, sha = env.get(CODE_URI), env.get(CODE_SHA256)
    if not uri or not sha:
        return None
    ref = CodeRef(uri=uri, sha256=sha, size_bytes=0, files=0)
    where = fetch(ref, run_dir / "code")
    log.info("code %s unpacked into %s", sha[:12], where)
    return where


def _secrets(env: dict[str, str], ask: AskSecrets | None) -> NodeFailed | None:
    names = [n for n in env.get(SECRETS, "").split(",") if n]
    if not names:
        return None
    if ask is None:
        return NodeFailed(EXIT_SETUP_FAILED, "secrets: no daemon to ask for "
                          f"{', '.join(names)} (SPOTD_AGENT_DAEMON_URL is unset)")  # fmt: skip
    from spotd.agent.reporter import ReportFailed, ReportRejected

    try:
        got = ask()
    except (ReportFailed, ReportRejected) as exc:
        return NodeFailed(EXIT_SETUP_FAILED, f"secrets: the daemon did not give them: {exc}")
    if got.missing:
        return NodeFailed(EXIT_SETUP_FAILED, "secrets: the daemon holds no value for "
                          f"{', '.join(got.missing)}")  # fmt: skip
    env.update(got.values)
    log.info("secrets %s in the job's environment", ", ".join(sorted(got.values)))
    return None


def _setup_lines(env: Mapping[str, str]) -> list[str]:
    raw = env.get(SETUP)
    if not raw:
        return []
    lines = json.loads(raw)
    return [str(line) for line in lines]


def _run_setup(
    line: str, env: Mapping[str, str], cwd: Path | None, write: Write
) -> NodeFailed | None:
    """Run one setup line, its output streamed to ``write``; a failure with its output's
    tail."""
    log.info("setup: %s", line)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    try:
        proc = subprocess.Popen(["bash", "-c", line], env=dict(env), cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)  # fmt: skip
    except OSError as exc:
        return NodeFailed(EXIT_SETUP_FAILED, f"setup `{line}` could not start: {exc}")
    assert proc.stdout is not None
    for raw in proc.stdout:
        write(raw)
        tail.append(raw.decode(errors="replace").rstrip("\n"))
    code = proc.wait()
    if code == 0:
        return None
    detail = f"`{line}` exited with {code}"
    if tail:
        detail += "; its last output:\n" + "\n".join(tail)
    return NodeFailed(code if 0 < code < 256 else EXIT_SETUP_FAILED, detail[-MAX_EXIT_DETAIL:])
