"""The AWS adapter: EC2 spot and on-demand GPU instances through boto3.

Reads offerings from four APIs (type offerings per zone, instance types,
spot price history, spot placement scores) plus the Price List API, and
launches with ``run_instances``: all nodes of a request in one call, one
zone, idempotent by client token; a gang in its cluster placement group with
its EFA interfaces. Also a PlacementHost (its placement groups), a
CloudChecker (dry runs) and a Driller (Fault Injection Service). See
docs/providers-aws.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.drill import drill_target
from spotd.core.errors import NotFoundError, ProviderError, invalid_request
from spotd.core.kinds import InstanceShape
from spotd.core.values import (
    CloudCheck,
    Instance,
    LaunchRequest,
    Offering,
    PlacementObject,
    Pool,
)
from spotd.market.ttl import TtlCache

from .capacity import placement_scores
from .catalog import gpu_types, zone_ids, zones_offering
from .check import CheckTarget, run_checks
from .clients import AwsClients
from .drill import send_interruption
from .errors import PROVIDER, map_aws_errors
from .figures import INSTANCE_TYPES, NOTICE_SECONDS
from .gang import GangPlanner
from .instances import IDEMPOTENCY_TAG, aws_client_token, is_gone, launch_params, to_instance
from .placement import delete_group, group_names, list_groups
from .prices import latest_spot_prices, on_demand_price
from .settings import AwsSettings

log = logging.getLogger(__name__)

"""EC2 warns a spot instance two minutes before taking it back."""
STATIC_TTL_SECONDS = 6 * 3600.0
"""How long zone offerings, GPU facts, zone ids and on-demand prices are kept."""
SCORE_TTL_SECONDS = 15 * 60.0
"""How long placement scores are kept (AWS limits new score requests per day)."""
MAX_FILTER_VALUES = 200
"""EC2 takes at most 200 values in one filter."""

UserData = Callable[[LaunchRequest], str]
"""Renders the bootstrap script that starts spotd's agent on a node."""

RawInstance = Mapping[str, Any]


