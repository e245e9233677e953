"""The simulated market in-process, on a clock the test moves: for tests.

:class:`InProcessSimProvider` sells what :class:`~spotd_sim.provider.SimProvider`
sells, from the same catalog, market and trace modules (:mod:`spotd_sim.offers`),
and answers the :class:`~spotd.core.contracts.Provider` protocol alike. Its
nodes are no processes but :class:`~spotd_sim.inprocess_node.InProcessNode`
objects running a :class:`~spotd_sim.workload.Workload` (the agent and the job
together), and they move only when the clock does: every call about nodes
first plays every node's events up to the clock's now, each at its own time
(:meth:`InProcessSimProvider.settle`; a test that only moves the clock calls it).
No process, thread or sleep, and no file but the checkpoints and exits the
workloads write where the job's environment says; one seed and one sequence of
clock moves and calls give one history.

Not for a daemon: nothing outlives the object, and it is not thread-safe.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from spotd.core.contracts import Clock
from spotd.core.drill import drill_target
from spotd.core.rejoin import RejoinAnswer, RejoinAsk
from spotd.core.values import CloudCheck, Instance, LaunchRequest, Market, NodeUsage, Offering

from . import billing, catalog, offers
from .addresses import address_of
from .catalog import PROVIDERS, CatalogEntry
from .inprocess_node import InProcessNode, Rejoin
from .market import MarketConfig, SimMarket
from .records import InstanceSpec
from .workload import NodeInfo, ReportSink, TrainingWorkload, Workload, WorkloadFactory

if TYPE_CHECKING:
    from spotd.core.clock import ManualClock
    from spotd.core.contracts import CloudChecker, Driller, Metered, Provider


AskRejoin = Callable[[RejoinAsk], RejoinAnswer]
"""Where a gang's node standing by asks what next (``DaemonRejoin.next_step``)."""


