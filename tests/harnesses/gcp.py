"""The GCP adapter (real compute_v1 / billing_v1 REST clients) against the loopback fake."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fakes.gcp_fake import PROJECT, GcpFake
from google.auth.credentials import AnonymousCredentials

from harnesses import ERROR_KINDS, ErrorKind
from spotd.core.values import LaunchRequest, Market, Offering
from spotd_gcp import GcpProvider, GcpSettings, build_gcp_provider

ZONES = ["us-central1-a", "us-central1-b", "us-east4-a", "europe-west4-a"]


def bootstrap(request: LaunchRequest) -> str:
    """Stands in for the agent's bootstrap renderer (written elsewhere)."""
    return f"#!/bin/sh\n# spotd agent for {request.tags.get('spotd-job', '?')}\n"


def settings_for(fake: GcpFake, **overrides: object) -> GcpSettings:
    """Settings pointing both APIs at the fake."""
    values: dict[str, object] = {
        "enabled": True, "project": PROJECT, "zones": ZONES, "api_endpoint": fake.url,
        "billing_endpoint": fake.url, "image": "projects/fake-images/global/images/family/gpu",
        "request_timeout_seconds": 10.0, "operation_timeout_seconds": 10.0,
    }  # fmt: skip
    values.update(overrides)
    return GcpSettings.model_validate(values)


def provider_for(fake: GcpFake, **overrides: object) -> GcpProvider:
    return build_gcp_provider(
        settings_for(fake, **overrides), startup_script=bootstrap,
        credentials=AnonymousCredentials(),
    )  # fmt: skip


class GcpHarness:
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


@contextmanager
def make_harness(tmp_path: Path) -> Iterator[GcpHarness]:
    fake = GcpFake()
    fake.start()
    try:
        yield GcpHarness(provider_for(fake), fake)
    finally:
        fake.stop()
