"""Which interpreter the preflight's workers run with, and the worker file it runs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spotd.agent import preflight_launch, preflight_worker
from spotd.agent.job_python import (
    FIND_PYTHON,
    JobPython,
    NoPython,
    is_python,
    job_runtime,
    write_worker,
)
from spotd.core.agent_wire import PreflightFailure


def program(folder: Path, name: str, text: str = "#!/bin/sh\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def python_of(command: list[str], env: dict[str, str], cwd: Path | None = None) -> JobPython:
    found = job_runtime(command, env, cwd=cwd, run_dir=Path("/unused")).python
    assert isinstance(found, JobPython), found
    return found


def test_the_declared_python_wins_relative_to_the_working_folder(tmp_path: Path) -> None:
    venv = program(tmp_path / "code" / ".venv" / "bin", "python")
    program(tmp_path / "bin", "python3")
    env = {"PATH": str(tmp_path / "bin"), "SPOTD_PREFLIGHT_PYTHON": ".venv/bin/python"}
    found = python_of([str(tmp_path / "bin" / "python3"), "train.py"], env, tmp_path / "code")
    assert found == JobPython((str(venv),), "[preflight] python")


def test_a_declared_python_that_is_not_there_is_no_python(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "SPOTD_PREFLIGHT_PYTHON": "python3.99"}
    found = job_runtime(["python3", "x.py"], env, cwd=None, run_dir=tmp_path).python
    assert isinstance(found, NoPython)
    assert "'python3.99' not found" in found.detail


def test_the_commands_own_python_is_the_jobs(tmp_path: Path) -> None:
    first = program(tmp_path / "first", "python3")
    later = program(tmp_path / "later", "python3.11")
    env = {"PATH": f"{tmp_path / 'first'}:{tmp_path / 'later'}"}
    assert python_of(["python3.11", "train.py"], env).argv == (str(later),)
    assert python_of([str(first), "train.py"], env).source == "the command's interpreter"


def test_a_console_script_runs_the_python_of_its_shebang(tmp_path: Path) -> None:
    venv = program(tmp_path / "venv" / "bin", "python3")
    program(tmp_path / "venv" / "bin", "torchrun", f"#!{venv}\nimport sys\n")
    program(tmp_path / "other", "python3")
    env = {"PATH": f"{tmp_path / 'other'}:{tmp_path / 'venv' / 'bin'}"}
    found = python_of(["torchrun", "--nproc-per-node", "8", "train.py"], env)
    assert found == JobPython((str(venv),), "the interpreter of torchrun")


def test_env_and_pips_long_path_shebangs_are_read(tmp_path: Path) -> None:
    venv = program(tmp_path / "venv", "python3")
    program(tmp_path / "bin", "accelerate", "#!/usr/bin/env -S python3 -u\n")
    long = "#!/bin/sh\n'''exec' " + str(venv) + ' "$0" "$@"\n' + "' '''\n"
    program(tmp_path / "bin", "deepspeed", long)
    env = {"PATH": f"{tmp_path / 'venv'}:{tmp_path / 'bin'}"}
    assert python_of(["accelerate", "launch"], env).argv == (str(venv),)
    assert python_of(["deepspeed", "train.py"], env).argv == (str(venv),)


def test_otherwise_the_first_python_on_the_jobs_path_folder_by_folder(tmp_path: Path) -> None:
    # The venv has only `python`; a later folder has python3: the venv's counts.
    venv = program(tmp_path / "venv" / "bin", "python")
    program(tmp_path / "usr" / "bin", "python3")
    program(tmp_path / "usr" / "bin", "run.sh", "#!/bin/bash\necho hi\n")
    (tmp_path / "empty").mkdir()
    env = {"PATH": f"{tmp_path / 'empty'}:{tmp_path / 'venv' / 'bin'}:{tmp_path / 'usr' / 'bin'}"}
    found = python_of(["run.sh"], env)
    assert found == JobPython((str(venv),), "the first on the job's PATH")


def test_no_python_anywhere_is_no_python(tmp_path: Path) -> None:
    found = job_runtime(["run.sh"], {"PATH": str(tmp_path)}, cwd=None, run_dir=tmp_path).python
    assert isinstance(found, NoPython)
    assert found.detail == f"no python3 or python on the job's PATH ({tmp_path})"


@pytest.mark.parametrize(
    ("command", "declared", "argv"),
    [
        (["python", "train.py"], "", ("python",)),
        (["/opt/conda/bin/python3.10", "t.py"], "", ("/opt/conda/bin/python3.10",)),
        (["torchrun", "t.py"], "/opt/venv/bin/python", ("/opt/venv/bin/python",)),
        (["torchrun", "t.py"], "", ("sh", "-c", FIND_PYTHON, "sh")),
    ],
)
def test_in_an_image_the_python_is_found_inside_it(
    command: list[str], declared: str, argv: tuple[str, ...]
) -> None:
    env = {"SPOTD_IMAGE": "trainer:1", "PATH": "/host/bin"}
    if declared:
        env["SPOTD_PREFLIGHT_PYTHON"] = declared
    assert python_of(command, env).argv == argv


def test_the_find_python_shell_runs_the_first_on_its_path(tmp_path: Path) -> None:
    program(tmp_path / "a", "python", '#!/bin/sh\necho "a $*"\n')
    program(tmp_path / "b", "python3", '#!/bin/sh\necho "b $*"\n')
    env = {"PATH": f"{tmp_path / 'nothing'}:{tmp_path / 'a'}:{tmp_path / 'b'}"}
    ran = subprocess.run(["/bin/sh", "-c", FIND_PYTHON, "sh", "w.py"], env=env,
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert (ran.returncode, ran.stdout) == (0, "a w.py\n")
    none = subprocess.run(["/bin/sh", "-c", FIND_PYTHON, "sh", "w.py"],
                          env={"PATH": str(tmp_path / "nothing")}, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert none.returncode == 127 and "no python3 or python on the PATH" in none.stderr


@pytest.mark.parametrize(
    ("name", "yes"),
    [("python", True), ("python3", True), ("/x/python3.12", True), ("pythonw", False),
     ("ipython", False), ("torchrun", False), ("python3-config", False)],
)  # fmt: skip
def test_is_python(name: str, yes: bool) -> None:
    assert is_python(name) is yes


def test_the_worker_file_is_the_module_and_needs_no_spotd(tmp_path: Path) -> None:
    script = write_worker(tmp_path)
    assert script.parent == tmp_path / "preflight"
    assert script.read_text() == Path(preflight_worker.__file__).read_text()
    # Standalone: run isolated (-I) and without site-packages (-S), so neither spotd nor
    # pydantic nor torch can be imported; it still answers, with the reason.
    ran = subprocess.run([sys.executable, "-I", "-S", str(script)], env={"RANK": "0"},
                         capture_output=True, text=True, check=False, timeout=30)  # fmt: skip
    assert ran.returncode == preflight_worker.EXIT_FAILED, ran.stderr
    assert '"reason": "other"' in ran.stdout and "SPOTD_PREFLIGHT_SPEC" in ran.stdout


def test_the_workers_reasons_are_the_wires() -> None:
    wire = {f.value for f in PreflightFailure}
    assert set(preflight_worker.REASONS) <= wire
    assert set(preflight_launch.STEP_OF) == set(preflight_worker.REASONS)


def python_3_8() -> str | None:
    """A Python 3.8 that runs, if this machine has one (on its PATH or under pyenv)."""
    candidates = [shutil.which("python3.8"),
                  *map(str, sorted(Path.home().glob(".pyenv/versions/3.8*/bin/python3.8")))]
    for candidate in filter(None, candidates):
        ran = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, check=False, timeout=30)
        if ran.stdout.strip() == "(3, 8)":
            return candidate
    return None


def test_the_worker_reads_on_python_3_8() -> None:
    old = python_3_8()
    if old is None:
        pytest.skip("no Python 3.8 on this machine to run the worker with")
    ran = subprocess.run([old, "-I", "-S", preflight_worker.__file__], env={},
                         capture_output=True, text=True, check=False, timeout=30)  # fmt: skip
    assert ran.returncode == preflight_worker.EXIT_FAILED, ran.stderr
    assert '"python_version": "3.8' in ran.stdout
