"""The agent's settings, read from ``SPOTD_AGENT_*`` environment variables.

See ``docs/agent.md`` for the table of variables. The bootstrap script writes
them into a root-only env file that is sourced before the agent starts.
"""

from __future__ import annotations

import shlex
import signal
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.errors import ConfigError
from spotd.core.kinds import DEFAULT_AGENT_POLL_SECONDS, AnyKind
from spotd.core.values import LaunchRequest
from spotd.registry import kind_names, load_kind

# The engine's tag names (spotd.engine.settings.TAG_JOB / TAG_ATTEMPT, checked by a test),
# repeated so that adapters importing this module do not pull in the engine.
TAG_JOB = "spotd-job"
TAG_ATTEMPT = "spotd-attempt"

AzureAck = Literal["after-exit", "immediate"]

NO_PROVIDER = "none"
"""``SPOTD_AGENT_PROVIDER`` of an agent on a machine of no provider: no notices."""

TOKEN_VARIABLE = "SPOTD_AGENT_TOKEN"  # noqa: S105 (the variable's name, not a secret)
"""Never passed on to the job: the job must not be able to speak for the agent."""


class AgentConfig(BaseModel):
    """Everything the agent needs to run one job on one VM."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str = NO_PROVIDER
    """The provider kind of this node (``SPOTD_AGENT_PROVIDER``), or ``none``."""
    metadata_url: str | None = None
    """Base URL of the metadata service; None means the provider's default."""
    daemon_url: str | None = None
    """Base URL of the daemon; None runs the job without reporting anything."""
    token: SecretStr = SecretStr("")
    job_id: str
    attempt: int
    instance_id: str = ""
    """Empty: asked from the metadata service at start (else the host name)."""
    vm_name: str = ""
    """Azure: the VM name matched against an event's ``Resources``; empty accepts any."""
    command: tuple[str, ...] = Field(min_length=1)
    checkpoint_signal: str = "SIGTERM"
    poll_seconds: float | None = Field(default=None, gt=0)
    """None means the provider kind's default (``ProviderKind.agent_poll_seconds``)."""
    long_poll_seconds: float = Field(default=30.0, gt=0)
    """GCP: how long one ``wait_for_change`` request may hang."""
    heartbeat_seconds: float = Field(default=30.0, gt=0)
    azure_ack: AzureAck = "after-exit"
    report_timeout_seconds: float = Field(default=60.0, ge=0)
    """How long the exit report is retried before ``on_exit`` runs anyway."""
    retry_initial_seconds: float = Field(default=0.5, gt=0)
    retry_max_seconds: float = Field(default=30.0, gt=0)
    provider_name: str = ""
    """The provider's name in the daemon, where the kind builds several; empty: the
    same as ``provider``."""
    address: str = ""
    """This node's address for its gang; empty: the address on the route to the daemon."""
    run_dir: str = ""
    """Where the agent keeps the hostfile and the notice and progress files; empty: a
    new temporary folder, removed when the agent ends."""
    join_poll_seconds: float = Field(default=1.0, gt=0)
    """Seconds between two asks for the gang's roster (and, standing by, for what next)."""
    rejoin_wait_seconds: float = Field(default=300.0, ge=0)
    """How long a gang node whose command exited stands by for the job's next attempt
    (:mod:`spotd.agent.rejoin`) before it leaves; 0: it never stands by."""
    log_seconds: float = Field(default=1.0, gt=0)
    """Seconds between two shipments of the node's output to the daemon."""
    sim_state: str = ""
    """Simulated market only: the node's status file, which says when the notice came."""
    on_exit: tuple[str, ...] | None = None
    """A command run after the job ended and its exit was reported (e.g. a shutdown)."""
    job_env: dict[str, str] = Field(default_factory=dict, repr=False)
    """The job's environment: the agent's own minus ``SPOTD_AGENT_TOKEN``."""

    @field_validator("provider")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value != NO_PROVIDER and value not in kind_names():
            known = ", ".join([*kind_names(), NO_PROVIDER])
            raise ValueError(f"no provider kind named {value!r} is installed (known: {known})")
        return value

    @field_validator("checkpoint_signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        name = value.upper() if value.upper().startswith("SIG") else f"SIG{value.upper()}"
        if name not in signal.Signals.__members__:
            raise ValueError(f"unknown signal {value!r}")
        return name

    @property
    def checkpoint_signum(self) -> signal.Signals:
        """The checkpoint signal as a number."""
        return signal.Signals[self.checkpoint_signal]

    @property
    def kind(self) -> AnyKind | None:
        """The descriptor of this node's provider kind; None for ``none``."""
        return None if self.provider == NO_PROVIDER else load_kind(self.provider)

    @property
    def metadata_base(self) -> str:
        """The metadata base URL, defaulted per provider kind, without a trailing slash."""
        kind = self.kind
        url = self.metadata_url or (kind.metadata_url if kind else "")
        return url.rstrip("/")

    @property
    def reporting_as(self) -> str:
        """The provider name the agent's reports carry, as the daemon knows the provider."""
        return self.provider_name or self.provider

    def speaker(self, instance_id: str, clock: Clock = WALL) -> dict[str, object]:
        """The fields every report of this agent starts with: who speaks, and ``clock``'s
        now."""
        return {
            "job_id": self.job_id,
            "attempt": self.attempt,
            "instance_id": instance_id,
            "provider": self.reporting_as,
            "at": clock.now(),
        }

    @property
    def poll_interval(self) -> float:
        """Seconds between notice polls."""
        if self.poll_seconds:
            return self.poll_seconds
        kind = self.kind
        return kind.agent_poll_seconds if kind else DEFAULT_AGENT_POLL_SECONDS

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str], command: Sequence[str] | None = None
    ) -> AgentConfig:
        """Read ``SPOTD_AGENT_*`` from ``environ``; ``command`` (argv) wins over
        ``SPOTD_AGENT_COMMAND``. Raises ConfigError naming the bad variables."""
        raw = _raw_fields(environ)
        if command:
            raw["command"] = tuple(command)
        raw["job_env"] = {k: v for k, v in environ.items() if k != TOKEN_VARIABLE}
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{_variable_of(err['loc'])}: {err['msg']}" for err in exc.errors()
            )
            raise ConfigError(f"agent configuration: {problems}") from exc


