"""Settings of the AWS adapter: the ``[providers.aws]`` table.

Nothing secret lives here: credentials come only from boto3's standard chain
(environment, shared config and credentials files, SSO, instance or container
role), optionally narrowed to one named ``profile``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator


class AwsSettings(BaseModel):
    """Where and how spotd buys EC2 GPU capacity."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Whether the daemon offers AWS pools at all."""
    regions: list[str] = Field(default_factory=lambda: ["us-east-1", "us-west-2"])
    """Regions whose zones are polled for offerings and searched for instances."""
    instance_types: list[str] | None = None
    """Instance types to offer; None means every AWS type in :mod:`spotd.market.catalog`."""
    endpoint_url: str | None = None
    """Override of the EC2, STS, Service Quotas and FIS endpoint (fakes and tests only).

    None uses AWS's own."""
    pricing_region: str = "us-east-1"
    """Region of the Price List API endpoint (it exists in only a few regions)."""
    image_id: dict[str, str] = Field(default_factory=dict)
    """Region -> AMI the nodes boot (a GPU image with drivers and spotd's agent)."""
    subnet_ids: dict[str, str] = Field(default_factory=dict)
    """Availability zone name -> subnet to launch into; zones left out use the default VPC."""
    security_group_ids: list[str] = Field(default_factory=list)
    """Security groups of every node; empty uses the VPC's default group."""
    public_address: bool = True
    """Whether a node may get a public IPv4 address (as its subnet decides); false asks
    for none. A node with EFA interfaces gets none either way (EC2 gives a public
    address only to a lone interface): it needs a NAT gateway or endpoints to reach
    the daemon, the package index and S3, which ``spotd check-cloud`` checks."""
    gang_security_group_ids: dict[str, str] = Field(default_factory=dict)
    """Region -> security group given to every node of a multi-node gang, for EFA.

    It must allow all traffic in from and out to itself; spotd uses it as it is.
    A region left out gets ``spotd-gang``, made by spotd once per VPC with those rules.
    """
    instance_profile: str | None = None
    """IAM instance profile (name or ARN) the nodes run as, e.g. to read checkpoints."""
    key_name: str | None = None
    """EC2 key pair for SSH to the nodes; None launches without one."""
    profile: str | None = None
    """Named profile of the shared AWS config; None uses boto3's default chain."""
    fis_role_arn: str | None = None
    """IAM role AWS Fault Injection Service assumes to interrupt a spot instance for
    ``spotd drill`` (it needs ``ec2:SendSpotInstanceInterruptions``); None: drills are
    refused on AWS."""

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint_is_a_url(cls, value: str | None) -> str | None:
        # botocore refuses a bad one only at the first call, as a bare ValueError.
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"endpoint_url must be an http(s) URL, got {value!r}")
        return value
