"""The CLI's own output: messages keep their text whatever brackets it holds."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from typer.testing import CliRunner

from spotd.cli import _again, app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


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


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "spotd.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "state"}"\n'
        "[providers.sim]\nspeed = 60\nepoch = 2031-01-01T00:00:00Z\n"
    )
    return config


def test_report_windows_end_on_the_simulated_clock(tmp_path: Path) -> None:
    config = _config(tmp_path)
    # The market's clock starts with the first command that builds it, as the daemon's does.
    assert CliRunner().invoke(app, ["plan", str(EXAMPLES / "job.toml"), "-c", str(config)],
                              terminal_width=120).exit_code == 0  # fmt: skip
    result = CliRunner().invoke(app, ["report", "--format", "json", "--since", "1d",
                                      "-c", str(config)])  # fmt: skip
    assert result.exit_code == 0, result.output
    until = datetime.fromisoformat(json.loads(result.stdout)["period"]["until"])
    assert datetime(2031, 1, 1, tzinfo=UTC) <= until < datetime(2031, 1, 2, tzinfo=UTC)


def test_plan_shows_the_usable_offerings_and_counts_the_rest_by_reason(tmp_path: Path) -> None:
    config = _config(tmp_path)
    args = ["plan", str(EXAMPLES / "job.toml"), "-c", str(config), "--top", "3"]
    result = CliRunner().invoke(app, args, terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("OFFERING"))
    assert lines[head].split() == ["OFFERING", "FABRIC", "MARKET", "USD/H", "EFF", "LOSS", "H",
                                   "EXPECTED"]  # fmt: skip
    rows = lines[head + 1 : head + 4]
    assert all(row.startswith("sim-") and len(row) <= 80 for row in rows), "3 rows in 80 columns"
    summary = next(i for i, line in enumerate(lines) if "candidates excluded" in line)
    counted = lines[summary + 1 :]
    assert "8 GPUs per node, job needs 1" in counted[0]  # the commonest reason first
    every = CliRunner().invoke(app, [*args, "--excluded"], terminal_width=200)
    assert "EXCLUDED BECAUSE" in every.stdout
    assert every.stdout.count("8 GPUs per node, job needs 1") == int(counted[0].split()[0])
