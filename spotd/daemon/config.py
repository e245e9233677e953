"""Daemon configuration: ``spotd.toml`` overlaid by ``SPOTD_*`` environment variables.

Precedence, highest first: environment (``SPOTD_DATABASE_URL``,
``SPOTD_DAEMON__PORT``, nested keys joined by ``__``), then the TOML file,
then the defaults here. The file is the first that exists of ``--config``,
``$SPOTD_CONFIG``, ``./spotd.toml`` and ``<user config dir>/spotd/spotd.toml``.
"""

from __future__ import annotations

import os
import socket
import threading
import tomllib
from collections.abc import Mapping
from datetime import tzinfo
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, NamedTuple

import platformdirs
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    create_model,
    field_validator,
)
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from spotd.core.errors import ConfigError, UnknownProviderKind
from spotd.core.forecast import OverBudgetAction
from spotd.core.kinds import AnyKind
from spotd.core.timefmt import zone_named
from spotd.daemon.secrets import SecretsSettings
from spotd.mail import EmailSettings
from spotd.mail.webhook_settings import WebhookName, WebhookSettings
from spotd.registry import kind_names, provider_kinds


class DaemonSettings(BaseModel):
    """The ``[daemon]`` table."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    """Address the HTTP API listens on; loopback unless you put a proxy in front."""
    port: int = Field(default=8470, ge=0, le=65535)
    """0 picks a free port; the CLI finds it in ``<data_dir>/daemon.json``."""
    tick_seconds: float = Field(default=2.0, gt=0)
    """Real seconds between two reconcile passes."""
    owner: str = Field(default_factory=socket.gethostname)
    """Name this daemon leases jobs under; give each daemon on a shared database its own."""
    lease_seconds: float = Field(default=60.0, gt=0)
    """A job whose owner has not renewed its lease for this long is taken over."""
    drain_seconds: float = Field(default=10.0, ge=0)
    """On SIGTERM, how long to wait for API requests and the reconcile pass in flight."""
    reap_every_ticks: int = Field(default=10, ge=1)
    """How often to look for instances no open attempt owns, and stop them."""
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    """Largest request body the API reads (1 MiB); a larger one gets 413 unread."""
    body_timeout_seconds: float = Field(default=10.0, gt=0)
    """How long a request's body may take to come in full; after that, 408 and a close."""


class SchedulingSettings(BaseModel):
    """The ``[scheduling]`` table: times in the market clock's hours."""

    model_config = ConfigDict(extra="forbid")

    policy: str = "balanced"
    """Name of the placement policy (entry point group ``spotd.policies``)."""
    cooldown_hours: float = Field(default=0.5, ge=0)
    """How long a pool that preempted a job or had no capacity is avoided; doubles on repeats."""
    no_capacity_timeout_hours: float | None = Field(default=None, gt=0)
    """Fail a job that found no capacity for this long; None waits forever."""
    changeover_hours: float = Field(default=0.25, ge=0)
    """Time a new start costs before progress resumes (boot, setup, restore)."""
    replan_seconds: float = Field(default=60.0, gt=0)
    """Real seconds between two checks of whether a running job should move."""
    price_history_seconds: float = Field(default=300.0, gt=0)
    """Real seconds between two price-history rows of one provider."""
    price_poll_seconds: float = Field(default=300.0, gt=0)
    """Real seconds between two price polls of a cloud (the simulator is polled every tick)."""
    forecast_over_budget: OverBudgetAction = OverBudgetAction.WARN
    """At submit, a job expected to cost more than its ``budget.max_usd``: ``warn`` stores it
    with a warning giving the figures, ``refuse`` stores nothing."""


