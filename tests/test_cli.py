"""The CLI's own output: messages keep their text whatever brackets it holds."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from spotd.cli import _again, app


def test_a_spec_error_keeps_the_table_name_in_brackets(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "x"\ncommand = ["true"]\n\n[resources]\ngpus = ["A100"]\n')
    result = CliRunner().invoke(app, ["submit", str(job), "--config", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert "resources.gpus_per_node: field required (table [resources] at line 4)" in (
        result.stderr
    )


def test_help_keeps_the_config_table_in_brackets() -> None:
    result = CliRunner().invoke(app, ["report", "--help"], terminal_width=120)
    assert result.exit_code == 0
    assert "[email] to" in result.stdout


def test_the_next_command_carries_the_config_it_was_given() -> None:
    assert _again("status", "j-1", None) == "spotd status j-1"
    assert _again("status", "j-1", Path("/etc/my spotd.toml")) == (
        "spotd status j-1 --config '/etc/my spotd.toml'"
    )
