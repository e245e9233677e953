"""The Azure adapter, with the real azure-mgmt-compute client, against the loopback fake."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azure.core.credentials import AccessToken
from fakes.azure_fake import RESOURCE_GROUP, SUBSCRIPTION, FakeAzure, _sku_json

from harnesses import ErrorKind, FabricSeen
from spotd.core.values import LaunchRequest, Market, Offering
from spotd_azure import AzureProvider, AzureSettings, RetailPrices
from spotd_azure.clients import compute_client, network_client
from spotd_azure.scaleset import placement_id, split_member

GANG_SIZE = "Standard_ND96isr_H100_v5"
TESTS_DIR = Path(__file__).resolve().parents[1]

FAKE_TOKEN = "fake-token-7c1d9e-never-log-me"

# The error each kind gets from the fake: (ARM code, HTTP status, through the async operation).
FAILURES: dict[ErrorKind, tuple[str, int, bool]] = {
    "capacity": ("ZonalAllocationFailed", 200, True),
    "quota": ("OperationNotAllowed", 409, False),
    "throttle": ("TooManyRequests", 429, False),
    "auth": ("InvalidAuthenticationToken", 401, False),
    "server": ("InternalServerError", 500, False),
}


class FakeCredential:
    """A token credential that never leaves the machine (azure-identity is not used)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken(FAKE_TOKEN, int(time.time()) + 3600)


def settings_for(fake: FakeAzure, **overrides: Any) -> AzureSettings:
    """Settings of a launchable provider pointed at ``fake``."""
    base: dict[str, Any] = {
        "enabled": True, "subscription_id": SUBSCRIPTION, "resource_group": RESOURCE_GROUP,
        "regions": ["eastus", "westus3"], "arm_endpoint": fake.url, "prices_url": fake.url,
        "subnet_id": {r: f"/subscriptions/{SUBSCRIPTION}/resourceGroups/net/providers/"
                         f"Microsoft.Network/virtualNetworks/vnet/subnets/{r}"
                      for r in ("eastus", "westus3")},
        "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTests spotd",
    }  # fmt: skip
    base.update(overrides)
    return AzureSettings(**base)


def bootstrap(request: LaunchRequest) -> str:
    """A stand-in for spotd's agent bootstrap: the command and the node's env."""
    env = " ".join(f"{k}={v}" for k, v in sorted(request.env.items()))
    return f"#!/bin/sh\n# {env}\nexec {' '.join(request.command)}\n"


def make_provider(fake: FakeAzure, *, polling_interval: float = 0,
                  **overrides: Any) -> AzureProvider:  # fmt: skip
    """The real adapter and SDK clients against ``fake``, polling without delay."""
    settings = settings_for(fake, **overrides)
    credential = FakeCredential()
    compute = compute_client(settings, credential, polling_interval=polling_interval)
    network = network_client(settings, credential, polling_interval=polling_interval)
    return AzureProvider(settings, custom_data=bootstrap, compute=compute, network=network,
                         prices=RetailPrices(settings.prices_url))  # fmt: skip


CHILD = """
import pickle, sys
from fakes.azure_fake import FakeAzure
from harnesses.azure import make_provider

class Url:
    url = sys.argv[1]

request = pickle.loads(open(sys.argv[2], "rb").read())
# Polling slowly: the held operation never ends and the child is killed.
make_provider(Url(), polling_interval=0.2).launch(request)  # type: ignore[arg-type]
"""
"""The child of :meth:`AzureHarness.launch_in_child`: the real adapter, launching once."""


@dataclass
class AzureHarness:
    provider: AzureProvider
    fake: FakeAzure
    makes_placements = True

    def launchable(self) -> Offering:
        return next(o for o in self.provider.offerings()
                    if o.gpus_per_node == 1 and o.price(Market.SPOT))  # fmt: skip

    def command(self) -> tuple[str, ...]:
        return ("python", "-m", "train")

    def supports(self, kind: ErrorKind) -> bool:
        return kind in FAILURES

    def fail_next_launch(self, kind: ErrorKind) -> None:
        code, status, via_operation = FAILURES[kind]
        self.fake.fail_next_put(code, status=status, via_operation=via_operation)

    def interrupt(self, instance_id: str) -> None:
        self.fake.evict(instance_id)

    def settle(self) -> None:
        time.sleep(0.02)

    def gang_offering(self) -> Offering:
        return next(o for o in self.provider.offerings()
                    if o.pool.instance_type == GANG_SIZE and o.price(Market.SPOT))  # fmt: skip

    def fabric_seen(self, instance_ids: Sequence[str]) -> FabricSeen:
        """Each VM's scale set (as its PlacementObject id) and its set's accelerated NICs."""
        placements, interfaces = set(), []
        for instance_id in instance_ids:
            parts = split_member(instance_id)
            assert parts is not None, f"{instance_id} is not a VM of a scale set"
            model = self.fake.set_model(parts[0])
            assert model is not None and model.properties is not None
            placements.add(placement_id(model.location, parts[0]))
            profile = model.properties.virtual_machine_profile
            nics = profile.network_profile.network_interface_configurations or [] \
                if profile and profile.network_profile else []  # fmt: skip
            interfaces.append(
                sum(1 for n in nics if n.properties and n.properties.enable_accelerated_networking)
            )
        return FabricSeen(frozenset(placements), tuple(interfaces))

    def expected_interfaces(self, instance_type: str) -> int:
        """Fabric NICs per node by the fake's SKU capabilities.

        An ND size's InfiniBand HCAs come with the size (``RdmaEnabled``) and
        take no NIC entry in the request, so the fabric interfaces a request
        can carry are its accelerated-networking NICs: one on an RDMA size
        that supports accelerated networking, none otherwise.
        """
        sku = next(s for s in self.fake.skus if s.size == instance_type)
        caps = {c["name"]: c["value"] for c in _sku_json(sku)["capabilities"]}
        return int(
            caps.get("RdmaEnabled") == "True" and caps.get("AcceleratedNetworkingEnabled") == "True"
        )

    def launch_in_child(self, request: LaunchRequest, tmp_path: Path) -> subprocess.Popen[bytes]:
        # The fake never finishes scale set operations: the child waits in its
        # launch's poller, the set (and its VMs, creating) already there.
        self.fake.hold_sets = True
        pickled = tmp_path / "azure-child-request.pickle"
        pickled.write_bytes(pickle.dumps(request))
        env_path = f"{TESTS_DIR}:{TESTS_DIR.parent}"
        return subprocess.Popen([sys.executable, "-c", CHILD, self.fake.url, str(pickled)],
                                env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})  # fmt: skip


@contextmanager
def make_harness(tmp_path: Path) -> Iterator[AzureHarness]:
    with FakeAzure() as fake:
        provider = make_provider(fake)
        try:
            yield AzureHarness(provider, fake)
        finally:
            provider.close()
