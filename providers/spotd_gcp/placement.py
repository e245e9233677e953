"""Compact placement resource policies: one per multi-node attempt.

A gang's nodes go on hosts close together when their instances name one
``COLLOCATED`` group placement policy with ``vm_count`` = the gang's size.
The policy is regional, created before the instances (an "already exists"
from a retried launch is fine), deleted when the attempt ends and reaped
when orphaned.

Resource policies carry no labels, so spotd keeps its tags in the policy's
``description`` as JSON (``{"spotd": {"tags": {...}, "launch": <token hash>}}``)
and recognises its own by the name prefix ``spotd-pp-`` plus that JSON.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import compute_v1

from spotd.core.errors import NotFoundError
from spotd.core.values import LaunchRequest, PlacementObject

from .clients import GcpClients
from .errors import is_already_exists, map_gcp_errors
from .naming import MAX_NAME, NAME_PATTERN, request_id, token_hash
from .operations import wait_for
from .settings import GcpSettings, region_of

KIND = "resource-policy"
PREFIX = "spotd-pp-"
"""Name prefix of every resource policy spotd creates."""
POLICY_RANK = -1
"""The "rank" the policy's request id derives from (nodes are 0..n-1)."""


_INVALID = re.compile(r"[^a-z0-9]+")


def policy_name(client_token: str) -> str:
    """The policy's name: readable from the token (job and attempt), unique by its hash.

    ``spotd-pp-<sanitised token, cut>-<8 hex of sha256>``: GCE's
    ``[a-z]([-a-z0-9]*[a-z0-9])?`` within 63 characters.
    """
    readable = _INVALID.sub("-", client_token.lower()).strip("-")
    digest = hashlib.sha256(client_token.encode()).hexdigest()[:8]
    room = MAX_NAME - len(PREFIX) - len(digest) - 1
    cut = readable[:room].strip("-")
    name = f"{PREFIX}{cut}-{digest}" if cut else f"{PREFIX}{digest}"
    if len(name) > MAX_NAME or not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"bad resource policy name {name!r}")
    return name


def description(tags: Mapping[str, str], client_token: str) -> str:
    """The JSON that stands in for the labels a resource policy cannot have."""
    return json.dumps(
        {"spotd": {"tags": dict(tags), "launch": token_hash(client_token)}}, sort_keys=True
    )


def tags_of(policy: Any) -> dict[str, str] | None:
    """The spotd tags stored in a policy's description; None when it is not spotd's."""
    if not str(policy.name).startswith(PREFIX):
        return None
    try:
        loaded = json.loads(policy.description or "")
    except ValueError:
        return None
    mark = loaded.get("spotd") if isinstance(loaded, dict) else None
    tags = mark.get("tags") if isinstance(mark, dict) else None
    if not isinstance(tags, dict):
        return None
    return {str(k): str(v) for k, v in tags.items()}


def resource_policy(request: LaunchRequest) -> compute_v1.ResourcePolicy:
    """The compact placement policy body of a gang launch."""
    return compute_v1.ResourcePolicy(
        name=policy_name(request.client_token),
        region=region_of(request.offering.pool.zone),
        description=description(request.tags, request.client_token),
        group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(
            collocation="COLLOCATED", vm_count=request.nodes
        ),
    )


def insert_request(project: str, request: LaunchRequest) -> compute_v1.InsertResourcePolicyRequest:
    """The insert call of the gang's policy, with a request id stable across retries."""
    return compute_v1.InsertResourcePolicyRequest(
        project=project,
        region=region_of(request.offering.pool.zone),
        resource_policy_resource=resource_policy(request),
        request_id=request_id(request.client_token, POLICY_RANK),
    )


def policy_url(project: str, request: LaunchRequest) -> str:
    """What ``Instance.resource_policies`` names the gang's policy by: the request's own,
    or for nodes joining a running gang, the policy its first launch made."""
    region = region_of(request.offering.pool.zone)
    token = request.client_token if request.joins is None else request.joins.client_token
    name = policy_name(token)
    return f"projects/{project}/regions/{region}/resourcePolicies/{name}"


def placement_id(region: str, name: str) -> str:
    """spotd's id of a policy: ``region/name`` (names are unique per region only)."""
    return f"{region}/{name}"


