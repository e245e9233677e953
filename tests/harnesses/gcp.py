"""The GCP adapter (real compute_v1 / billing_v1 REST clients) against the loopback fake."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from fakes.gcp_fake import FABRIC_NICS, PROJECT, GcpFake, gpu_networks_config
from google.auth.credentials import AnonymousCredentials

from harnesses import ERROR_KINDS, ErrorKind, FabricSeen
from spotd.core.values import LaunchRequest, Market, Offering
from spotd_gcp import GcpProvider, GcpSettings, build_gcp_provider, naming

ZONES = ["us-central1-a", "us-central1-b", "us-east4-a", "europe-west4-a"]


def bootstrap(request: LaunchRequest) -> str:
    """Stands in for the agent's bootstrap renderer (written elsewhere)."""
    return f"#!/bin/sh\n# spotd agent for {request.tags.get('spotd-job', '?')}\n"


def settings_for(fake: GcpFake, **overrides: object) -> GcpSettings:
    """Settings pointing both APIs at the fake."""
    values: dict[str, object] = {
        "enabled": True, "project": PROJECT, "zones": ZONES, "api_endpoint": fake.url,
        "billing_endpoint": fake.url, "image": "projects/fake-images/global/images/family/gpu",
        "resource_manager_endpoint": fake.url, "gpu_networks": gpu_networks_config(),
        "request_timeout_seconds": 10.0, "operation_timeout_seconds": 10.0,
    }  # fmt: skip
    values.update(overrides)
    return GcpSettings.model_validate(values)


def provider_for(fake: GcpFake, **overrides: object) -> GcpProvider:
    return build_gcp_provider(
        settings_for(fake, **overrides), startup_script=bootstrap,
        credentials=AnonymousCredentials(),
    )  # fmt: skip


GANG_TYPE = "a3-megagpu-8g"
"""The gang offering's type: 8 gVNIC GPU NICs (GPUDirect-TCPXO)."""

CHILD = """
import pickle, sys
from google.auth.credentials import AnonymousCredentials
from spotd_gcp import GcpSettings, build_gcp_provider
settings = GcpSettings.model_validate_json(open(sys.argv[1]).read())
request = pickle.load(open(sys.argv[2], "rb"))
provider = build_gcp_provider(settings, startup_script=lambda r: "#!/bin/sh\\n",
                              credentials=AnonymousCredentials())
provider.launch(request)
"""
"""The child of :meth:`GcpHarness.launch_in_child`: the real adapter, launching once."""


class GcpHarness:
    makes_placements = True

    def __init__(self, provider: GcpProvider, fake: GcpFake) -> None:
        self.provider = provider
        self.fake = fake

    def launchable(self) -> Offering:
        return next(
            o for o in self.provider.offerings()
            if o.gpus_per_node == 1 and o.price(Market.SPOT)
        )  # fmt: skip

    def command(self) -> tuple[str, ...]:
        return ("python", "train.py")

    def supports(self, kind: ErrorKind) -> bool:
        return kind in ERROR_KINDS

    def fail_next_launch(self, kind: ErrorKind) -> None:
        self.fake.fail_next_insert(kind)

    def interrupt(self, instance_id: str) -> None:
        zone, name = instance_id.split("/", 1)
        self.fake.preempt(zone, name)

    def settle(self) -> None:
        time.sleep(0.01)

    def gang_offering(self) -> Offering:
        return next(
            o for o in self.provider.offerings()
            if o.pool.instance_type == GANG_TYPE and o.price(Market.SPOT)
        )  # fmt: skip

    def fabric_seen(self, instance_ids: Sequence[str]) -> FabricSeen:
        placements: set[str] = set()
        interfaces = []
        for iid in instance_ids:
            zone, name = iid.split("/", 1)
            seen, fabric = self.fake.fabric_of(zone, name)
            placements |= seen
            interfaces.append(fabric)
        return FabricSeen(frozenset(placements), tuple(interfaces))

    def expected_interfaces(self, instance_type: str) -> int:
        return FABRIC_NICS[instance_type][1]

    def launch_in_child(self, request: LaunchRequest, tmp_path: Path) -> subprocess.Popen[bytes]:
        # The fake never answers these inserts: the child is stuck after its policy exists.
        self.fake.hold_names |= {naming.instance_name(request.client_token, r)
                                 for r in range(request.nodes)}  # fmt: skip
        settings = tmp_path / "gcp-child-settings.json"
        settings.write_text(settings_for(self.fake, request_timeout_seconds=120.0,
                                         operation_timeout_seconds=120.0).model_dump_json())
        pickled = tmp_path / "gcp-child-request.pickle"
        pickled.write_bytes(pickle.dumps(request))
        return subprocess.Popen([sys.executable, "-c", CHILD, str(settings), str(pickled)])


@contextmanager
def make_harness(tmp_path: Path) -> Iterator[GcpHarness]:
    fake = GcpFake()
    fake.start()
    try:
        yield GcpHarness(provider_for(fake), fake)
    finally:
        fake.stop()