class AwsProvider:
    """EC2 as a spotd :class:`~spotd.core.contracts.Provider`.

    ``session`` (a ``boto3.Session``) or ``clients`` may be injected, for
    tests that hook botocore; otherwise a session comes from boto3's
    credential chain and the settings' ``profile``. ``clock`` drives the caches
    (its monotonic seconds) and gives the time for price queries (its now).
    """

    name = PROVIDER

    def __init__(
        self,
        settings: AwsSettings,
        *,
        user_data: UserData,
        session: Any = None,
        clients: AwsClients | None = None,
        clock: Clock = WALL,
    ) -> None:
        self._settings = settings
        self._user_data = user_data
        self._clients = clients or AwsClients(settings, session)
        self._clock = clock
        ticks = clock.monotonic
        self._offered: TtlCache[str, dict[str, set[str]]] = TtlCache(STATIC_TTL_SECONDS, ticks)
        self._gpus: TtlCache[str, dict[str, InstanceShape]] = TtlCache(STATIC_TTL_SECONDS, ticks)
        self._zone_ids: TtlCache[str, dict[str, str]] = TtlCache(STATIC_TTL_SECONDS, ticks)
        self._on_demand: TtlCache[tuple[str, str], float | None] = TtlCache(
            STATIC_TTL_SECONDS, ticks
        )
        self._scores: TtlCache[tuple[str, str], dict[str, float] | None] = TtlCache(
            SCORE_TTL_SECONDS, ticks
        )
        self._gang = GangPlanner(settings, self._clients, ticks)
        self._region_of: dict[str, str] = {}
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"AwsProvider(regions={self._settings.regions!r})"

    @property
    def instance_types(self) -> list[str]:
        """The instance types this adapter offers."""
        configured = self._settings.instance_types
        return sorted(INSTANCE_TYPES) if configured is None else list(configured)

    # -- offerings -------------------------------------------------------------

    def offerings(self) -> list[Offering]:
        """Every offered GPU type in every zone of the configured regions, priced now."""
        now = self._clock.now()
        return [o for region in self._settings.regions for o in self._offerings_in(region, now)]

    def _offerings_in(self, region: str, now: datetime) -> list[Offering]:
        ec2 = self._clients.ec2(region)
        offered = self._offered.get_or_load(
            region, lambda: zones_offering(ec2, self.instance_types)
        )
        gpus = self._gpus.get_or_load(region, lambda: gpu_types(ec2, offered))
        spot = latest_spot_prices(ec2, gpus, now)
        offerings = []
        for itype, gpu in sorted(gpus.items()):
            on_demand = self._on_demand_price(region, itype)
            capacity = self._capacity(region, itype)
            for zone in sorted(offered.get(itype, ())):
                offerings.append(Offering(
                    pool=Pool(PROVIDER, region, zone, itype),
                    gpu=gpu.gpu,
                    gpus_per_node=gpu.gpus_per_node,
                    gpu_memory_gb=gpu.gpu_memory_gb,
                    interconnect=gpu.interconnect,
                    spot_price=spot.get((zone, itype)),
                    on_demand_price=on_demand,
                    capacity=None if capacity is None else capacity.get(zone),
                    notice_seconds=NOTICE_SECONDS,
                ))  # fmt: skip
        return offerings

    def _on_demand_price(self, region: str, instance_type: str) -> float | None:
        """Cached for hours; a failed lookup is not cached, so the next poll asks again."""
        try:
            return self._on_demand.get_or_load(
                (region, instance_type),
                lambda: on_demand_price(self._clients.pricing(), region, instance_type),
            )
        except ProviderError as exc:
            self._warn_once("on-demand price", exc)
            return None

    def _capacity(self, region: str, instance_type: str) -> dict[str, float] | None:
        """Zone name -> capacity signal; None when AWS gave no scores."""
        return self._scores.get_or_load(
            (region, instance_type), lambda: self._load_scores(region, instance_type)
        )

    def _load_scores(self, region: str, instance_type: str) -> dict[str, float] | None:
        # A failure is cached like a score: asking again each poll would not help.
        ec2 = self._clients.ec2(region)
        try:
            scores = placement_scores(ec2, instance_type, [region])
            names = self._zone_ids.get_or_load(region, lambda: zone_ids(ec2))
        except ProviderError as exc:
            self._warn_once("spot placement scores", exc)
            return None
        return {names[zid]: v for (r, zid), v in scores.items() if r == region and zid in names}

    def _warn_once(self, what: str, exc: ProviderError) -> None:
        key = (what, exc.code)
        with self._lock:
            first = key not in self._warned
            self._warned.add(key)
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "aws: no %s (left empty, poll goes on): %s", what, exc)

    # -- launch ----------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> list[Instance]:
        """Start ``request.nodes`` nodes in the pool's zone, all or none.

        Idempotent by client token twice over: EC2's own ``ClientToken``, and
        a tag holding it that is looked up first (EC2 fakes ignore the token,
        and the tag also finds the instances after EC2 forgot the token).
        A gang (nodes > 1) first gets its cluster placement group and security
        group (both idempotent), then launches into them with EFA interfaces.
        Nodes that join a running gang (``request.joins``, a node repair) go into
        that gang's placement group, zone and subnet, with its security groups and
        the same EFA interfaces as its kept nodes.
        """
        region = self._check(request)
        token = aws_client_token(request.client_token)
        existing = self._query(region, [{"Name": f"tag:{IDEMPOTENCY_TAG}", "Values": [token]}])
        if existing:
            return [to_instance(raw, region) for raw in _ordered(existing)]
        with invalid_request(PROVIDER, "launch"):
            script = self._user_data(request)
        gang = self._gang.plan(request, create=True)
        params = launch_params(self._settings, request, token, script, gang,
                               subnet_id=self._gang.private_subnet(request, gang))  # fmt: skip
        with map_aws_errors("RunInstances"):
            reply = self._clients.ec2(region).run_instances(**params)
        started = _ordered(reply.get("Instances", []))
        self._remember(region, started)
        expected_tags = {t["Key"]: t["Value"] for t in params["TagSpecifications"][0]["Tags"]}
        # The reply may omit tags and lifecycle; we know what we asked for.
        return [
            replace(inst, market=request.market, tags=inst.tags or expected_tags)
            for inst in (to_instance(raw, region) for raw in started)
        ]

    def _check(self, request: LaunchRequest) -> str:
        pool = request.offering.pool
        problem = None
        if pool.provider != PROVIDER:
            problem = f"pool {pool} is not an AWS pool"
        elif request.nodes < 1:
            problem = f"nodes must be at least 1, got {request.nodes}"
        elif pool.region not in self._settings.image_id:
            problem = f"no image_id configured for region {pool.region}"
        if problem is not None:
            raise ProviderError(f"aws: {problem}", provider=PROVIDER, code="InvalidRequest")
        return pool.region

    # -- placement groups and check-cloud -----------------------------------

    def list_placements(self, tags: Mapping[str, str]) -> list[PlacementObject]:
        """spotd's placement groups carrying all of ``tags``, in every configured region."""
        return [p for region in self._settings.regions
                for p in list_groups(self._clients.ec2(region), region, tags)]  # fmt: skip

    def delete_placements(self, placements: Sequence[PlacementObject]) -> None:
        """Delete these placement groups; gone ones are ignored.

        One still holding instances raises ProviderUnavailable (code
        ``InvalidPlacementGroup.InUse``), after the others were deleted.
        """
        failed: ProviderError | None = None
        for region, names in group_names(placements).items():
            for name in names:
                try:
                    delete_group(self._clients.ec2(region), name)
                except ProviderError as exc:
                    failed = exc
        if failed is not None:
            raise failed

    def check_cloud(self, request: LaunchRequest | None) -> CloudCheck:
        """Credentials, permissions (dry runs), quotas, image and ``request``'s launch.

        Creates nothing; see :mod:`spotd_aws.check`.
        """
        target = CheckTarget(
            settings=self._settings, clients=self._clients, planner=self._gang,
            user_data=self._user_data, instance_types=self.instance_types,
        )  # fmt: skip
        return run_checks(target, request)

    # -- reading and stopping instances --------------------------------------

    def describe(self, instance_ids: Sequence[str]) -> list[Instance]:
        """The instances among ``instance_ids`` that exist, in that order."""
        found = {str(raw["InstanceId"]): (region, raw) for region, raw in self._find(instance_ids)}
        return [to_instance(found[i][1], found[i][0]) for i in instance_ids if i in found]

    def list_instances(self, tags: Mapping[str, str]) -> list[Instance]:
        """Instances in every configured region carrying all of ``tags``, ended ones too."""
        filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
        found = [(region, raw) for region in self._settings.regions
                 for raw in self._query(region, filters)]  # fmt: skip
        found.sort(key=lambda pair: _order_key(pair[1]))
        return [to_instance(raw, region) for region, raw in found]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate these instances; unknown and already terminating ones are skipped."""
        by_region: dict[str, list[str]] = {}
        for region, raw in self._find(instance_ids):
            if not is_gone(raw):
                by_region.setdefault(region, []).append(str(raw["InstanceId"]))
        for region, ids in by_region.items():
            for chunk in _chunks(ids):
                self._terminate_chunk(region, chunk)

    def _terminate_chunk(self, region: str, ids: list[str]) -> None:
        try:
            with map_aws_errors("TerminateInstances"):
                self._clients.ec2(region).terminate_instances(InstanceIds=ids)
        except NotFoundError:
            # One of them vanished since we looked: EC2 refuses the whole batch.
            if len(ids) > 1:
                for instance_id in ids:
                    self._terminate_chunk(region, [instance_id])

    def logs(self, instance_id: str) -> str:
        """Always "": EC2 keeps no job output; the on-VM agent reports it to the daemon."""
        return ""

    def drill(self, instance_id: str) -> None:
        """A drill (:class:`~spotd.core.contracts.Driller`): AWS Fault Injection Service
        interrupts this spot instance with EC2's two-minute notice (:mod:`.drill`)."""
        target = drill_target(PROVIDER, instance_id, self.describe([instance_id]))
        send_interruption(self._clients, self._settings, target.pool.region, instance_id)

    def _find(self, instance_ids: Iterable[str]) -> list[tuple[str, RawInstance]]:
        """(region, raw) of the instances that exist; regions they were seen in go first."""
        # Only EC2 ids can exist; anything else (a sim id, a typo) needs no call.
        missing = list(dict.fromkeys(i for i in instance_ids if i.startswith("i-")))
        found: list[tuple[str, RawInstance]] = []
        for region in self._regions_for(missing):
            if not missing:
                break
            # A filter, unlike InstanceIds=, leaves unknown ids out instead of failing.
            for chunk in _chunks(missing):
                found += [
                    (region, raw)
                    for raw in self._query(region, [{"Name": "instance-id", "Values": chunk}])
                ]
            seen = {str(raw["InstanceId"]) for _, raw in found}
            missing = [i for i in missing if i not in seen]
        return found

    def _regions_for(self, instance_ids: Sequence[str]) -> list[str]:
        known = {self._region_of.get(i) for i in instance_ids}
        regions = self._settings.regions
        return [r for r in regions if r in known] + [r for r in regions if r not in known]

    def _query(self, region: str, filters: list[dict[str, Any]]) -> list[RawInstance]:
        with map_aws_errors("DescribeInstances"):
            pages = (
                self._clients.ec2(region)
                .get_paginator("describe_instances")
                .paginate(Filters=filters)
            )
            found = [raw for page in pages for res in page.get("Reservations", [])
                     for raw in res.get("Instances", [])]  # fmt: skip
        self._remember(region, found)
        return found

    def _remember(self, region: str, raws: Iterable[RawInstance]) -> None:
        for raw in raws:
            self._region_of[str(raw["InstanceId"])] = region


def build_aws_provider(settings: AwsSettings, *, user_data: UserData) -> AwsProvider:
    """The AWS provider of the daemon, with boto3's credential chain."""
    return AwsProvider(settings, user_data=user_data)


def _ordered(raws: Iterable[RawInstance]) -> list[RawInstance]:
    return sorted(raws, key=_order_key)


def _order_key(raw: RawInstance) -> tuple[str, int, str]:
    launched = raw.get("LaunchTime")
    stamp = launched.isoformat() if isinstance(launched, datetime) else ""
    return stamp, int(raw.get("AmiLaunchIndex", 0)), str(raw["InstanceId"])


def _chunks(ids: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(ids), MAX_FILTER_VALUES):
        yield ids[start : start + MAX_FILTER_VALUES]
