"""The AWS adapter against moto plus botocore hooks, as a contract-suite harness."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fakes.aws_fake import FakeAws, aws_env, new_session
from moto import mock_aws

from harnesses import ErrorKind
from spotd.core.values import LaunchRequest, Market, Offering
from spotd_aws import AwsProvider, AwsSettings

REGION = "us-east-1"

# (code, HTTP status) EC2 answers with for each kind; InsufficientInstanceCapacity
# really comes as a 500, which is why the adapter maps codes before statuses.
ERRORS: dict[ErrorKind, tuple[str, int]] = {
    "capacity": ("InsufficientInstanceCapacity", 500),
    "quota": ("VcpuLimitExceeded", 400),
    "throttle": ("RequestLimitExceeded", 503),
    "auth": ("AuthFailure", 401),
    "server": ("InternalError", 500),
}


def bootstrap(request: LaunchRequest) -> str:
    """Stands in for the agent's bootstrap renderer (written elsewhere)."""
    return f"#!/bin/sh\n# spotd agent for {request.tags.get('spotd-job', '?')}\n"


def seed_market(fake: FakeAws) -> None:
    """A small made-up market: spot well under on-demand, good scores."""
    for zone in ("us-east-1a", "us-east-1b", "us-east-1c"):
        fake.add_spot_price(zone, "g5.xlarge", 0.42)  # made up
        fake.add_spot_price(zone, "p5.48xlarge", 31.5)  # made up
        fake.scores[(zone, "g5.xlarge")] = 8
        fake.scores[(zone, "p5.48xlarge")] = 3
    fake.on_demand[(REGION, "g5.xlarge")] = 1.006  # made up
    fake.on_demand[(REGION, "p5.48xlarge")] = 55.04  # made up


class AwsHarness:
    def __init__(self, provider: AwsProvider, fake: FakeAws) -> None:
        self.provider = provider
        self.fake = fake

    def launchable(self) -> Offering:
        return next(
            o for o in self.provider.offerings()
            if o.capacity and o.gpus_per_node == 1 and o.price(Market.SPOT)
        )  # fmt: skip

    def command(self) -> tuple[str, ...]:
        return ("python", "train.py")

    def supports(self, kind: ErrorKind) -> bool:
        return kind in ERRORS

    def fail_next_launch(self, kind: ErrorKind) -> None:
        self.fake.fail_next("RunInstances", *ERRORS[kind])

    def interrupt(self, instance_id: str) -> None:
        self.fake.interrupt(instance_id, REGION)

    def settle(self) -> None:
        """moto changes state at once: nothing to wait for."""


@contextmanager
def make_harness(tmp_path: Path) -> Iterator[AwsHarness]:
    with aws_env(tmp_path), mock_aws():
        fake = FakeAws()
        seed_market(fake)
        session = new_session()
        fake.install(session)
        settings = AwsSettings(
            enabled=True, regions=[REGION], instance_types=["g5.xlarge", "p5.48xlarge"],
            image_id={REGION: fake.ami(REGION)},
        )  # fmt: skip
        yield AwsHarness(AwsProvider(settings, user_data=bootstrap, session=session), fake)
