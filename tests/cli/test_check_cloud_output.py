"""What ``spotd check-cloud`` prints for each cloud, from the real adapters against their fakes.

Per cloud: a 4-node H100 job checked as the daemon would launch it there prints
one ``pass`` line per check and what a launch would create; with one failure
injected into the fake (a missing permission), exactly one ``FAIL`` line,
naming the permission.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import spotd.cli.render.market as cli
from spotd.core.spec import JobSpec
from spotd.daemon.cloudcheck import check_providers
from spotd.daemon.config import Settings

DENY: dict[str, tuple[Callable[[Any], None], str]] = {
    "aws": (lambda fake: fake.fail_next("CreatePlacementGroup", "UnauthorizedOperation", 403),
            "permission ec2:CreatePlacementGroup"),
    "gcp": (lambda fake: fake.denied.add("compute.instances.create"),
            "permission compute.instances.create"),
    "azure": (lambda fake: setattr(fake, "denied",
                                   {"Microsoft.Compute/virtualMachineScaleSets/write"}),
              "permission Microsoft.Compute/virtualMachineScaleSets/write"),
}  # fmt: skip


@pytest.fixture(params=sorted(DENY))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    module = importlib.import_module(f"harnesses.{request.param}")
    with module.make_harness(tmp_path) as h:
        yield h


def gang_job(harness: Any) -> JobSpec:
    offering = harness.gang_offering()
    return JobSpec.model_validate({
        "name": "gang", "command": ["torchrun", "train.py"],
        "resources": {"gpus": [offering.gpu], "gpus_per_node": offering.gpus_per_node,
                      "nodes": 4, "min_gbps_per_gpu": 100},
    })  # fmt: skip


def printed(harness: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    console = Console(record=True, width=200, color_system=None)
    monkeypatch.setattr(cli, "out", console)
    settings = Settings(data_dir=tmp_path / "state")
    provider = harness.provider
    for check in check_providers({provider.name: provider}, gang_job(harness), settings):
        cli.print_check(check)
    return console.export_text().splitlines()


def test_every_check_prints_a_pass_and_what_would_be_made(
    harness: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = printed(harness, tmp_path, monkeypatch)
    name = harness.provider.name
    assert lines[0] == f"{name}: ready", "\n".join(lines)
    checks = [line for line in lines if line.startswith("  pass ") or line.startswith("  FAIL ")]
    assert len(checks) >= 4 and all(line.startswith("  pass ") for line in checks)
    assert any("permission" in line for line in checks)
    made = lines.index("  a launch would create (nothing was created):")
    assert any("4" in line for line in lines[made + 1 :]), "the gang's nodes are listed"


def test_an_injected_failure_prints_one_fail_line_naming_it(
    harness: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = harness.provider.name
    harness.provider.offerings()  # read before the fake changes, as a daemon has
    inject, check = DENY[name]
    inject(harness.fake)
    lines = printed(harness, tmp_path, monkeypatch)
    assert lines[0] == f"{name}: not ready"
    (fail,) = [line for line in lines if line.startswith("  FAIL ")]
    assert fail.startswith(f"  FAIL {check}: "), fail
