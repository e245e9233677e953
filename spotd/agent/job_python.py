"""The job's own Python: the interpreter, environment and runtime the preflight runs in.

The preflight must fail where the job would: a node whose job environment lacks
torch, or whose torch cannot see the GPUs, must not pass because the agent's own
Python happens to have them. So its workers run with the interpreter the job will
train with, in the job's environment (after its setup), in the job's working
folder, and inside the job's container image when it has one, through the same
engine invocation as the job's command (:func:`spotd.agent.container.job_argv`).

The interpreter, the first that applies:

1. ``[preflight] python`` (``SPOTD_PREFLIGHT_PYTHON``): a path, relative to the
   job's working folder, or a name looked up on the job's ``PATH``;
2. the command's own: its first word when that is a Python (``python``,
   ``python3.11``, ``/opt/venv/bin/python``), or, on the host, the Python its
   ``#!`` line names (``torchrun``, ``accelerate``, ``deepspeed`` are console
   scripts of the environment they were installed into);
3. the first ``python3`` or ``python`` on the job's ``PATH``, folder by folder,
   so a venv put first on it counts; in an image, on the image's ``PATH``, found
   by a POSIX shell inside the container.

None found is no reason to skip the check: the preflight fails with
``python-missing``.

The worker ships as a file, not as ``python -m spotd.agent.preflight_worker``:
the job's interpreter need not have spotd installed (a container image, a venv
with only the job's own packages), and where it has, that may be another version
than the agent's. :mod:`spotd.agent.preflight_worker` needs only the standard
library and torch, so :func:`write_worker` copies its source into the run folder
(which the job's container mounts at the same path) and the interpreter runs that
file: the same code whatever the job's environment holds.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from spotd.agent.container import job_argv
from spotd.core.agent_wire import IMAGE, PREFLIGHT_PYTHON

WORKER_FILE = "spotd_preflight_worker.py"
"""The worker's name in the run folder (its own subfolder, so that nothing else of the
run folder shadows a module the worker imports: the script's folder comes first on
``sys.path``)."""
_NAMES = ("python3", "python")
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
_HEAD_BYTES = 1024

FIND_PYTHON = (
    "set -f; IFS=:; for d in $PATH; do for n in python3 python; do "
    'if [ -f "$d/$n" ] && [ -x "$d/$n" ]; then exec "$d/$n" "$@"; fi; done; done; '
    'echo "no python3 or python on the PATH ($PATH)" >&2; exit 127'
)
"""POSIX shell that runs the first ``python3`` or ``python`` on its ``PATH`` with its
arguments, or exits 127 (the shell's "not found") when there is none."""


@dataclass(frozen=True, slots=True)
class JobPython:
    """How to start the job's interpreter, and how it was chosen (for people)."""

    argv: tuple[str, ...]
    source: str


@dataclass(frozen=True, slots=True)
class NoPython:
    """No interpreter could be found for the job, and where it was looked for."""

    detail: str


@dataclass(frozen=True, slots=True)
class JobRuntime:
    """Where the job's command will run: its interpreter, environment, working folder,
    and the agent's run folder (which a container mounts)."""

    python: JobPython | NoPython
    env: Mapping[str, str]
    cwd: Path | None
    run_dir: Path

    def argv(self, script: Path, name: str) -> list[str]:
        """The argv that runs ``script`` with the job's interpreter, in its image if any.

        ``name`` names the container; raises ValueError when there is no interpreter.
        """
        if isinstance(self.python, NoPython):
            raise ValueError(self.python.detail)
        command = [*self.python.argv, str(script)]
        return job_argv(command, self.env, cwd=self.cwd, run_dir=self.run_dir, name=name)


def job_runtime(
    command: Sequence[str], env: Mapping[str, str], *, cwd: Path | None, run_dir: Path
) -> JobRuntime:
    """The runtime of a job that runs ``command`` with ``env`` in ``cwd``."""
    declared = env.get(PREFLIGHT_PYTHON, "")
    if env.get(IMAGE):
        python: JobPython | NoPython = _in_image(command, declared)
    else:
        python = _on_host(command, env, cwd, declared)
    return JobRuntime(python=python, env=dict(env), cwd=cwd, run_dir=run_dir)


def is_python(program: str) -> bool:
    """Whether ``program`` (a name or a path) names a CPython interpreter."""
    return _PYTHON.fullmatch(Path(program).name) is not None


def _in_image(command: Sequence[str], declared: str) -> JobPython | NoPython:
    # The image's files are not the host's: no path can be checked from here.
    if declared:
        return JobPython((declared,), "[preflight] python")
    if command and is_python(command[0]):
        return JobPython((command[0],), "the command's interpreter")
    return JobPython(("sh", "-c", FIND_PYTHON, "sh"), "the first on the image's PATH")


def _on_host(
    command: Sequence[str], env: Mapping[str, str], cwd: Path | None, declared: str
) -> JobPython | NoPython:
    path = env.get("PATH", os.defpath)
    if declared:
        found = _find(declared, path, cwd)
        if found is None:
            return NoPython(f"[preflight] python {declared!r} not found (PATH={path})")
        return JobPython((found,), "[preflight] python")
    if command:
        own = _commands_python(command[0], path, cwd)
        if isinstance(own, (JobPython, NoPython)):
            return own
    for folder in path.split(os.pathsep):
        for name in _NAMES:
            candidate = Path(folder) / name
            if folder and _executable(candidate):
                return JobPython((str(candidate),), "the first on the job's PATH")
    return NoPython(f"no python3 or python on the job's PATH ({path})")


def _commands_python(program: str, path: str, cwd: Path | None) -> JobPython | NoPython | None:
    """The command's interpreter: itself, or its ``#!`` line's; None when it names none."""
    found = _find(program, path, cwd)
    if is_python(program):
        if found is None:
            return NoPython(f"the command's interpreter {program!r} not found (PATH={path})")
        return JobPython((found,), "the command's interpreter")
    if found is None:
        return None
    named = _shebang_python(Path(found), path)
    if named is None:
        return None
    return JobPython((named,), f"the interpreter of {Path(found).name}")


def _find(program: str, path: str, cwd: Path | None) -> str | None:
    if "/" not in program:
        return shutil.which(program, path=path)
    candidate = Path(program)
    if not candidate.is_absolute():
        # Relative to where the job's command starts, as the command's own would be.
        candidate = (cwd or Path.cwd()) / candidate
    return str(candidate) if _executable(candidate) else None


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _shebang_python(script: Path, path: str) -> str | None:
    """The Python a script's ``#!`` line runs, where it runs one.

    Knows ``#!/usr/bin/env python3`` and pip's form for long paths (``#!/bin/sh``
    followed by ``'''exec' /long/path/python "$0" "$@"``).
    """
    try:
        with script.open("rb") as stream:
            head = stream.read(_HEAD_BYTES).decode(errors="replace")
    except OSError:
        return None
    if not head.startswith("#!"):
        return None
    lines = head[2:].splitlines()
    words = lines[0].split() if lines else []
    if not words:
        return None
    program = words[0]
    if Path(program).name == "env":
        named = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        program = (shutil.which(named[0], path=path) or "") if named else ""
    elif Path(program).name == "sh" and len(lines) > 1 and lines[1].startswith("'''exec' "):
        program = lines[1].split()[1]
    return program if program and is_python(program) else None


def write_worker(run_dir: Path) -> Path:
    """Copy the preflight worker's source into ``run_dir``; the file's path."""
    folder = run_dir / "preflight"
    folder.mkdir(parents=True, exist_ok=True)
    source = resources.files("spotd.agent").joinpath("preflight_worker.py").read_text()
    script = folder / WORKER_FILE
    script.write_text(source)
    return script