class InProcessSimProvider:
    """One simulated provider (``sim-aws``, ``sim-gcp`` or ``sim-azure``) whose nodes
    live in this process, on ``clock``.

    ``boot_seconds`` is clock time from launch to the job's start. ``workloads``
    makes each node's workload (default: :class:`TrainingWorkload` with its
    default plan); ``reports`` is where their agents' reports go (None: nowhere);
    ``rejoin`` is where a gang's node whose job ended asks what next (None: it ends
    with its job; :mod:`spotd.core.rejoin`).
    Several providers may share one market and clock (:func:`build_inprocess_providers`).
    """

    def __init__(
        self,
        name: str,
        *,
        market: SimMarket,
        clock: Clock,
        boot_seconds: float = 300.0,
        workloads: WorkloadFactory | None = None,
        reports: ReportSink | None = None,
        addresses: Iterator[str] | None = None,
        rejoin: AskRejoin | None = None,
    ) -> None:
        if boot_seconds < 0:
            raise ValueError(f"boot_seconds must be >= 0, got {boot_seconds}")
        self.name = name
        self._entries = {e.pool: e for e in catalog.entries(name)}
        self._market = market
        self._clock = clock
        self._boot_seconds = boot_seconds
        self._workloads = workloads or TrainingWorkload.factory()
        self._reports = reports
        self._rejoin = rejoin
        self._addresses = addresses or (address_of(n) for n in itertools.count())
        self._serial = itertools.count(1)
        self._nodes: dict[str, InProcessNode] = {}
        self._tokens: dict[str, list[str]] = {}

    def __repr__(self) -> str:
        return f"InProcessSimProvider({self.name!r}, nodes={len(self._nodes)})"

    @property
    def clock(self) -> Clock:
        """The clock this provider's market and nodes run on."""
        return self._clock

    @property
    def market(self) -> SimMarket:
        """The spot market this provider sells from."""
        return self._market

    def settle(self) -> None:
        """Play every node's events up to the clock's now (every other call does it first);
        the nodes of a gang one of whose nodes is going stop with it from now (its ranks
        agree to, as ``spotd.train``'s do)."""
        now = self._clock.now()
        for node in self._nodes.values():
            node.catch_up(now)
        going = {n.gang for n in self._nodes.values() if n.gang and n.going}
        for node in self._nodes.values():
            if node.gang in going:
                node.stop_with_gang(now)

    # -- Provider protocol -------------------------------------------------

    def offerings(self) -> list[Offering]:
        """Every pool of this provider, priced and with its capacity signal now."""
        now = self._clock.now()
        return [offers.offering(e, self._market, now) for e in self._entries.values()]

    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Start ``request.nodes`` nodes, all or none; idempotent by client token."""
        self.settle()
        entry = offers.checked_entry(self.name, self._entries, request)
        ids = self._tokens.get(request.client_token)
        if ids is None:
            now = self._clock.now()
            offers.check_capacity(self.name, self._market, request, now)
            back = offers.taken_back_at(self._market, request, now,
                                        lambda: self._launches_before(request))  # fmt: skip
            nodes = [self._node(request, entry, rank, now, back) for rank in range(request.nodes)]
            ids = [n.spec.id for n in nodes]
            self._nodes.update(zip(ids, nodes, strict=True))
            self._tokens[request.client_token] = ids
        return self.describe(ids)

    def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        """The instances among ``instance_ids`` that this provider has, in that order."""
        self.settle()
        return [self._nodes[i].instance() for i in instance_ids if i in self._nodes]

    def list_instances(self, tags: Mapping[str, str]) -> list[Instance]:
        """This provider's instances whose tags include ``tags``, ended ones too."""
        self.settle()
        nodes = [n for n in self._nodes.values() if tags.items() <= dict(n.spec.tags).items()]
        nodes.sort(key=lambda n: (n.spec.launched_at, n.spec.client_token, n.spec.node_rank))
        return [n.instance() for n in nodes]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Stop these nodes now (their jobs are told, as by SIGTERM); unknown and ended
        ones are ignored."""
        self.settle()
        now = self._clock.now()
        for node in self._own(instance_ids):
            node.terminate(now)

    def logs(self, instance_id: str) -> str:
        """The job's output so far ("" for an unknown node)."""
        self.settle()
        node = self._nodes.get(instance_id)
        return "" if node is None else node.output()

    def check_cloud(self, request: LaunchRequest | None) -> CloudCheck:
        """What ``spotd check-cloud`` shows, as for :class:`SimProvider`."""
        return offers.market_check(self.name, self._entries, self._market, self._clock.now(),
                                   request, nodes_are="in-process node(s)")  # fmt: skip

    # -- the market's hooks ----------------------------------------------------

    def reclaim(self, instance_id: str) -> None:
        """Take one spot node back now, with the usual notice (on-demand and unknown
        nodes are left alone)."""
        self.settle()
        for node in self._own([instance_id]):
            node.reclaim(self._clock.now())

    def stall(self, instance_id: str) -> None:
        """Chaos: the node never finishes booting (its job never starts) until terminated."""
        self.settle()
        for node in self._own([instance_id]):
            node.stall()

    def drill(self, instance_id: str) -> None:
        """A drill (:class:`~spotd.core.contracts.Driller`): take this running spot node back
        now, with the provider's notice, as the market does (:meth:`reclaim`)."""
        drill_target(self.name, instance_id, self.describe([instance_id]))
        self.reclaim(instance_id)

    # -- the provider's own meter ----------------------------------------------

    def usage(self, instance_ids: Sequence[str]) -> dict[str, NodeUsage]:
        """The meter's record of each of these instances (launch, end, price), by id."""
        self.settle()
        return {n.spec.id: n.usage() for n in self._own(instance_ids)}

    def bill(self, instance_ids: Sequence[str]) -> float:
        """What this provider charges for these instances in USD, rounded to cents."""
        usage = self.usage(instance_ids).values()
        return billing.total(self.name, usage, self._clock.now())

    # -- nodes -------------------------------------------------------------------

    def _own(self, instance_ids: Sequence[str]) -> list[InProcessNode]:
        return [self._nodes[i] for i in instance_ids if i in self._nodes]

    def _launches_before(self, request: LaunchRequest) -> int:
        """The spot launches of the request's pool before it."""
        pool = request.offering.pool
        return len({
            n.spec.client_token for n in self._nodes.values()
            if n.spec.pool == pool and n.spec.market is Market.SPOT
        })  # fmt: skip

    def _node(
        self,
        request: LaunchRequest,
        entry: CatalogEntry,
        rank: int,
        now: datetime,
        taken_back_at: datetime | None,
    ) -> InProcessNode:
        instance_id = f"{self.name}-{next(self._serial):012x}"
        address = next(self._addresses)
        env = {**request.env, "SPOTD_NODE_RANK": str(rank), "SPOTD_INSTANCE_ID": instance_id}
        spec = InstanceSpec(
            id=instance_id,
            provider=self.name,
            pool=entry.pool,
            market=request.market,
            nodes=request.nodes,
            node_rank=rank,
            tags=dict(request.tags),
            command=tuple(request.command),
            env=env,
            workdir=request.workdir or "",
            price=offers.launch_price(entry, self._market, request.market, now),
            client_token=request.client_token,
            boot_seconds=self._boot_seconds,
            notice_seconds=entry.notice_seconds,
            launched_at=now,
            market_config=self._market.config.for_pool(entry.pool),
            address=address,
            taken_back_at=taken_back_at,
        )
        def workload_of(job_env: Mapping[str, str]) -> Workload:
            return self._workloads(NodeInfo(instance_id, self.name, address, job_env,
                                            self._reports))  # fmt: skip

        try:
            workload = workload_of(env)
        except ValueError as exc:
            raise offers.invalid(self.name, f"the node's workload: {exc}") from exc
        rejoin = None if self._rejoin is None else Rejoin(self._rejoin, workload_of)
        return InProcessNode(spec, workload, self._market, rejoin)


