"""spotd.daemon.config_check: each setting's source, secrets masked, problems with the
key they most likely meant."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spotd.core.errors import ConfigError
from spotd.daemon.config import ProblemSource
from spotd.daemon.config_check import (
    MASK,
    CheckReport,
    ConfigCheckFailed,
    EffectiveSetting,
    SettingSource,
    check_config,
    is_secret_name,
    known_keys,
    masked,
    stray_variables,
    suggest,
    variable_of,
)


@pytest.fixture(autouse=True)
def _no_spotd_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No SPOTD_* variable and no config file of the machine running the tests."""
    for name in list(os.environ):
        if name.upper().startswith("SPOTD_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "spotd.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n{text}')
    return path


def row(report: CheckReport, key: str) -> EffectiveSetting:
    (found,) = [r for r in report.settings if r.key == key]
    return found


def test_each_setting_names_its_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = config_file(tmp_path, "[daemon]\nport = 9100\ntick_seconds = 3\n")
    monkeypatch.setenv("SPOTD_DAEMON__TICK_SECONDS", "5")

    report = check_config(cfg)

    assert report.file == cfg
    assert row(report, "daemon.port") == EffectiveSetting(
        "daemon.port", 9100, SettingSource.FILE, str(cfg), 3
    )
    assert row(report, "daemon.tick_seconds") == EffectiveSetting(
        "daemon.tick_seconds", 5.0, SettingSource.ENV, "SPOTD_DAEMON__TICK_SECONDS"
    ), "the environment beats the file"
    assert row(report, "daemon.host") == EffectiveSetting(
        "daemon.host", "127.0.0.1", SettingSource.DEFAULT
    )
    assert row(report, "daemon.port").where == f"file {cfg}:3"
    assert row(report, "daemon.tick_seconds").where == "env SPOTD_DAEMON__TICK_SECONDS"
    assert row(report, "daemon.host").where == "default"


def test_a_table_given_as_json_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = config_file(tmp_path, "[providers.sim]\nspeed = 2\n")
    monkeypatch.setenv("SPOTD_PROVIDERS", '{"sim": {"seed": 3}}')

    report = check_config(cfg)

    assert row(report, "providers.sim.seed").origin == "SPOTD_PROVIDERS"
    assert row(report, "providers.sim.speed").source is SettingSource.FILE, (
        "tables merge key by key"
    )


def test_no_file_leaves_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTD_DAEMON__PORT", "9300")

    report = check_config()

    assert report.file is None
    assert row(report, "daemon.port").source is SettingSource.ENV
    assert {r.source for r in report.settings} == {SettingSource.ENV, SettingSource.DEFAULT}


def test_every_model_field_is_listed_whatever_its_table(tmp_path: Path) -> None:
    keys = {r.key for r in check_config(config_file(tmp_path, "")).settings}
    # Walked from the models: a table added to them is listed with no edit of the check.
    expected = {".".join(path) for path in known_keys() if "*" not in path}
    # A key is listed itself, or by its entries (a table, a table of names that holds some).
    missing = {k for k in expected if not any(s == k or s.startswith(k + ".") for s in keys)}
    assert not missing
    assert {"teams", "webhooks"} <= keys, "an empty table of names is listed as empty"
    assert {"display.timezone", "providers.sim.speed", "email.schedules.daily"} <= keys


def test_secrets_are_masked_everywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = config_file(
        tmp_path,
        '[email]\npassword = "hunter2"\n[secrets.values]\nHF_TOKEN = "hf-abc"\n'
        '[webhooks.ops]\nurl = "https://hooks.example/T0/abc"\nsecret = "sig"\n'
        'headers = {Authorization = "Bearer q"}\n',
    )
    monkeypatch.setenv("SPOTD_DATABASE_URL", "postgresql+psycopg://spotd:pw-9@db/spotd")
    monkeypatch.setenv("SPOTD_PROVIDERS__AWS__KEY_NAME", "my-keypair")

    report = check_config(cfg)

    for key in ("email.password", "secrets.values.HF_TOKEN", "webhooks.ops.url",
                "webhooks.ops.secret", "webhooks.ops.headers.Authorization"):  # fmt: skip
        assert row(report, key).value == MASK, key
    # The name of an EC2 key pair is no secret: shown, so it can be checked.
    assert row(report, "providers.aws.key_name").value == "my-keypair"
    assert row(report, "database_url").value == f"postgresql+psycopg://spotd:{MASK}@db/spotd"
    shown = repr(report.settings)
    for secret in ("hunter2", "hf-abc", "T0/abc", "sig'", "Bearer q", "pw-9"):
        assert secret not in shown


def test_what_masking_keeps() -> None:
    assert is_secret_name("password") and is_secret_name("api_key")
    assert not is_secret_name("monkey_count") and not is_secret_name("secrets")
    assert not is_secret_name("key_name") and not is_secret_name("ssh_public_key")
    assert masked(None, secret=True) is None, "an unset secret is said to be unset"
    assert masked("https://host/path", secret=False) == "https://host/path"
    assert masked(["a:b@c"], secret=False) == ["a:b@c"]


def test_an_unknown_key_in_the_file_suggests_the_known_one(tmp_path: Path) -> None:
    cfg = config_file(tmp_path, "[daemon]\nprot = 9100\n[teams.gpu]\nmax_runing_jobs = 3\n")

    with pytest.raises(ConfigCheckFailed) as err:
        check_config(cfg)

    problems = {p.problem.key: p for p in err.value.problems}
    prot = problems["daemon.prot"]
    assert (prot.problem.source, prot.line, prot.suggestion) == (ProblemSource.FILE, 3,
                                                                 "daemon.port")  # fmt: skip
    assert prot.text == f"{cfg}: daemon.prot (line 3): unknown key; did you mean `daemon.port`?"
    assert problems["teams.gpu.max_runing_jobs"].suggestion == "teams.gpu.max_running_jobs"
    assert err.value.file == cfg


def test_an_unknown_variable_under_a_table_suggests_the_known_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPOTD_SCHEDULING__POLICYY", "balanced")

    with pytest.raises(ConfigCheckFailed) as err:
        check_config()

    (problem,) = err.value.problems
    assert problem.text == (
        "environment variable SPOTD_SCHEDULING__POLICYY: scheduling.policyy: unknown key; "
        "did you mean SPOTD_SCHEDULING__POLICY (`scheduling.policy`)?"
    )


def test_a_bad_value_names_file_key_and_line(tmp_path: Path) -> None:
    cfg = config_file(tmp_path, "[providers.sim]\nseed = 1\nspeed = -1\n")

    with pytest.raises(ConfigCheckFailed) as err:
        check_config(cfg)

    (problem,) = err.value.problems
    assert not problem.problem.unknown_key and problem.suggestion is None
    assert problem.text == (f"{cfg}: providers.sim.speed (line 4): Input should be greater than 0")


def test_a_table_of_no_installed_kind_keeps_its_message(tmp_path: Path) -> None:
    with pytest.raises(ConfigCheckFailed) as err:
        check_config(config_file(tmp_path, "[providers.awz]\nenabled = true\n"))
    (problem,) = err.value.problems
    assert "no provider kind named 'awz' is installed" in problem.text
    assert problem.text.endswith("did you mean `providers.aws`?")


def test_a_file_that_is_not_toml_or_not_there_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        check_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon\n")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        check_config(bad)


def test_stray_variables_are_found_with_a_suggestion() -> None:
    environ = {
        "SPOTD_DEAMON__PORT": "1",  # a typo of a table: the settings ignore it
        "SPOTD_DATABASEURL": "x",
        "SPOTD_DAEMON__PORT": "2",  # a setting
        "SPOTD_CONFIG": "/etc/spotd.toml",  # the file to read
        "SPOTD_SECRET_HF_TOKEN": "v",  # a secret's value
        "SPOTD_JOB_ID": "j-1",  # no setting, and nothing like one
        "HOME": "/root",
    }

    stray = {v.name: v for v in stray_variables(environ)}

    assert set(stray) == {"SPOTD_DEAMON__PORT", "SPOTD_DATABASEURL", "SPOTD_JOB_ID"}
    assert stray["SPOTD_DEAMON__PORT"].suggestion == "daemon.port"
    assert stray["SPOTD_DEAMON__PORT"].suggested_variable == "SPOTD_DAEMON__PORT"
    assert stray["SPOTD_DATABASEURL"].suggestion == "database_url"
    assert stray["SPOTD_JOB_ID"].suggestion is None


def test_stray_variables_come_with_the_report_or_the_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPOTD_DEAMON__PORT", "1")
    assert [v.name for v in check_config().stray] == ["SPOTD_DEAMON__PORT"]
    with pytest.raises(ConfigCheckFailed) as err:
        check_config(config_file(tmp_path, "[daemon]\nport = -1\n"))
    assert [v.name for v in err.value.stray] == ["SPOTD_DEAMON__PORT"]


def test_suggestions_fill_in_names_and_stay_quiet_when_nothing_is_close() -> None:
    assert suggest(("webhooks", "ops", "urll")) == "webhooks.ops.url"
    assert suggest(("providers", "gcp", "attached_gpus", "n1", "cuont")) == (
        "providers.gcp.attached_gpus.n1.count"
    )
    assert suggest(("completely", "unrelated")) is None
    assert variable_of("providers.sim.speed") == "SPOTD_PROVIDERS__SIM__SPEED"
