"""The AWS adapter against moto plus botocore hooks, as a contract-suite harness.

Everything runs on moto's in-process mock, taught placement groups by
``fakes.aws_fake.moto_placement_groups``. Only ``launch_in_child`` needs more:
the child process cannot reach the in-process mock, so ``MotoLoopback`` serves
that mock on 127.0.0.1 the first time (moto's ``ThreadedMotoServer`` would need
Flask): one process, one set of moto backends, so what the child creates is
seen here.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import boto3
from fakes.aws_fake import (
    FABRIC,
    FakeAws,
    MotoLoopback,
    aws_env,
    moto_placement_groups,
    nat_for_default_vpc,
    new_session,
)
from moto import mock_aws

from harnesses import ErrorKind, FabricSeen
from spotd.core.values import LaunchRequest, Market, Offering
from spotd_aws import AwsProvider, AwsSettings

REGION = "us-east-1"
FIS_ROLE = "arn:aws:iam::123456789012:role/spotd-fis"
"""The role drills name (moto keeps it, nothing checks it)."""
GANG_TYPE = "p5.48xlarge"

# (code, HTTP status) EC2 answers with for each kind; InsufficientInstanceCapacity
# really comes as a 500, which is why the adapter maps codes before statuses.
ERRORS: dict[ErrorKind, tuple[str, int]] = {
    "capacity": ("InsufficientInstanceCapacity", 500),
    "quota": ("VcpuLimitExceeded", 400),
    "throttle": ("RequestLimitExceeded", 503),
    "auth": ("AuthFailure", 401),
    "server": ("InternalError", 500),
}

CHILD = """
import pickle, sys, time
from fakes.aws_fake import new_session
from spotd_aws import AwsProvider, AwsSettings

settings = AwsSettings.model_validate_json(sys.argv[1])
with open(sys.argv[2], "rb") as f:
    request = pickle.load(f)
session = new_session()
# Hold the launch once the placement group exists: the parent SIGKILLs us here.
session.events.register("before-call.ec2.RunInstances", lambda **_: time.sleep(3600))
AwsProvider(settings, user_data=lambda r: "#!/bin/sh\\n", session=session).launch(request)
"""


def bootstrap(request: LaunchRequest) -> str:
    """Stands in for the agent's bootstrap renderer (written elsewhere)."""
    return f"#!/bin/sh\n# spotd agent for {request.tags.get('spotd-job', '?')}\n"


def seed_market(fake: FakeAws) -> None:
    """A small made-up market: spot well under on-demand, good scores."""
    for zone in ("us-east-1a", "us-east-1b", "us-east-1c"):
        fake.add_spot_price(zone, "g5.xlarge", 0.42)  # made up
        fake.add_spot_price(zone, GANG_TYPE, 31.5)  # made up
        fake.scores[(zone, "g5.xlarge")] = 8
        fake.scores[(zone, GANG_TYPE)] = 3
    fake.on_demand[(REGION, "g5.xlarge")] = 1.006  # made up
    fake.on_demand[(REGION, GANG_TYPE)] = 55.04  # made up


class AwsHarness:
    makes_placements = True

    def __init__(self, provider: AwsProvider, fake: FakeAws, settings: AwsSettings) -> None:
        self.provider = provider
        self.fake = fake
        self.settings = settings
        self.stack = ExitStack()
        self._server_url: str | None = None

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

    # -- gangs -------------------------------------------------------------------

    def gang_offering(self) -> Offering:
        return next(
            o for o in self.provider.offerings()
            if o.pool.instance_type == GANG_TYPE and o.price(Market.SPOT)
        )  # fmt: skip

    def fabric_seen(self, instance_ids: Sequence[str]) -> FabricSeen:
        """From what moto's (patched) RunInstances received for each instance."""
        seen = [FABRIC[i] for i in instance_ids]
        return FabricSeen(
            placements=frozenset(f"{f.region}/{f.placement_group}" for f in seen
                                 if f.placement_group),
            interfaces=tuple(f.efa_interfaces for f in seen),
        )  # fmt: skip

    def expected_interfaces(self, instance_type: str) -> int:
        """moto's own catalog: the type's MaximumEfaInterfaces."""
        ec2 = boto3.client("ec2", region_name=REGION)  # unhooked
        (row,) = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
        return int(row["NetworkInfo"]["EfaInfo"]["MaximumEfaInterfaces"])

    def launch_in_child(self, request: LaunchRequest, tmp_path: Path) -> subprocess.Popen[bytes]:
        settings = self.settings.model_copy(update={"endpoint_url": self._server()})
        pickled = tmp_path / "request.pickle"
        pickled.write_bytes(pickle.dumps(request))
        tests = str(Path(__file__).resolve().parents[1])
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, settings.model_dump_json(), str(pickled)],
            env=_child_env(tests),
        )

    def _server(self) -> str:
        if self._server_url is None:
            server = MotoLoopback()
            self.stack.callback(server.stop)
            self._server_url = server.url
        return self._server_url


def _child_env(tests: str) -> dict[str, str]:
    env = dict(os.environ)  # aws_env's fake credentials and no config files
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tests, env.get("PYTHONPATH")) if p)
    return env


@contextmanager
def make_harness(tmp_path: Path) -> Iterator[AwsHarness]:
    with aws_env(tmp_path), mock_aws(), moto_placement_groups():
        fake = FakeAws()
        seed_market(fake)
        nat_for_default_vpc(REGION)  # the gang's EFA nodes have no public address
        session: Any = new_session()
        fake.install(session)
        settings = AwsSettings(
            enabled=True, regions=[REGION], instance_types=["g5.xlarge", GANG_TYPE],
            image_id={REGION: fake.ami(REGION)}, fis_role_arn=FIS_ROLE,
        )  # fmt: skip
        harness = AwsHarness(
            AwsProvider(settings, user_data=bootstrap, session=session), fake, settings
        )
        with harness.stack:
            yield harness