# Field -> (variable, fallback variable). The fallbacks are what spotd already puts
# in every job's environment, so an agent started by hand next to a job works too.
_VARIABLES: dict[str, tuple[str, str | None]] = {
    "provider": ("SPOTD_AGENT_PROVIDER", None),
    "metadata_url": ("SPOTD_AGENT_METADATA_URL", None),
    "daemon_url": ("SPOTD_AGENT_DAEMON_URL", None),
    "token": (TOKEN_VARIABLE, None),
    "job_id": ("SPOTD_AGENT_JOB_ID", "SPOTD_JOB_ID"),
    "attempt": ("SPOTD_AGENT_ATTEMPT", "SPOTD_ATTEMPT"),
    "instance_id": ("SPOTD_AGENT_INSTANCE_ID", "SPOTD_INSTANCE_ID"),
    "vm_name": ("SPOTD_AGENT_VM_NAME", None),
    "command": ("SPOTD_AGENT_COMMAND", None),
    "checkpoint_signal": ("SPOTD_AGENT_CHECKPOINT_SIGNAL", None),
    "poll_seconds": ("SPOTD_AGENT_POLL_SECONDS", None),
    "long_poll_seconds": ("SPOTD_AGENT_LONG_POLL_SECONDS", None),
    "heartbeat_seconds": ("SPOTD_AGENT_HEARTBEAT_SECONDS", None),
    "azure_ack": ("SPOTD_AGENT_AZURE_ACK", None),
    "report_timeout_seconds": ("SPOTD_AGENT_REPORT_TIMEOUT_SECONDS", None),
    "retry_initial_seconds": ("SPOTD_AGENT_RETRY_INITIAL_SECONDS", None),
    "retry_max_seconds": ("SPOTD_AGENT_RETRY_MAX_SECONDS", None),
    "provider_name": ("SPOTD_AGENT_PROVIDER_NAME", None),
    "address": ("SPOTD_AGENT_ADDRESS", None),
    "run_dir": ("SPOTD_AGENT_RUN_DIR", None),
    "join_poll_seconds": ("SPOTD_AGENT_JOIN_POLL_SECONDS", None),
    "rejoin_wait_seconds": ("SPOTD_AGENT_REJOIN_WAIT_SECONDS", None),
    "log_seconds": ("SPOTD_AGENT_LOG_SECONDS", None),
    "sim_state": ("SPOTD_AGENT_SIM_STATE", None),
    "on_exit": ("SPOTD_AGENT_ON_EXIT", None),
}
_ARGV_FIELDS = frozenset({"command", "on_exit"})


def _raw_fields(environ: Mapping[str, str]) -> dict[str, object]:
    raw: dict[str, object] = {}
    for field, (variable, fallback) in _VARIABLES.items():
        value = environ.get(variable, "").strip()
        if not value and fallback is not None:
            value = environ.get(fallback, "").strip()
        if not value:
            continue  # unset and empty both mean "the default"
        raw[field] = tuple(shlex.split(value)) if field in _ARGV_FIELDS else value
    return raw


def _variable_of(loc: tuple[int | str, ...]) -> str:
    field = str(loc[0]) if loc else ""
    if field in _VARIABLES:
        return _VARIABLES[field][0]
    return field or "agent configuration"


def agent_settings(
    kind: str, request: LaunchRequest, *, daemon_url: str, agent_token: str
) -> dict[str, str]:
    """The agent's own settings on a node of ``request``: where its notices come from,
    the daemon it reports to, the token it speaks with, and its job and attempt.

    Raises ValueError when the request lacks the job or attempt tag.
    """
    job_id, attempt = node_ids(request.tags)
    return {
        "SPOTD_AGENT_PROVIDER": kind,
        "SPOTD_AGENT_METADATA_URL": load_kind(kind).metadata_url,
        "SPOTD_AGENT_DAEMON_URL": daemon_url,
        "SPOTD_AGENT_TOKEN": agent_token,
        "SPOTD_AGENT_JOB_ID": job_id,
        "SPOTD_AGENT_ATTEMPT": attempt,
    }


def node_ids(tags: Mapping[str, str]) -> tuple[str, str]:
    """The job id and attempt number a launch request's tags carry (ValueError: missing)."""
    try:
        return tags[TAG_JOB], tags[TAG_ATTEMPT]
    except KeyError as exc:
        raise ValueError(f"launch request has no {exc.args[0]!r} tag") from exc
