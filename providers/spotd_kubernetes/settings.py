"""The ``[providers.kubernetes]`` settings: which cluster, where pods go, what pools cost.

Nothing secret lives here: the cluster's credentials come from the kubeconfig (or the
pod's service account when spotd runs inside the cluster).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from spotd.core.endpoints import checked_endpoint
from spotd.core.values import Market

from .figures import CLOUD_PROVIDERS, NOTICE_SECONDS, SPOT_LABELS


class KubernetesPool(BaseModel):
    """What spotd cannot read from a node pool's nodes: its price, its fabric's speed."""

    model_config = ConfigDict(extra="forbid")

    price_per_gpu_hour: float = Field(default=0.0, ge=0)
    """USD per GPU-hour of the pool's non-spot nodes (reserved or on-premises: what
    running there costs the team, 0 when it is paid for already)."""
    spot_price_per_gpu_hour: float | None = Field(default=None, ge=0)
    """USD per GPU-hour of its spot nodes; None: ``price_per_gpu_hour``."""
    gbps_per_node: float | None = Field(default=None, gt=0)
    """Scale-out bandwidth per node; None: from spotd's instance-type tables, else
    ``default_fabric_gbps_per_node`` for a pool with fabric devices."""

    def priced_markets(self) -> frozenset[Market]:
        """The markets this table gives a price for: both with ``price_per_gpu_hour``
        (the spot price falls back to it), spot only with ``spot_price_per_gpu_hour``."""
        if "price_per_gpu_hour" in self.model_fields_set:
            return frozenset(Market)
        if self.spot_price_per_gpu_hour is not None:
            return frozenset({Market.SPOT})
        return frozenset()


class KubernetesSettings(BaseModel):
    """The ``[providers.kubernetes]`` table: one cluster whose GPU node pools spotd uses."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    auth: Literal["auto", "kubeconfig", "in-cluster"] = "auto"
    """``in-cluster``: the pod's service account; ``kubeconfig``: ``kubeconfig`` and
    ``context``; ``auto``: in-cluster when ``KUBERNETES_SERVICE_HOST`` is set."""
    kubeconfig: str = ""
    """Path of the kubeconfig file; empty: ``KUBECONFIG``, else ``~/.kube/config``."""
    context: str = ""
    """Context of the kubeconfig; empty: its current context."""
    api_endpoint: str | None = None
    """API server URL with no credentials (tests and fakes; ``http://`` only on loopback)."""
    namespace: str = "spotd"
    """Namespace of the pods of jobs without a team, or of a team not in ``team_namespaces``."""
    team_namespaces: dict[str, str] = Field(default_factory=dict)
    """Team -> namespace its jobs' pods run in."""
    image: str = ""
    """Image of jobs that name none (``[container] image``); it needs bash and python3."""
    pool_label: str = ""
    """A node label naming pools, looked at before the clouds' own ones."""
    spot_label: str = ""
    """``key=value`` marking spot nodes, besides the clouds' own labels."""
    pools: dict[str, KubernetesPool] = Field(default_factory=dict)
    """Pool name -> its price and fabric. A market of a pool with no price here costs
    what the cloud its nodes run on sells the instance type for (``cloud_providers``),
    else 0."""
    cloud_providers: dict[str, str] = Field(default_factory=dict)
    """``spec.providerID`` scheme -> the enabled provider whose offerings price pools of
    such nodes, over the defaults (``aws``: aws, ``gce``: gcp, ``azure``: azure); an
    empty name prices that cloud's pools at 0 (or their ``pools`` price)."""
    default_fabric_gbps_per_node: float = Field(default=100.0, gt=0)
    """Scale-out bandwidth of a node with fabric devices spotd has no figure for."""
    notice_seconds: int = Field(default=NOTICE_SECONDS, ge=1)
    """The pods' termination grace period: the notice of an eviction or a drain."""
    schedule_timeout_seconds: float = Field(default=60.0, gt=0)
    """How long a launch waits for the scheduler to bind every pod of a gang."""
    wait_for_autoscaler: bool = False
    """False: a pod the scheduler finds no room for fails the launch at once (the pool
    is full); True: it waits ``schedule_timeout_seconds`` for a node to be added."""
    schedule_poll_seconds: float = Field(default=1.0, gt=0)
    tolerations: list[dict[str, str]] = Field(default_factory=list)
    """Extra tolerations of every pod (``{key, operator, value, effect}``)."""
    priority_class: str = ""
    """``priorityClassName`` of the pods; empty: the cluster's default."""
    service_account: str = ""
    """Service account the pods run as; empty: the namespace's ``default``."""
    request_timeout_seconds: float = Field(default=30.0, gt=0)

    @field_validator("api_endpoint")
    @classmethod
    def _plain_http_only_on_loopback(cls, value: str | None) -> str | None:
        return checked_endpoint(value)

    @field_validator("spot_label")
    @classmethod
    def _key_and_value(cls, value: str) -> str:
        if value and not all(value.partition("=")[::2]):
            raise ValueError(f"spot_label must be key=value, got {value!r}")
        return value

    def cloud_provider(self, scheme: str) -> str:
        """The provider pricing pools whose nodes' providerID has ``scheme``; "" for none."""
        return {**CLOUD_PROVIDERS, **self.cloud_providers}.get(scheme, "")

    def namespace_of(self, team: str | None) -> str:
        """The namespace of a team's pods."""
        return self.team_namespaces.get(team or "", self.namespace)

    def namespaces(self) -> list[str]:
        """Every namespace spotd's pods may be in."""
        return sorted({self.namespace, *self.team_namespaces.values()})

    def spot_labels(self) -> dict[str, tuple[str, ...]]:
        """Label -> values marking spot nodes, the configured one included."""
        labels = dict(SPOT_LABELS)
        if self.spot_label:
            key, _, value = self.spot_label.partition("=")
            labels[key] = (*labels.get(key, ()), value)
        return labels
