"""The simulated provider: real local VM processes on a simulated spot market.

Each instance is a ``spotd_sim.vm`` process that outlives the
daemon; everything about it lives in the state directory (see
:mod:`spotd_sim.statedir`), so a restarted daemon, or another
provider object on the same directory, sees the same instances.

A VM process that died without writing a final state (killed with SIGKILL,
say) is reported as TERMINATED with ``exit_code`` None: the node is lost,
and its job's process group is killed when that is noticed.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from spotd.agent.config import agent_settings
from spotd.core.agent_wire import CODE_SHA256, CODE_URI, agent_token
from spotd.core.drill import drill_target
from spotd.core.errors import ProviderError
from spotd.core.spec import CodeRef
from spotd.core.values import (
    CloudCheck,
    Instance,
    InstanceState,
    LaunchRequest,
    Market,
    NodeUsage,
    Offering,
)
from spotd.ship.pack import WorkdirError
from spotd.ship.store import fetch

from . import billing, catalog, offers
from .addresses import next_address
from .catalog import CatalogEntry
from .clock import SimClock
from .market import SimMarket
from .nodeenv import node_environment
from .procs import signal_group
from .records import InstanceSpec, VmStatus, instance_of
from .statedir import (
    LOCK_FD_ENV,
    StateDir,
    append_line,
    lock_is_held,
    locked,
    open_lock,
    publish_json_once,
    read_json_or_none,
    try_lock,
)

_log = logging.getLogger(__name__)

TERMINATE_WAIT_SECONDS = 5.0
"""Real seconds :meth:`SimProvider.terminate` waits for the VMs to confirm."""

VM_MODULE = "spotd_sim.vm"


class SimProvider:
    """The simulated market of one provider (``sim-aws``, ``sim-gcp`` or ``sim-azure``).

    Several providers may share one market, clock and state directory; each
    sees only its own pools and instances. ``boot_seconds`` is sim time from
    launch to the job's command; ``python`` runs the VM processes.
    """

    def __init__(
        self,
        name: str,
        *,
        market: SimMarket,
        state_dir: Path,
        clock: SimClock,
        boot_seconds: float = 300.0,
        python: str = sys.executable,
    ) -> None:
        if boot_seconds < 0:
            raise ValueError(f"boot_seconds must be >= 0, got {boot_seconds}")
        self.name = name
        self._entries = {e.pool: e for e in catalog.entries(name)}
        self._market = market
        self._clock = clock
        self._boot_seconds = boot_seconds
        self._python = python
        # Absolute: the VM processes and jobs may run in another directory.
        self._paths = StateDir(state_dir.absolute())
        self._paths.ensure()
        self._children: list[subprocess.Popen[bytes]] = []
        self._children_lock = threading.Lock()
        self._agent_link: tuple[str, str] | None = None

    def __repr__(self) -> str:
        return f"SimProvider({self.name!r}, state_dir={str(self._paths.root)!r})"

    @property
    def clock(self) -> SimClock:
        """The simulated clock this provider's market and VMs run on."""
        return self._clock

    @property
    def market(self) -> SimMarket:
        """The spot market this provider sells from."""
        return self._market

    # -- Provider protocol -------------------------------------------------

    def offerings(self) -> list[Offering]:
        """Every pool of this provider, priced and with its capacity signal now."""
        now = self._clock.now()
        return [offers.offering(e, self._market, now) for e in self._entries.values()]

    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Start ``request.nodes`` VM processes, all or none; idempotent by client token.

        A token seen before returns its instances and starts only VMs whose
        process never started (a launch interrupted between record and spawn).
        """
        self._reap()
        entry = offers.checked_entry(self.name, self._entries, request)
        with locked(self._paths.launch_lock):
            ids, launched_at = self._reserved(request.client_token)
            if not ids:
                offers.check_capacity(self.name, self._market, request, self._clock.now())
                ids, launched_at = self._reserve(request)
            taken_back_at = offers.taken_back_at(
                self._market, request, launched_at, lambda: self._launches_before(request)
            )
            try:
                times = (launched_at, taken_back_at)
                specs = [
                    self._spec_or_write(request, entry, instance_id, rank, times)
                    for rank, instance_id in enumerate(ids)
                ]
                for spec in specs:
                    self._start_if_never_started(spec)
                failure = None
            except OSError as exc:
                failure = exc
        if failure is not None:
            # All or none: stop the nodes that did start.
            self.terminate(ids)
            raise ProviderError(
                f"{self.name}: cannot start VM processes: {failure}",
                provider=self.name, code="LaunchFailed",
            ) from failure  # fmt: skip
        return self.describe(ids)

    def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        """The instances among ``instance_ids`` that this provider has, in that order."""
        self._reap()
        specs = (self._spec(i) for i in instance_ids)
        return [self._instance(s) for s in specs if s is not None]

    def list_instances(self, tags: Mapping[str, str]) -> list[Instance]:
        """This provider's instances whose tags include ``tags``, ended ones too."""
        self._reap()
        specs = [s for s in self._all_specs() if tags.items() <= dict(s.tags).items()]
        specs.sort(key=lambda s: (s.launched_at, s.client_token, s.node_rank))
        return [self._instance(s) for s in specs]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Ask the VMs to stop their jobs; wait up to a few real seconds for them.

        Unknown and ended instances are ignored. A VM that is gone has its
        job's process group killed here instead.
        """
        self._reap()
        waiting = []
        for spec in (s for s in map(self._spec, instance_ids) if s is not None):
            if self._end_if_never_started(spec):
                continue
            status = self._status(spec)
            if status is None or not status.ended:
                self._paths.terminate_request(spec.id).touch()
                waiting.append(spec)
        deadline = self._clock.monotonic() + TERMINATE_WAIT_SECONDS
        while waiting and self._clock.monotonic() < deadline:
            time.sleep(0.05)
            waiting = [s for s in waiting if not _ended(self._status(s))]
        if waiting:
            _log.warning("%s: VMs still stopping: %s", self.name, [s.id for s in waiting])

    def link_agents(self, daemon_url: str, daemon_token: str) -> None:
        """Run spotd's agent around the job on nodes launched from now on, as a cloud
        node's boot script does: it joins the gang, runs preflight, relays notices
        and reports to the daemon at ``daemon_url``."""
        if not daemon_token:
            raise ValueError("an empty daemon token would make every agent token guessable")
        self._agent_link = (daemon_url, daemon_token)

    def stall(self, instance_id: str) -> None:
        """Chaos: the node never finishes booting (its job never starts) until terminated."""
        if self._spec(instance_id) is not None:
            self._paths.stall_request(instance_id).touch()

    def reclaim(self, instance_id: str) -> None:
        """The market's side: take one spot node back now, with the usual notice.

        What a cloud does when it preempts a single instance; used by tests
        and chaos drills. On-demand and unknown instances are left alone.
        """
        if self._spec(instance_id) is not None:
            self._paths.reclaim_request(instance_id).touch()

    def drill(self, instance_id: str) -> None:
        """A drill (:class:`~spotd.core.contracts.Driller`): take this running spot node back
        now, with the provider's notice, as the market does (:meth:`reclaim`)."""
        drill_target(self.name, instance_id, self.describe([instance_id]))
        self.reclaim(instance_id)

    def logs(self, instance_id: str) -> str:
        """The job's stdout and stderr so far ("" when there is none)."""
        if self._spec(instance_id) is None:
            return ""
        try:
            return self._paths.job_log(instance_id).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # -- offerings and launch ----------------------------------------------

    def check_cloud(self, request: LaunchRequest | None) -> CloudCheck:
        """What ``spotd check-cloud`` shows for the simulated market: it needs no
        account, so only the request itself is checked (pool, nodes, capacity now)."""
        return offers.market_check(self.name, self._entries, self._market, self._clock.now(),
                                   request, nodes_are="node process(es)")  # fmt: skip

    def _reserved(self, client_token: str) -> tuple[list[str], datetime]:
        """Instance ids recorded for ``client_token`` (empty when new) and their launch time."""
        record = read_json_or_none(self._paths.token(self.name, client_token))
        if record is None:
            return [], self._clock.now()
        return _token_record(record)

    def _reserve(self, request: LaunchRequest) -> tuple[list[str], datetime]:
        """Record the ids for the token before anything starts, so a retry finds them."""
        ids = [f"{self.name}-{uuid.uuid4().hex[:12]}" for _ in range(request.nodes)]
        record = {
            "provider": self.name,
            "client_token": request.client_token,
            "instance_ids": ids,
            "created_at": self._clock.now().isoformat(),
        }
        stored = publish_json_once(self._paths.token(self.name, request.client_token), record)
        if not isinstance(stored, dict):
            raise ProviderError(f"{self.name}: corrupt token record", provider=self.name)
        return _token_record(stored)

    def _spec_or_write(
        self,
        request: LaunchRequest,
        entry: CatalogEntry,
        instance_id: str,
        rank: int,
        times: tuple[datetime, datetime | None],
    ) -> InstanceSpec:
        """The node's spec as written before, or a new one; ``times``: its launch and
        when the market takes it back (None: when its pool runs short)."""
        launched_at, taken_back_at = times
        path = self._paths.spec(instance_id)
        spec = InstanceSpec.load(path)
        if spec is not None:
            return spec
        address = next_address(self._paths.address_counter)
        env = {**request.env, "SPOTD_NODE_RANK": str(rank), "SPOTD_INSTANCE_ID": instance_id}
        workdir = request.workdir or str(self._paths.root / "work" / instance_id)
        if CODE_URI in env:
            workdir = self._unpack_code(env, instance_id)
        command = tuple(request.command)
        if self._agent_link is not None:
            env.update(self._agent_env(request, instance_id, address))
            command = (self._python, "-m", "spotd.agent", "--", *command)
        spec = InstanceSpec(
            id=instance_id,
            provider=self.name,
            pool=entry.pool,
            market=request.market,
            nodes=request.nodes,
            node_rank=rank,
            tags=dict(request.tags),
            command=command,
            env=env,
            address=address,
            workdir=workdir,
            price=offers.launch_price(entry, self._market, request.market, launched_at),
            client_token=request.client_token,
            boot_seconds=self._boot_seconds,
            notice_seconds=entry.notice_seconds,
            launched_at=launched_at,
            market_config=self._market.config.for_pool(entry.pool),
            clock_offset=self._clock.wall_offset(),
            taken_back_at=taken_back_at,
        )
        spec.save(path)
        return spec

    def _unpack_code(self, env: dict[str, str], instance_id: str) -> str:
        """The node's own copy of the job's shipped code, unpacked as its boot would.

        Done here, in the daemon's process, so any storage the daemon reads works
        (``memory://`` too); the node then finds the code in its folder and its
        agent fetches nothing (the code variables are taken out).
        """
        uri, sha256 = env.pop(CODE_URI), env.pop(CODE_SHA256, "")
        try:
            ref = CodeRef(uri=uri, sha256=sha256, size_bytes=0, files=0)
            return str(fetch(ref, self._paths.root / "work" / instance_id / "code"))
        except (WorkdirError, ValueError) as exc:
            raise ProviderError(f"{self.name}: {exc}", provider=self.name,
                                code="CodeUnavailable") from exc  # fmt: skip

    def _agent_env(self, request: LaunchRequest, instance_id: str, address: str) -> dict[str, str]:
        """The agent's settings on one node: what a cloud's boot script writes."""
        assert self._agent_link is not None
        daemon_url, daemon_token = self._agent_link
        run_dir = self._paths.run_dir(instance_id)
        token = agent_token(daemon_token, request.client_token)
        return {
            **agent_settings("sim", request, daemon_url=daemon_url, agent_token=token),
            "SPOTD_AGENT_PROVIDER_NAME": self.name,
            "SPOTD_AGENT_INSTANCE_ID": instance_id,
            "SPOTD_AGENT_ADDRESS": address,
            "SPOTD_AGENT_RUN_DIR": str(run_dir),
            "SPOTD_AGENT_SIM_STATE": str(self._paths.state(instance_id)),
            # Simulated hours pass in real seconds: beat and ask often.
            "SPOTD_AGENT_HEARTBEAT_SECONDS": "1",
            "SPOTD_AGENT_JOIN_POLL_SECONDS": "0.2",
            "SPOTD_AGENT_RETRY_MAX_SECONDS": "2",
            "SPOTD_AGENT_REPORT_TIMEOUT_SECONDS": "15",
        }

    def _launches_before(self, request: LaunchRequest) -> int:
        """The spot launches of the request's pool before it (its own retries aside)."""
        pool = request.offering.pool
        return len({
            s.client_token for s in self._all_specs()
            if s.pool == pool and s.market is Market.SPOT and s.client_token != request.client_token
        })  # fmt: skip

    def _start_if_never_started(self, spec: InstanceSpec) -> None:
        if self._paths.state(spec.id).exists():
            return
        fd = open_lock(self._paths.lock(spec.id))
        try:
            if not try_lock(fd):
                return  # a VM process holds it: started, not yet reporting
            self._spawn(spec, fd)
        finally:
            # The VM keeps the lock through its inherited copy of the fd.
            os.close(fd)

    def _spawn(self, spec: InstanceSpec, lock_fd: int) -> None:
        argv = [self._python, "-m", VM_MODULE, str(self._paths.root), spec.id]
        with self._paths.vm_log(spec.id).open("ab") as out:
            child = subprocess.Popen(
                argv, start_new_session=True, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, pass_fds=(lock_fd,),
                # A fresh machine's environment, not the daemon's: the node's processes,
                # the job's ancestors, must not carry the daemon's keys and passwords.
                env=node_environment(os.environ, {LOCK_FD_ENV: str(lock_fd)}),
            )  # fmt: skip
        with self._children_lock:
            self._children.append(child)
        append_line(self._paths.launches_log, f"{spec.client_token} {spec.id}")

    def _reap(self) -> None:
        """Collect exited VM processes we started, so none stays a zombie."""
        with self._children_lock:
            self._children = [c for c in self._children if c.poll() is None]

    # -- reading instances ---------------------------------------------------

    def _spec(self, instance_id: str) -> InstanceSpec | None:
        if "/" in instance_id or not instance_id.startswith(f"{self.name}-"):
            return None
        try:
            return InstanceSpec.load(self._paths.spec(instance_id))
        except (KeyError, ValueError) as exc:
            _log.warning("%s: unreadable spec of %s: %s", self.name, instance_id, exc)
            return None

    def _all_specs(self) -> list[InstanceSpec]:
        prefix = f"{self.name}-"
        names = (p.name.removesuffix(".spec.json") for p in self._paths.spec_files())
        specs = (self._spec(n) for n in names if n.startswith(prefix))
        return [s for s in specs if s is not None]

    def _instance(self, spec: InstanceSpec) -> Instance:
        return instance_of(spec, self._status(spec))

    def _status(self, spec: InstanceSpec) -> VmStatus | None:
        """The VM's status, settled for a VM process that died without a final word.

        None means the VM has not reported yet (booting, or never started).
        """
        path = self._paths.state(spec.id)
        status = VmStatus.load(path)
        if _ended(status) or lock_is_held(self._paths.lock(spec.id)):
            return status
        # Read again: a VM writes its final state just before it lets go of the lock.
        status = VmStatus.load(path)
        if _ended(status):
            return status
        if status is None and not self._was_spawned(spec):
            return None
        return self._settle_dead_vm(spec, status)

    def _settle_dead_vm(self, spec: InstanceSpec, status: VmStatus | None) -> VmStatus:
        if status is not None and status.child_pid is not None:
            signal_group(status.child_pid, signal.SIGKILL, status.child_start)
        base = status or VmStatus(InstanceState.PENDING, None, spec.launched_at)
        final = replace(
            base, state=InstanceState.TERMINATED, exit_code=None, ended_at=self._clock.now(),
            reason="VM process died without a final state",
        )  # fmt: skip
        final.save(self._paths.state(spec.id))
        return final

    def _end_if_never_started(self, spec: InstanceSpec) -> bool:
        """Mark an instance whose VM never started as terminated; True if it was one."""
        with locked(self._paths.launch_lock):
            if self._paths.state(spec.id).exists() or self._was_spawned(spec):
                return False
            if lock_is_held(self._paths.lock(spec.id)):
                return False
            VmStatus(
                InstanceState.TERMINATED, None, spec.launched_at, ended_at=self._clock.now(),
                reason="terminated before its VM process started",
            ).save(self._paths.state(spec.id))  # fmt: skip
            return True

    def _was_spawned(self, spec: InstanceSpec) -> bool:
        try:
            lines = self._paths.launches_log.read_text().splitlines()
        except FileNotFoundError:
            return False
        return f"{spec.client_token} {spec.id}" in lines

    # -- the provider's own meter ----------------------------------------------

    def bill(self, instance_ids: Sequence[str]) -> float:
        """What this provider charges for these instances, in USD rounded to cents.

        From its own state files: each node from its sim launch to its sim
        end (now, while running), at the price recorded at launch, rounded
        up as the mirrored cloud bills (:mod:`spotd_sim.billing`).
        Ids that are not this provider's cost nothing.
        """
        return billing.bill(self.name, self._paths.root, self._own(instance_ids), self._clock.now())

    def usage(self, instance_ids: Sequence[str]) -> dict[str, NodeUsage]:
        """The meter's record of each of these instances (launch, end, price), by id.

        What the ledger needs to price nodes exactly as :meth:`bill` does.
        """
        return billing.node_usage(self._paths.root, self._own(instance_ids))

    def _own(self, instance_ids: Sequence[str]) -> list[str]:
        return [i for i in instance_ids if i.startswith(f"{self.name}-") and "/" not in i]


def _token_record(record: Mapping[str, object]) -> tuple[list[str], datetime]:
    ids = record["instance_ids"]
    if not isinstance(ids, list):
        raise ValueError(f"token record: bad instance_ids {ids!r}")
    return [str(i) for i in ids], datetime.fromisoformat(str(record["created_at"]))


def _ended(status: VmStatus | None) -> bool:
    return status is not None and status.ended

