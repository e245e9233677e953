"""The Azure adapter, with the real azure-mgmt-compute client, against the loopback fake."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from azure.core.credentials import AccessToken
from fakes.azure_fake import RESOURCE_GROUP, SUBSCRIPTION, FakeAzure

from harnesses import ErrorKind
from spotd.core.values import LaunchRequest, Market, Offering
from spotd_azure import AzureProvider, AzureSettings, RetailPrices
from spotd_azure.clients import compute_client

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


def make_provider(fake: FakeAzure, **overrides: Any) -> AzureProvider:
    """The real adapter and SDK client against ``fake``, polling without delay."""
    settings = settings_for(fake, **overrides)
    compute = compute_client(settings, FakeCredential(), polling_interval=0)
    return AzureProvider(settings, custom_data=bootstrap, compute=compute,
                         prices=RetailPrices(settings.prices_url))  # fmt: skip


@dataclass
class AzureHarness:
    provider: AzureProvider
    fake: FakeAzure

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


@contextmanager
def make_harness(tmp_path: Path) -> Iterator[AzureHarness]:
    with FakeAzure() as fake:
        provider = make_provider(fake)
        try:
            yield AzureHarness(provider, fake)
        finally:
            provider.close()
