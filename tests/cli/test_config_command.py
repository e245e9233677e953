"""``spotd config check``: the settings in force and their sources, or the problems
with exit code 2."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from spotd.cli.app import app
from spotd.cli.commands.config import settings_table
from spotd.cli.render.console import use_zone
from spotd.daemon.config_check import check_config


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No SPOTD_* variable or config file of the machine; times back in UTC after."""
    for name in list(os.environ):
        if name.upper().startswith("SPOTD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    yield
    use_zone(UTC)


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spotd.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n{text}')
    return path


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["config", "check", *args], env=env, terminal_width=200)
    return result.exit_code, result.stdout, result.stderr


def rows_of(stdout: str) -> dict[str, dict[str, object]]:
    return {r["key"]: r for r in json.loads(stdout)}


def test_json_lists_each_setting_with_its_source(tmp_path: Path) -> None:
    cfg = config_file(tmp_path, "[daemon]\nport = 9100\n")

    code, stdout, stderr = run("--config", str(cfg), "--json",
                               env={"SPOTD_DAEMON__TICK_SECONDS": "5"})  # fmt: skip

    assert (code, stderr) == (0, "")
    rows = rows_of(stdout)
    assert rows["daemon.port"] == {"key": "daemon.port", "value": 9100, "source": "file",
                                   "origin": str(cfg), "line": 3}  # fmt: skip
    assert rows["daemon.tick_seconds"]["source"] == "env"
    assert rows["daemon.tick_seconds"]["origin"] == "SPOTD_DAEMON__TICK_SECONDS"
    assert rows["daemon.host"] == {"key": "daemon.host", "value": "127.0.0.1",
                                   "source": "default", "origin": None, "line": None}  # fmt: skip


def test_the_table_shows_values_sources_and_masks(tmp_path: Path) -> None:
    cfg = config_file(
        tmp_path,
        '[email]\npassword = "hunter2"\n[display]\ntimezone = "Europe/Berlin"\n'
        "[providers.sim]\nepoch = 2031-01-01T00:00:00Z\n",
    )
    code, stdout, _ = run("-c", str(cfg))
    assert code == 0 and "hunter2" not in stdout and "****" in stdout

    shown = StringIO()
    Console(file=shown, width=250).print(settings_table(check_config(cfg)))

    lines = {line.split()[0]: line.split()[1:] for line in shown.getvalue().splitlines()[2:]}
    assert lines["email.password"] == ["****", "file", f"{cfg}:3"]
    assert lines["daemon.port"] == ["8470", "default"]
    assert lines["email.host"] == ["none", "default"]
    # A time in the [display] zone of the config checked.
    assert lines["providers.sim.epoch"] == ["2031-01-01", "01:00:00+01:00", "file", f"{cfg}:7"]
    assert shown.getvalue().splitlines()[0].strip() == f"settings from {cfg}"


def test_an_unknown_key_in_the_file_exits_2_with_a_suggestion(tmp_path: Path) -> None:
    cfg = config_file(tmp_path, "[daemon]\nprot = 9100\n")

    code, stdout, stderr = run("-c", str(cfg))

    assert (code, stdout) == (2, "")
    assert f"error: invalid configuration ({cfg})" in stderr
    assert f"{cfg}: daemon.prot (line 3): unknown key; did you mean `daemon.port`?" in stderr


def test_an_unknown_variable_under_a_table_exits_2_with_a_suggestion(tmp_path: Path) -> None:
    code, _, stderr = run("--json", env={"SPOTD_DAEMON__PROT": "9100"})

    assert code == 2
    assert "environment variable SPOTD_DAEMON__PROT: daemon.prot: unknown key" in stderr
    assert "did you mean SPOTD_DAEMON__PORT (`daemon.port`)?" in stderr


def test_a_variable_the_daemon_ignores_is_a_warning(tmp_path: Path) -> None:
    code, stdout, stderr = run("--json", env={"SPOTD_DEAMON__PORT": "9100"})

    assert code == 0, "the configuration is valid: the daemon runs, on the default port"
    assert rows_of(stdout)["daemon.port"]["value"] == 8470
    assert stderr.strip() == (
        "warning: SPOTD_DEAMON__PORT names no setting, so the daemon ignores it; "
        "did you mean SPOTD_DAEMON__PORT (`daemon.port`)?"
    )


def test_a_bad_value_names_the_file_and_the_key(tmp_path: Path) -> None:
    cfg = config_file(tmp_path, "[daemon]\nport = 70000\n")

    code, _, stderr = run("-c", str(cfg))

    assert code == 2
    assert f"{cfg}: daemon.port (line 3): Input should be less than or equal to 65535" in stderr


@pytest.mark.parametrize("text", [None, "[daemon\n"], ids=["missing", "not-toml"])
def test_a_file_missing_or_not_toml_exits_2(tmp_path: Path, text: str | None) -> None:
    cfg = tmp_path / "spotd.toml"
    if text is not None:
        cfg.write_text(text)

    code, stdout, stderr = run("-c", str(cfg))

    assert (code, stdout) == (2, "")
    assert stderr.startswith(f"error: {cfg}: ")


def test_the_config_group_lists_check() -> None:
    result = CliRunner().invoke(app, ["config", "--help"], terminal_width=120)
    assert result.exit_code == 0
    assert "check" in result.stdout


def test_a_fast_simulated_clock_beside_a_cloud_is_refused_as_at_start(tmp_path: Path) -> None:
    config = tmp_path / "spotd.toml"
    config.write_text(f'data_dir = "{tmp_path}"\n[providers.sim]\nspeed = 60.0\n'
                      '[providers.aws]\nenabled = true\nregions = ["us-east-1"]\n')  # fmt: skip
    result = CliRunner().invoke(app, ["config", "check", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert "speed 60 cannot share a daemon with real clouds (aws)" in result.output
