"""What ``spotd config check`` finds: the settings in force, each with where it came from,
or the configuration's problems, each with the key it most likely meant.

The configuration is read by :func:`~spotd.daemon.config.load_settings`, as the daemon
reads it; nothing is started and nothing leaves the machine. The rest is generic over
the settings models, so a table added to them (or a provider kind installed) is
checked and listed without an edit here.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import tzinfo
from enum import Enum
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, SecretBytes, SecretStr
from pydantic_settings import EnvSettingsSource

from spotd.core.errors import ConfigError
from spotd.core.toml_lines import KeyLines
from spotd.daemon.config import (
    ConfigProblem,
    InvalidConfig,
    ProblemSource,
    Settings,
    find_config_file,
    load_settings,
)
from spotd.daemon.secrets import ENV_PREFIX as SECRET_PREFIX

MASK = "****"
"""What a secret's value is shown as."""

PREFIX = "SPOTD_"
DELIMITER = "__"
ANY = "*"
"""A key path's segment that stands for any name (a dict's keys, a list's indexes)."""

_SECRET_WORDS = frozenset({"password", "passwd", "token", "secret", "credential",
                           "credentials"})  # fmt: skip
_NOT_SETTINGS = ("SPOTD_CONFIG",)
"""Variables the daemon reads that are no setting (the file to read)."""
_CUTOFF = 0.75
"""How alike (difflib's ratio) a known key must be to be suggested."""


class SettingSource(Enum):
    """Where an effective setting's value came from."""

    FILE = "file"
    ENV = "env"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True)
class EffectiveSetting:
    """One setting in force: its dotted key, its value (a secret's masked), its source."""

    key: str
    value: object
    """The value as the settings hold it, :data:`MASK` for a secret's."""
    source: SettingSource
    origin: str | None = None
    """The file's path or the variable's name; None for a default."""
    line: int | None = None
    """The line of the file that sets it, where it can be told."""

    @property
    def where(self) -> str:
        """``file spotd.toml:3``, ``env SPOTD_DAEMON__PORT`` or ``default``."""
        if self.source is SettingSource.DEFAULT:
            return "default"
        at = f":{self.line}" if self.line is not None else ""
        return f"{self.source.value} {self.origin}{at}"


@dataclass(frozen=True, slots=True)
class StrayVariable:
    """A ``SPOTD_*`` variable that names no setting: the daemon ignores it."""

    name: str
    suggestion: str | None
    """The dotted key it most likely meant, if any is close."""

    @property
    def suggested_variable(self) -> str | None:
        """The variable of :attr:`suggestion`."""
        return variable_of(self.suggestion) if self.suggestion else None


@dataclass(frozen=True, slots=True)
class ExplainedProblem:
    """A key that does not validate, with its line in the file and a suggestion."""

    problem: ConfigProblem
    line: int | None
    suggestion: str | None
    """For an unknown key, the known key it most likely meant."""

    @property
    def text(self) -> str:
        """The problem as one line: source, key (and line), what is wrong."""
        at = f" (line {self.line})" if self.line is not None else ""
        head = f"{self.problem.where}: {self.problem.key}{at}: {self._message()}"
        return head + self._hint()

    def _message(self) -> str:
        loc = self.problem.loc
        # A [providers.<name>] table's own message names the kinds that are installed.
        if not self.problem.unknown_key or (len(loc) == 2 and loc[0] == "providers"):
            return self.problem.message
        return "unknown key"

    def _hint(self) -> str:
        if self.suggestion is None:
            return ""
        if self.problem.source is ProblemSource.ENVIRONMENT:
            return f"; did you mean {variable_of(self.suggestion)} (`{self.suggestion}`)?"
        return f"; did you mean `{self.suggestion}`?"


class ConfigCheckFailed(ConfigError):
    """The configuration does not validate: ``problems``, one per key, and the
    ``stray`` variables that were ignored."""

    error_code = "config-check-failed"

    def __init__(
        self, file: Path | None, problems: list[ExplainedProblem], stray: list[StrayVariable]
    ) -> None:
        self.file = file
        self.problems = tuple(problems)
        self.stray = tuple(stray)
        super().__init__("invalid configuration: " + "; ".join(p.text for p in problems))


