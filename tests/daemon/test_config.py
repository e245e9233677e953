"""Configuration: file, environment and their precedence; clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotd.core.errors import ConfigError
from spotd.daemon.config import find_config_file, load_settings


def test_defaults_need_no_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPOTD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    settings = load_settings()
    assert settings.daemon.host == "127.0.0.1"
    assert settings.db_url.startswith("sqlite:///")
    assert settings.providers.sim.enabled


def test_file_then_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "spotd.toml"
    cfg.write_text(
        f'data_dir = "{tmp_path}"\n[daemon]\nport = 9100\ntick_seconds = 3\n'
        "[providers.sim]\nseed = 42\n"
    )
    settings = load_settings(cfg)
    assert settings.daemon.port == 9100 and settings.providers.sim.seed == 42
    assert settings.db_url == f"sqlite:///{tmp_path / 'spotd.db'}"
    monkeypatch.setenv("SPOTD_DAEMON__PORT", "9200")
    monkeypatch.setenv("SPOTD_DATABASE_URL", "postgresql+psycopg://u@h/db")
    settings = load_settings(cfg)
    assert settings.daemon.port == 9200, "the environment beats the file"
    assert settings.daemon.tick_seconds == 3, "the rest of the table still comes from the file"
    assert settings.db_url == "postgresql+psycopg://u@h/db"


def test_config_found_through_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "elsewhere.toml"
    cfg.write_text("[daemon]\nport = 9300\n")
    monkeypatch.setenv("SPOTD_CONFIG", str(cfg))
    assert find_config_file() == cfg
    assert load_settings().daemon.port == 9300


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[daemon]\nport = 70000\n", "daemon.port"),
        ("[daemon]\ncolour = 1\n", "daemon.colour"),
        ("[providers.sim]\nspeed = -1\n", "providers.sim.speed"),
        ("[daemon\n", "spotd.toml"),
    ],
)
def test_bad_config_names_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    cfg = tmp_path / "spotd.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert str(cfg) in str(err.value) and expected in str(err.value)


def test_missing_explicit_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_settings(tmp_path / "nope.toml")


def problems_of(config: Path | None, **overrides: object) -> list[str]:
    """The problems a ConfigError lists, one per entry."""
    with pytest.raises(ConfigError) as err:
        load_settings(config, **overrides)
    return str(err.value).removeprefix("invalid configuration: ").split("; ")


def test_a_bad_environment_variable_is_named_not_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = tmp_path / "spotd.toml"
    cfg.write_text("[daemon]\nport = 9000\n[providers.sim]\nspeed = -1\n")
    monkeypatch.setenv("SPOTD_DAEMON__PORT", "abc")
    assert sorted(problems_of(cfg)) == sorted([
        "environment variable SPOTD_DAEMON__PORT: daemon.port: Input should be a valid integer,"
        " unable to parse string as an integer",
        f"{cfg}: providers.sim.speed: Input should be greater than 0",
    ])


def test_a_table_given_as_json_in_the_environment_is_not_blamed_for_the_files_value(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = tmp_path / "spotd.toml"
    cfg.write_text("[providers.sim]\nspeed = -1\n")
    monkeypatch.setenv("SPOTD_PROVIDERS", '{"aws": {"enabled": false}}')
    (only,) = problems_of(cfg)
    assert only.startswith(f"{cfg}: providers.sim.speed: ")
    monkeypatch.setenv("SPOTD_PROVIDERS", '{"sim": {"seed": "x"}}')
    assert any(p.startswith("environment variable SPOTD_PROVIDERS: providers.sim.seed: ")
               for p in problems_of(cfg))  # fmt: skip
    monkeypatch.delenv("SPOTD_PROVIDERS")
    (given,) = problems_of(None, daemon={"port": -5})
    assert given.startswith("given daemon: daemon.port: ")