class ProvidersBase(BaseModel):
    """The ``[providers]`` table: one ``[providers.<name>]`` table per installed kind.

    The fields are the installed provider kinds (:mod:`spotd.registry`), each
    typed by its kind's settings model, so a third-party kind's table is read,
    validated and overridden from ``SPOTD_PROVIDERS__<NAME>__<KEY>`` like the
    shipped ones'. A table of no installed kind is refused.
    """

    model_config = ConfigDict(extra="forbid")

    if TYPE_CHECKING:
        # The fields are made at run time from the installed kinds.
        def __init__(self, **tables: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def table(self, kind: str) -> BaseModel:
        """The settings table of the kind named ``kind``."""
        if kind not in type(self).model_fields:
            raise UnknownProviderKind(
                f"no provider kind named {kind!r} (installed: {', '.join(kind_names())})"
            )
        table: BaseModel = getattr(self, kind)
        return table

    def enabled_kinds(self) -> list[tuple[AnyKind, BaseModel]]:
        """The enabled kinds with their tables, by kind name."""
        pairs = [(kind, self.table(kind.name)) for kind in provider_kinds()]
        return [(kind, table) for kind, table in pairs if kind.is_enabled(table)]


def _providers_model() -> type[ProvidersBase]:
    fields: dict[str, Any] = {
        kind.name: (kind.settings, Field(default_factory=kind.settings))
        for kind in provider_kinds()
    }
    return create_model(
        "ProvidersSettings", __base__=ProvidersBase, __module__=__name__, **fields
    )


if TYPE_CHECKING:
    ProvidersSettings = ProvidersBase
else:
    ProvidersSettings = _providers_model()


class StorageSettings(BaseModel):
    """The ``[storage]`` table: where ``spotd submit`` ships jobs' working directories."""

    model_config = ConfigDict(extra="forbid")

    uri: str | None = None
    """An fsspec location every node can read (``s3://bucket/spotd-code``); None: beside
    the job's checkpoints when those are remote, else ``<data_dir>/code`` (this machine
    only, which suits the simulated market)."""
    max_workdir_mb: float = Field(default=256.0, gt=0)
    """The most a shipped working directory may hold, its files' sizes added up."""


class AgentSettings(BaseModel):
    """The ``[agent]`` table: how cloud nodes start spotd's agent and reach the daemon."""

    model_config = ConfigDict(extra="forbid")

    daemon_url: str | None = None
    """URL the agents on cloud nodes use to reach this daemon's API (through your
    VPN or proxy); needed as soon as a cloud is enabled."""
    install: str = "pip install spotd"
    """Shell line that installs spotd on a fresh node (a pinned version or wheel URL)."""
    python: str = "python3"
    """Interpreter on the node that runs the agent."""
    registry_login: str = ""
    """Shell line a node runs before it pulls a job's image, to log in to a registry
    its cloud identity does not cover by itself (``aws ecr get-login-password ... |
    docker login ...``); empty: the engine's own credential helpers."""
    log_keep_bytes: int = Field(default=4 * 1024 * 1024, ge=64 * 1024)
    """The newest bytes of each job's output the daemons keep, of all its nodes and
    attempts together, as the agents ship it (``spotd logs``); older ones are dropped."""


class TeamSettings(BaseModel):
    """A ``[teams.<name>]`` table: limits on the jobs whose ``team`` is ``<name>``.

    A limit reached holds the team's pending jobs back (they stay pending, a
    ``held`` event says why); jobs already started go on.
    """

    model_config = ConfigDict(extra="forbid")

    max_running_jobs: int | None = Field(default=None, ge=0)
    """Most jobs of the team started and not ended at once (provisioning, running,
    checkpointing or recovering), across every daemon on the database; None: no limit."""
    monthly_budget_usd: float | None = Field(default=None, ge=0)
    """What the team's jobs may spend in a calendar month (UTC) by the ledger before no
    more of them start; None: no limit."""


class DisplaySettings(BaseModel):
    """The ``[display]`` table: how times are shown to people."""

    model_config = ConfigDict(extra="forbid")

    timezone: str = "UTC"
    """The one zone every time is shown in (CLI, dashboard, reports, email, the daemon's
    log): ``UTC`` or an IANA name such as ``Europe/Berlin``. Stored times stay UTC."""

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, name: str) -> str:
        zone_named(name)  # raises ValueError, which pydantic reports with the key
        return name

    @property
    def zone(self) -> tzinfo:
        """The zone :attr:`timezone` names."""
        return zone_named(self.timezone)