def split_placement(placement: PlacementObject) -> tuple[str, str] | None:
    """``(region, name)`` of one of our placement ids, None for anything else."""
    region, sep, name = placement.id.partition("/")
    if not sep or not name.startswith(PREFIX) or not NAME_PATTERN.fullmatch(name):
        return None
    return region, name


def to_placement(region: str, policy: Any, tags: Mapping[str, str]) -> PlacementObject:
    """The spotd view of one of its resource policies."""
    return PlacementObject(
        id=placement_id(region, str(policy.name)), kind=KIND, region=region, tags=dict(tags)
    )


def matching(
    region: str, policies: Sequence[Any], tags: Mapping[str, str]
) -> list[PlacementObject]:
    """spotd's policies among ``policies`` whose stored tags include ``tags``."""
    found = []
    for policy in policies:
        stored = tags_of(policy)
        if stored is not None and tags.items() <= stored.items():
            found.append(to_placement(region, policy, stored))
    return found


class GcpPolicies:
    """The resource policy calls: create one for a gang, list and delete spotd's.

    Every call goes through :func:`~.errors.map_gcp_errors` with ``retry=None``,
    as the adapter's instance calls do.
    """

    def __init__(
        self, settings: GcpSettings, timeout: float, monotonic: Callable[[], float]
    ) -> None:
        self._settings = settings
        self._timeout = timeout
        self._monotonic = monotonic

    def ensure(self, clients: GcpClients, request: LaunchRequest) -> None:
        """Create the gang's policy and wait for it; one that exists already is fine."""
        body = insert_request(clients.project, request)
        name = body.resource_policy_resource.name
        with map_gcp_errors(f"insert resource policy {body.region}/{name}"):
            try:
                operation = clients.resource_policies.insert_unary(
                    request=body, retry=None, timeout=self._timeout
                )
            except gexc.GoogleAPICallError as exc:
                if is_already_exists(exc):
                    return  # made by an earlier call with this token
                raise
        self._wait(clients, body.region, operation)

    def require(self, clients: GcpClients, url: str) -> None:
        """Read the policy ``url`` (``projects/P/regions/R/resourcePolicies/N``) that nodes
        joining a running gang name; raises NotFoundError when it is gone (GCE would
        refuse their insert as an invalid request, which fails a job, not a launch)."""
        region, name = url.split("/regions/", 1)[1].split("/resourcePolicies/", 1)
        with map_gcp_errors(f"get resource policy {region}/{name}"):
            clients.resource_policies.get(project=clients.project, region=region,
                                          resource_policy=name, retry=None,
                                          timeout=self._timeout)  # fmt: skip

    def list(self, clients: GcpClients, tags: Mapping[str, str]) -> list[PlacementObject]:
        """spotd's policies in the configured zones' regions whose tags include ``tags``."""
        found: list[PlacementObject] = []
        for region in sorted({region_of(z) for z in self._settings.zones}):
            try:
                with map_gcp_errors(f"listing resource policies of {region}"):
                    pages = clients.resource_policies.list(
                        request=compute_v1.ListResourcePoliciesRequest(
                            project=clients.project, region=region),
                        retry=None, timeout=self._timeout,
                    )  # fmt: skip
                    found += matching(region, list(pages), tags)
            except NotFoundError:
                continue  # a region the project does not know: nothing of ours there
        return found

    def delete(self, clients: GcpClients, placements: Sequence[PlacementObject]) -> None:
        """Delete these policies; gone ones are ignored, "in use" raises ProviderError."""
        for placement in placements:
            where = split_placement(placement)
            if where is None:
                continue  # not one of ours: never touch it
            region, name = where
            try:
                with map_gcp_errors(f"delete resource policy {region}/{name}"):
                    operation = clients.resource_policies.delete_unary(
                        project=clients.project, region=region, resource_policy=name,
                        retry=None, timeout=self._timeout,
                    )  # fmt: skip
                self._wait(clients, region, operation)
            except NotFoundError:
                continue

    def _wait(self, clients: GcpClients, region: str, operation: Any) -> None:
        def wait(name: str, seconds: float) -> Any:
            return clients.region_operations.wait(
                project=clients.project, region=region, operation=name, retry=None, timeout=seconds
            )

        timeout = self._settings.operation_timeout_seconds
        wait_for(operation, wait, timeout_seconds=timeout, monotonic=self._monotonic)
