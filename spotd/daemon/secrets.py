"""The secrets a daemon holds for jobs: ``[secrets]`` in its config, never in a job spec.

A job names the secrets it needs (``secrets = ["HF_TOKEN"]``); the daemon holds
their values, read from a TOML file of ``NAME = "value"`` lines that only the
daemon's user can read, from ``[secrets.values]``, and from the daemon's own
``SPOTD_SECRET_<NAME>`` variables (which win). The values go to a job's nodes
only: the agent asks for them over its per-attempt authenticated route when
the node starts, and puts them in the job's environment. They are kept as
``SecretStr`` so that no log line, repr or view of the settings shows one.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from spotd.core.errors import ConfigError


class SecretsSettings(BaseModel):
    """The ``[secrets]`` table."""

    model_config = ConfigDict(extra="forbid")

    file: Path | None = None
    """A TOML file of ``NAME = "value"`` lines; it must not be readable by group or others."""
    values: dict[str, SecretStr] = Field(default_factory=dict)
    """Values given in the config itself (a file's are safer: the config is often shared)."""


ENV_PREFIX = "SPOTD_SECRET_"
"""A daemon variable ``SPOTD_SECRET_<NAME>`` holds the secret ``NAME`` (case kept)."""


def load_secrets(
    settings: SecretsSettings, environ: Mapping[str, str] | None = None
) -> dict[str, SecretStr]:
    """Every secret the daemon holds, by name: the file's, the table's, then the variables'.

    Raises :class:`ConfigError` naming the file when it cannot be read, is not
    TOML of strings, or can be read by anyone but its owner.
    """
    held: dict[str, SecretStr] = {}
    if settings.file is not None:
        held.update(_read_file(settings.file))
    held.update(settings.values)
    env = os.environ if environ is None else environ
    held.update({k.removeprefix(ENV_PREFIX): SecretStr(v) for k, v in env.items()
                 if k.startswith(ENV_PREFIX) and len(k) > len(ENV_PREFIX)})  # fmt: skip
    return held


def _read_file(path: Path) -> dict[str, SecretStr]:
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(f"[secrets] file {path} can be read by others: chmod 600 it")
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"[secrets] file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        # The parser's message never quotes a value, so it is safe to show.
        raise ConfigError(f"[secrets] file {path} is not valid TOML: {exc}") from exc
    bad = [k for k, v in data.items() if not isinstance(v, str)]
    if bad:
        raise ConfigError(f"[secrets] file {path}: {', '.join(sorted(bad))} must be strings")
    return {k: SecretStr(v) for k, v in data.items()}


def missing_secrets(names: tuple[str, ...], held: Mapping[str, SecretStr]) -> list[str]:
    """The names among ``names`` the daemon holds no value for."""
    return [n for n in names if n not in held]
