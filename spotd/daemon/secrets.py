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
import typing
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


def secret_variables(model: type[BaseModel], environ: Mapping[str, str]) -> list[str]:
    """The variables of ``environ`` that hold a secret of the settings ``model`` (read
    from ``SPOTD_*`` as :class:`~spotd.daemon.config.Settings` reads them): every
    ``SPOTD_SECRET_*``, a secret field's own variable, one holding a table or
    collection that contains a secret (as JSON), and anything under such a
    collection (``SPOTD_WEBHOOKS__<NAME>__URL``)."""
    tails = ["__".join(path).upper() for path in _secret_paths(model, ())]
    found = []
    for name in environ:
        key = name.upper()
        if key.startswith(ENV_PREFIX) and len(key) > len(ENV_PREFIX):
            found.append(name)
            continue
        rest = key.removeprefix("SPOTD_")
        if rest != key and any(_covers(rest, tail) for tail in tails):
            found.append(name)
    return sorted(found)


def _covers(variable: str, secret: str) -> bool:
    """Whether the settings variable ``variable`` (less its prefix) holds ``secret``:
    it is the secret's, a table above it, or a key below it."""
    return (secret == variable or secret.startswith(variable + "__")
            or variable.startswith(secret + "__"))  # fmt: skip


def _secret_paths(model: type[BaseModel], path: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The field paths of ``model`` whose value is or contains a ``SecretStr``; a
    collection's path stands for everything under it."""
    found: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        here = (*path, name)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found += _secret_paths(annotation, here)
        elif _holds_secret(annotation, set()):
            found.append(here)
    return found


def _holds_secret(annotation: object, seen: set[type]) -> bool:
    if annotation is SecretStr:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation in seen:
            return False
        seen.add(annotation)
        return any(_holds_secret(f.annotation, seen) for f in annotation.model_fields.values())
    return any(_holds_secret(arg, seen) for arg in typing.get_args(annotation))