@dataclass(frozen=True, slots=True)
class CheckReport:
    """A configuration that validates: every setting in force, and what was ignored."""

    file: Path | None
    settings: tuple[EffectiveSetting, ...]
    stray: tuple[StrayVariable, ...]
    zone: tzinfo
    """The zone its ``[display]`` table shows times in."""


def check_config(config: Path | None = None) -> CheckReport:
    """Read the configuration as the daemon does, and tell where each setting came from.

    Raises :class:`ConfigCheckFailed` for values that do not validate, and
    :class:`ConfigError` for a file that is missing or is not TOML, or for providers
    that cannot make one daemon (none enabled, an SDK missing, clocks that differ).
    """
    path = find_config_file(config)
    stray = stray_variables(os.environ)
    try:
        settings = load_settings(config)
    except InvalidConfig as exc:
        text = _file_text(path)
        problems = [_explained(p, text) for p in exc.problems]
        raise ConfigCheckFailed(path, problems, stray) from exc
    # What the daemon checks of its providers before it builds any: none enabled, an
    # SDK missing, a fast simulated clock beside a cloud. A ConfigError, as at start.
    from spotd.daemon.wiring import check_kinds

    check_kinds(settings)
    rows = tuple(effective_settings(settings, path, _file_text(path)))
    return CheckReport(path, rows, tuple(stray), settings.display.zone)


# --- where each value came from -----------------------------------------------------------


def effective_settings(
    settings: Settings, path: Path | None, text: str
) -> Iterator[EffectiveSetting]:
    """Every leaf of ``settings``, its source found among the environment's values
    (read as the settings read them) and the file's."""
    from_env = EnvSettingsSource(Settings)()
    from_file = _toml(text)
    lines = KeyLines(text)
    variables = {name.upper(): name for name in os.environ}
    for loc, value in _leaves(settings, (), secret=False):
        key = ".".join(loc)
        if _holds(from_env, loc):
            yield EffectiveSetting(key, value, SettingSource.ENV, _variable_setting(loc, variables))
        elif _holds(from_file, loc):
            yield EffectiveSetting(key, value, SettingSource.FILE, str(path), lines.line_of(loc))
        else:
            yield EffectiveSetting(key, value, SettingSource.DEFAULT)