def build_inprocess_providers(
    clock: Clock,
    *,
    seed: int,
    mean_up_hours: float = 6.0,
    mean_down_hours: float = 2.0,
    boot_seconds: float = 300.0,
    lifetimes: bool = False,
    traces: Mapping[str, Path] | None = None,
    epoch: datetime | None = None,
    workloads: WorkloadFactory | None = None,
    reports: ReportSink | None = None,
    rejoin: AskRejoin | None = None,
) -> list[InProcessSimProvider]:
    """``sim-aws``, ``sim-gcp`` and ``sim-azure`` in-process, on one market and ``clock``.

    The market is the one :func:`~spotd_sim.factory.build_sim_providers` makes of
    the same arguments, with time 0 at ``epoch`` (default: the clock's now), so
    the same seed and epoch give the same offerings, prices and capacity.
    """
    config = MarketConfig(
        seed=seed,
        mean_up_hours=mean_up_hours,
        mean_down_hours=mean_down_hours,
        traces=MarketConfig.trace_pairs(traces),
        lifetimes=lifetimes,
    )
    market = SimMarket(config, epoch=epoch or clock.now())
    addresses = (address_of(n) for n in itertools.count())
    return [
        InProcessSimProvider(
            name,
            market=market,
            clock=clock,
            boot_seconds=boot_seconds,
            workloads=workloads,
            reports=reports,
            addresses=addresses,
            rejoin=rejoin,
        )
        for name in PROVIDERS
    ]


if TYPE_CHECKING:
    # mypy proves here that the in-process market fits spotd's contracts.
    def _fits(
        provider: InProcessSimProvider, clock: ManualClock
    ) -> tuple[Provider, Metered, CloudChecker, Driller, Clock]:
        return provider, provider, provider, provider, clock
