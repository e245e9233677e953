"""What spotd knows of a kind of provider: one :class:`ProviderKind` per kind.

A kind is a family of providers built from one ``[providers.<name>]`` table:
a cloud (one provider named like the kind) or the simulator (three providers,
``sim-*``, each mirroring a cloud). Each provider package declares its
descriptor in the ``spotd.providers`` entry point group;
:mod:`spotd.registry` finds them there, so the core never names a cloud and a
third-party package adds a kind without an edit of ``spotd/``.

The descriptor holds the kind's fixed figures (billing, egress, notice, boot
carrier, metadata service, the instance-type catalog) and the hooks that
build its providers and its agent's notice watcher. Nothing here does I/O or
imports an SDK: a provider package must be importable without its SDK, which
its ``build`` hook loads when called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from spotd.core.network import Fabric, Interconnect

if TYPE_CHECKING:
    from spotd.core.contracts import (
        ClockOpener,
        NoticeWatcherFactory,
        ProviderFactory,
    )

S = TypeVar("S", bound=BaseModel)

DEFAULT_BILLING_STEP_SECONDS = 1
DEFAULT_BILLING_MINIMUM_SECONDS = 60
"""Per second with a minute's minimum: the common case, and the figure for a
provider no installed kind describes."""

DEFAULT_EGRESS_USD_PER_GB = 0.12
"""Internet egress of a kind that gives none, or of a provider no kind describes:
the dearest first-tier list price of the clouds shipped, so no move looks cheap."""

DEFAULT_INTER_REGION_USD_PER_GB = 0.02
"""Moving a GB between two regions of one provider (the clouds' list: 0.01-0.02)."""

DEFAULT_AGENT_POLL_SECONDS = 60.0
"""The agent's poll interval where a kind has no notice source."""


@dataclass(frozen=True, slots=True)
class InstanceShape:
    """The shape of an instance type, one name on every provider: its GPUs and its
    scale-out network (the kinds' tables, the adapters and the simulator all use it)."""

    gpu: str
    gpus_per_node: int
    gpu_memory_gb: int
    interconnect: Interconnect


def instance_shape(
    gpu: str, gpus: int, memory_gb: int, fabric: Fabric, node_gbps: float
) -> InstanceShape:
    """The facts of a type with ``gpus`` GPUs and ``node_gbps`` of scale-out per node."""
    return InstanceShape(gpu, gpus, memory_gb, Interconnect(fabric, node_gbps / gpus))


@dataclass(frozen=True, slots=True)
class BootCarrier:
    """How a kind's nodes receive spotd's boot script, and how large it may be."""

    description: str
    """What carries the script, for messages and the script's header ("EC2 user data")."""
    max_bytes: int
    """The carrier's size limit; the rendered script is checked against it raw."""


@dataclass(frozen=True, slots=True)
class Sdk:
    """The SDK a kind's ``build`` hook imports, and the extra that installs it."""

    extra: str
    """The extra of the kind's distribution that installs the SDK (``pip install
    'dist[extra]'``; the distribution is the one declaring the kind's entry point)."""
    modules: tuple[str, ...]
    """Modules ``build`` imports, looked for before anything is built, so a missing
    SDK is told before any other problem of the configuration."""


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class ProviderKind(Generic[S]):
    """The descriptor of one kind of provider (figures per node, USD, seconds)."""

    name: str
    """The kind's name: its entry point's name and its ``[providers.<name>]`` table."""
    settings: type[S]
    """The model of the kind's ``[providers.<name>]`` table; it has an ``enabled`` field."""
    build: ProviderFactory[S]
    """Builds the kind's providers from its table (only called when it is enabled)."""
    sdk: Sdk | None = None
    """The SDK ``build`` loads, when the kind needs one that an extra installs."""
    provider_names: tuple[str, ...] = ()
    """Names of the providers it builds; empty: one provider named like the kind."""
    mirrors: Mapping[str, str] = field(default_factory=dict)
    """Provider name -> the kind whose market figures it reproduces (billing, egress,
    notice, instance types): the simulator's ``sim-*`` providers mirror the clouds."""
    billing_step_seconds: int = DEFAULT_BILLING_STEP_SECONDS
    """Billing granularity of a node's running time."""
    billing_minimum_seconds: int = DEFAULT_BILLING_MINIMUM_SECONDS
    """The least a node is billed for."""
    prices_fixed_at_launch: bool = False
    """True: a node pays the price it launched at for its whole life (the simulator);
    False: the prices in force while it runs (the pool's price history)."""
    egress_usd_per_gb: float = DEFAULT_EGRESS_USD_PER_GB
    """Moving a GB out of this kind's providers to another provider."""
    inter_region_usd_per_gb: float = DEFAULT_INTER_REGION_USD_PER_GB
    """Moving a GB between two regions of one of its providers."""
    notice_seconds: int = 0
    """Seconds between a preemption notice and the hard stop."""
    boot: BootCarrier | None = None
    """The boot-script carrier of its nodes; None: its nodes need no boot script
    from the daemon (the daemon then needs no ``[agent] daemon_url`` for it)."""
    secret_variables: tuple[str, ...] = ()
    """Environment variables in which its SDK takes credentials: the daemon keeps them
    for its clients but out of what ``/proc`` shows of it (:func:`spotd.environ.hide`)."""
    sdk_loggers: tuple[str, ...] = ()
    """Loggers of its SDK, kept at WARNING in the daemon's log: their INFO lines (found
    credentials, retried calls) are nothing an operator acts on."""
    replaces_gang_nodes: bool = False
    """True: a launch that joins a running gang (``LaunchRequest.joins``, fewer nodes than
    the gang's ``SPOTD_NUM_NODES``) puts them where the gang's kept nodes reach them (its
    placement objects, zone and fabric interfaces), so a gang that lost a node gets a new
    one beside the others (:mod:`spotd.engine.repair`), and its nodes' agents stand by
    after their command for that; False: such a gang restarts whole."""
    nodes_have_gpus: bool = True
    """False: its nodes do not have the GPUs they are offered with (the simulator's run
    on the host), so the agent's preflight runs one process per node on gloo."""
    metadata_url: str = ""
    """Where the metadata service answers on its nodes, for the agent; empty: none."""
    agent_poll_seconds: float = DEFAULT_AGENT_POLL_SECONDS
    """Seconds between two of the agent's notice polls on its nodes."""
    price_poll_seconds: float | None = None
    """Real seconds between two price polls of its providers, never under the
    daemon's tick; None: ``[scheduling] price_poll_seconds``."""
    instance_types: Mapping[str, InstanceShape] = field(default_factory=dict)
    """Instance type -> GPUs and scale-out fabric, with their sources where defined."""
    notice_watcher: NoticeWatcherFactory | None = None
    """The agent's preemption-notice watcher on its nodes; None: nothing to watch."""
    clock_speed: Callable[[S], float] | None = None
    """Speed of the clock the kind brings, from its table, known before building; None:
    the wall clock. A kind faster than real time cannot share a daemon with others."""
    open_clock: ClockOpener | None = None
    """The clock a kind's records are on, opened from its state_dir without building
    its providers (``spotd report`` beside a daemon); None when it has not started."""

    def __repr__(self) -> str:
        return f"ProviderKind({self.name!r})"

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the providers this kind builds."""
        return self.provider_names or (self.name,)

    def owns(self, provider: str) -> bool:
        """Whether the provider named ``provider`` is one of this kind's."""
        return provider in self.names

    def is_enabled(self, table: BaseModel) -> bool:
        """Whether the kind's settings table turns it on."""
        return bool(getattr(table, "enabled", False))


AnyKind = ProviderKind[Any]
"""A descriptor of any kind, as the registry holds them."""