def _leaves(
    value: object, loc: tuple[str, ...], *, secret: bool
) -> Iterator[tuple[tuple[str, ...], object]]:
    """(key path, shown value) of every setting under ``value``: a table's keys and
    a non-empty dict's entries are walked, anything else is one value."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _leaves(getattr(value, name), (*loc, name),
                               secret=secret or is_secret_name(name))  # fmt: skip
    elif isinstance(value, Mapping) and value:
        for name, item in value.items():
            yield from _leaves(item, (*loc, str(name)), secret=secret)
    else:
        yield loc, masked(value, secret=secret)


def is_secret_name(name: str) -> bool:
    """Whether a field's name says it holds a secret (``password``, ``api_key``); a key's
    name (``key_name``) or a public key (``ssh_public_key``) is none."""
    words = name.lower().split("_")
    private_key = words[-1] == "key" and "public" not in words
    return private_key or any(word in _SECRET_WORDS for word in words)


def masked(value: object, *, secret: bool) -> object:
    """``value`` fit to show: :data:`MASK` for a secret's, a URL's password hidden."""
    if value is None:
        return None  # unset: saying so shows nothing of a secret
    if secret or isinstance(value, SecretStr | SecretBytes):
        return MASK
    if isinstance(value, str):
        return _url_without_password(value)
    if isinstance(value, list | tuple):
        return [masked(item, secret=False) for item in value]
    return value


def _url_without_password(text: str) -> str:
    """``text`` with the password of a URL (``postgresql://u:pw@host/db``) masked."""
    try:
        password = urlsplit(text).password
    except ValueError:
        return text
    if not password or "@" not in text:
        return text
    return text.replace(f":{password}@", f":{MASK}@", 1)


def _variable_setting(loc: tuple[str, ...], variables: Mapping[str, str]) -> str | None:
    """The variable that set ``loc``: its own, else the nearest table's (as JSON)."""
    for depth in range(len(loc), 0, -1):
        name = variables.get(variable_of(".".join(loc[:depth])))
        if name is not None:
            return name
    return None


def _holds(data: object, loc: Sequence[str]) -> bool:
    """Whether the nested tables of ``data`` have a value at ``loc`` (keys matched
    without case, as the environment's are read)."""
    for part in loc:
        if not isinstance(data, Mapping):
            return False
        keys = {str(k).lower(): k for k in data}
        if part in data:
            data = data[part]
        elif part.lower() in keys:
            data = data[keys[part.lower()]]
        else:
            return False
    return True


def _file_text(path: Path | None) -> str:
    """The file's text; nothing when there is no file or it cannot be read (loading
    it has said so)."""
    if path is None:
        return ""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return ""


def _toml(text: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


# --- unknown keys and variables ------------------------------------------------------------


def _explained(problem: ConfigProblem, text: str) -> ExplainedProblem:
    """``problem`` with its line in the file and, for an unknown key, a suggestion."""
    keys = [str(part) for part in problem.loc]
    line = KeyLines(text).line_of(keys) if problem.source is ProblemSource.FILE else None
    suggestion = suggest(problem.loc) if problem.unknown_key else None
    return ExplainedProblem(problem, line, suggestion)


def known_keys(model: type[BaseModel] = Settings) -> list[tuple[str, ...]]:
    """Every key path of ``model``, tables included; :data:`ANY` for a name in a
    table of names (``teams.*.max_running_jobs``) or an index in a list of tables."""
    found: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        found.append((name,))
        found += [(name, *rest) for rest in _keys_of(field.annotation)]
    return found


def _keys_of(annotation: object) -> list[tuple[str, ...]]:
    """The key paths below a field of type ``annotation``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return known_keys(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (dict, Mapping) and len(args) == 2:
        return [(ANY,), *[(ANY, *rest) for rest in _keys_of(args[1])]]
    if origin in (list, tuple) and args:
        return [(ANY, *rest) for rest in _keys_of(args[0])]
    return [path for arg in args for path in _keys_of(arg)]  # Optional[...] and unions


def suggest(loc: Sequence[int | str]) -> str | None:
    """The known key most like the unknown ``loc``, as a dotted key, if one is close."""
    wanted = [str(part) for part in loc]
    candidates = {_concrete(path, wanted) for path in known_keys()}
    close = difflib.get_close_matches(".".join(wanted), sorted(candidates), n=1, cutoff=_CUTOFF)
    return close[0] if close else None


def _concrete(path: tuple[str, ...], wanted: Sequence[str]) -> str:
    """``path`` with each :data:`ANY` taken from ``wanted`` at the same place."""
    parts = [wanted[i] if part == ANY and i < len(wanted) else part
             for i, part in enumerate(path)]  # fmt: skip
    return ".".join(parts)


def stray_variables(environ: Mapping[str, str]) -> list[StrayVariable]:
    """The ``SPOTD_*`` variables of ``environ`` that name no setting, and which the
    settings therefore ignore. (A variable under a known table that names no key of it
    is no stray: loading refuses it.)"""
    tables = set(Settings.model_fields)
    stray = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in _NOT_SETTINGS:
            continue
        if upper.startswith(SECRET_PREFIX) and len(upper) > len(SECRET_PREFIX):
            continue  # a secret's value, read by the daemon (spotd.daemon.secrets)
        rest = upper.removeprefix(PREFIX).lower().split(DELIMITER)
        if rest[0] not in tables:
            stray.append(StrayVariable(name, suggest(rest)))
    return stray


def variable_of(key: str) -> str:
    """The environment variable of a dotted key: ``SPOTD_DAEMON__PORT``."""
    return PREFIX + DELIMITER.join(key.split(".")).upper()