TeamName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
"""What a job's ``team`` may be (the characters of a job name)."""


def _default_data_dir() -> Path:
    return platformdirs.user_data_path("spotd")


class Settings(BaseSettings):
    """Everything the daemon and the CLI read from configuration."""

    model_config = SettingsConfigDict(
        env_prefix="SPOTD_", env_nested_delimiter="__", extra="forbid"
    )

    data_dir: Path = Field(default_factory=_default_data_dir)
    """Database, API token, daemon address, default checkpoints and simulator state."""
    database_url: str | None = None
    """Any SQLAlchemy URL; default ``sqlite:///<data_dir>/spotd.db``."""
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    scheduling: SchedulingSettings = Field(default_factory=SchedulingSettings)
    providers: ProvidersSettings = Field(default_factory=ProvidersSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    email: EmailSettings = Field(default_factory=EmailSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    secrets: SecretsSettings = Field(default_factory=SecretsSettings)
    display: DisplaySettings = Field(default_factory=DisplaySettings)
    teams: dict[TeamName, TeamSettings] = Field(default_factory=dict)
    """Per team name, the limits on its jobs (``[teams.<name>]``)."""
    webhooks: dict[WebhookName, WebhookSettings] = Field(default_factory=dict)
    """Per webhook name, where job transitions are POSTed (``[webhooks.<name>]``)."""

    _toml_path: ClassVar[Path | None] = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if cls._toml_path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=cls._toml_path))
        return tuple(sources)

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'spotd.db'}"

    @property
    def token_file(self) -> Path:
        return self.data_dir / "token"

    @property
    def address_file(self) -> Path:
        return self.data_dir / "daemon.json"

    def state_dir(self, kind: str) -> Path:
        """The folder of provider kind ``kind``'s own state (the simulator's market):
        its table's ``state_dir`` where it has one, else ``<data_dir>/<kind>``."""
        override = getattr(getattr(self.providers, kind, None), "state_dir", None)
        return Path(override) if override else self.data_dir / kind

    @property
    def sim_state_dir(self) -> Path:
        """The simulated market's state: ``state_dir`` of the kind its table names."""
        return self.state_dir("sim")

    @property
    def checkpoints_dir(self) -> Path:
        return self.data_dir / "checkpoints"


# The TOML path is a class variable of the settings source; loading is
# serialised so two threads never read each other's file.
_load_lock = threading.Lock()


