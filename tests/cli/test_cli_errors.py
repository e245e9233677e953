"""spotd.cli.errors: the same exit code for the same kind of error, whatever the command.

2 for what was given wrong (an argument, a job file, the configuration, a scenario),
1 for what failed (no daemon answered), each with one ``error:`` line and no traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotd.cli.app import app
from spotd.core.exit_codes import ExitCode


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """Configurations and job files, good and bad, by name."""
    good = tmp_path / "spotd.toml"
    good.write_text(f'data_dir = "{tmp_path / "state"}"\n[providers.sim]\nspeed = 60\n')
    syntax = tmp_path / "syntax.toml"
    syntax.write_text(f'data_dir = "{tmp_path / "state"}"\n[daemon]\nport = = 1\n')
    typo = tmp_path / "typo.toml"
    typo.write_text(f'data_dir = "{tmp_path / "state"}"\n[daemon]\nprot = 1\n')
    job = tmp_path / "job.toml"
    job.write_text('name = "x"\ncommand = ["true"]\n[resources]\ngpus = ["A100"]\ngpu = 1\n')
    return {"good": str(good), "syntax": str(syntax), "typo": str(typo), "job": str(job),
            "missing": str(tmp_path / "missing.toml")}  # fmt: skip


BAD_INPUT = [
    ["status", "-c", "{syntax}"],
    ["status", "-c", "{typo}"],
    ["status", "-c", "{missing}"],
    ["dashboard", "-c", "{typo}"],
    ["status", "--limit", "0", "-c", "{good}"],
    ["status", "--no-such-flag"],
    ["submit", "{job}", "-c", "{good}"],
    ["submit", "{missing}", "-c", "{good}"],
    ["report", "--since", "7x", "-c", "{good}"],
    ["report", "--format", "pdf", "-c", "{good}"],
    ["report", "--json", "--format", "csv", "-c", "{good}"],
    ["check-cloud", "--provider", "nosuch", "-c", "{good}"],
    ["simulate"],
    ["simulate", "--scenario", "{missing}"],
]
FAILED = [
    ["status", "-c", "{good}"],
    ["events", "j-1", "-c", "{good}"],
    ["cancel", "j-1", "-c", "{good}"],
    ["priority", "j-1", "5", "-c", "{good}"],
]


def _run(args: list[str], files: dict[str, str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, [a.format(**files) for a in args], terminal_width=200)
    assert "Traceback" not in result.output
    return result.exit_code, result.stderr


@pytest.mark.parametrize("args", BAD_INPUT, ids=" ".join)
def test_bad_input_exits_2(args: list[str], files: dict[str, str]) -> None:
    code, said = _run(args, files)
    assert code == ExitCode.BAD_INPUT, said
    assert "error:" in said or "Error" in said, said


@pytest.mark.parametrize("args", FAILED, ids=" ".join)
def test_a_failure_exits_1(args: list[str], files: dict[str, str]) -> None:
    code, said = _run(args, files)
    assert code == ExitCode.FAILED, said
    assert said.startswith("error: ") and "spotd daemon" in said, said