def find_config_file(explicit: Path | None = None) -> Path | None:
    """The configuration file in force, or None when there is none."""
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(f"{explicit}: no such configuration file")
        return explicit
    candidates = [
        os.environ.get("SPOTD_CONFIG"),
        "spotd.toml",
        str(platformdirs.user_config_path("spotd") / "spotd.toml"),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


class ProblemSource(Enum):
    """Where the value of a :class:`ConfigProblem` came from, in the order sources win."""

    GIVEN = "given"
    """A keyword override of :func:`load_settings`."""
    ENVIRONMENT = "environment"
    FILE = "file"
    DEFAULTS = "defaults"


class ConfigProblem(NamedTuple):
    """One key of a configuration that does not validate."""

    loc: tuple[int | str, ...]
    """The key's path (``("daemon", "port")``)."""
    message: str
    """What is wrong with it."""
    source: ProblemSource
    origin: str
    """The overridden field, the environment variable, the file's path, or ``defaults``."""
    unknown_key: bool
    """The key is no setting (a typo, or a table of no installed provider kind)."""

    @property
    def key(self) -> str:
        """The dotted key: ``daemon.port``."""
        return ".".join(str(part) for part in self.loc)

    @property
    def where(self) -> str:
        """The source as the message names it: ``environment variable SPOTD_X``, a path."""
        if self.source is ProblemSource.GIVEN:
            return f"given {self.origin}"
        if self.source is ProblemSource.ENVIRONMENT:
            return f"environment variable {self.origin}"
        return self.origin

    def __str__(self) -> str:
        return f"{self.where}: {self.key}: {self.message}"


class InvalidConfig(ConfigError):
    """Settings that do not validate: ``problems`` has one per key, each with its source."""

    error_code = "invalid-config"

    def __init__(self, problems: list[ConfigProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid configuration: " + "; ".join(str(p) for p in problems))


def load_settings(config: Path | None = None, **overrides: object) -> Settings:
    """Read the configuration; ``overrides`` (field=value) beat file and environment.

    Raises :class:`InvalidConfig` for values that do not validate, and
    :class:`ConfigError` for a file or variable that cannot be parsed at all.
    """
    path = find_config_file(config)
    with _load_lock:
        Settings._toml_path = path
        try:
            return Settings(**overrides)  # type: ignore[arg-type]
        except ValidationError as exc:
            written = _read_toml(path)
            problems = [_problem(e, path, written, overrides) for e in exc.errors()]
            raise InvalidConfig(problems) from exc
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path or 'environment'}: {exc}") from exc
        finally:
            Settings._toml_path = None


def _message(error: ErrorDetails) -> str:
    """The error's message; for a ``[providers.<name>]`` table of no installed kind,
    one naming the kinds that are installed."""
    loc = error["loc"]
    if error["type"] == "extra_forbidden" and len(loc) == 2 and loc[0] == "providers":
        return f"no provider kind named {loc[1]!r} is installed (known: {', '.join(kind_names())})"
    return error["msg"]


def _problem(
    error: ErrorDetails,
    path: Path | None,
    written: Mapping[str, object],
    overrides: Mapping[str, object],
) -> ConfigProblem:
    """One problem with its source."""
    loc = error["loc"]
    source, origin = _problem_source(loc, path, written, overrides)
    unknown = error["type"] == "extra_forbidden"
    return ConfigProblem(loc, _message(error), source, origin, unknown)


def _problem_source(
    loc: tuple[int | str, ...],
    path: Path | None,
    written: Mapping[str, object],
    overrides: Mapping[str, object],
) -> tuple[ProblemSource, str]:
    """The source of the value at ``loc``, in the order sources win: a value given in
    code, the environment variable of the field, the file, an environment variable
    holding the field's whole table as JSON, else the defaults."""
    if loc and loc[0] in overrides:
        return ProblemSource.GIVEN, str(loc[0])
    names = {key.upper(): key for key in os.environ}
    variable = "SPOTD_" + "__".join(str(part) for part in loc).upper()
    if variable in names:
        return ProblemSource.ENVIRONMENT, names[variable]
    if _holds(written, loc):
        return ProblemSource.FILE, str(path)
    for depth in range(len(loc) - 1, 0, -1):
        table = "SPOTD_" + "__".join(str(part) for part in loc[:depth]).upper()
        if table in names:
            return ProblemSource.ENVIRONMENT, names[table]
    if path is not None:
        return ProblemSource.FILE, str(path)
    return ProblemSource.DEFAULTS, "defaults"


def _holds(data: object, loc: tuple[int | str, ...]) -> bool:
    """Whether the nested tables of ``data`` have a value at ``loc``."""
    for part in loc:
        if not isinstance(data, Mapping) or part not in data:
            return False
        data = data[part]
    return True


def _read_toml(path: Path | None) -> dict[str, object]:
    """The file's tables, or nothing where it cannot be read (its own error is reported)."""
    if path is None:
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
