"""docs/training.md's Preflight section says what the code does: the fabric floors,
the checks, their reasons, and who is at fault for each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spotd.core.agent_wire import PreflightCheckName, PreflightFailure
from spotd.core.fabric_env import PROFILES
from spotd.core.network import Fabric
from spotd.engine.gang import JOB_FAILURES

TRAINING = Path(__file__).resolve().parent.parent / "docs" / "training.md"
RATES = (100, 200, 400)
"""The per-GPU line rates (Gbit/s) the floor table shows, in its column order."""


def section() -> str:
    text = TRAINING.read_text(encoding="utf-8")
    start = text.index("\n## Preflight\n")
    return text[start : text.index("\n## ", start + 1)]


def floor_rows() -> dict[str, list[str]]:
    """The floor table: fabric cell -> the other cells."""
    found: dict[str, list[str]] = {}
    for line in section().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 1 + 1 + len(RATES):
            found[cells[0]] = cells[1:]
    return found


def figure(value: float | None) -> str:
    return "none" if value is None else f"{value:g} GB/s"


@pytest.mark.parametrize("fabric", list(Fabric))
def test_the_floor_table_is_the_fabric_tables(fabric: Fabric) -> None:
    cells = floor_rows()[f"`{fabric.value}`"]
    profile = PROFILES[fabric]
    share = "none" if profile.busbw_share is None else f"{profile.busbw_share * 100:g} %"
    assert cells[0] == share
    assert cells[1:] == [figure(profile.min_busbw_gbps(rate)) for rate in RATES]


def check_rows() -> list[tuple[set[str], set[str], str]]:
    """(checks, reasons, fault) of each row of the checks table."""
    found = []
    for line in section().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 4:
            found.append((set(re.findall(r"`([a-z_]+)`", cells[0])),
                          set(re.findall(r"`([a-z-]+)`", cells[1])), cells[3]))  # fmt: skip
    return found


def test_every_check_and_reason_is_in_the_checks_table() -> None:
    table = check_rows()
    checks = set().union(*(c for c, _, _ in table))
    reasons = set().union(*(r for _, r, _ in table))
    unlisted = {PreflightCheckName.OTHER, PreflightCheckName.PREFLIGHT}
    assert checks == {n.value for n in PreflightCheckName} - {n.value for n in unlisted}
    assert reasons == {f.value for f in PreflightFailure} - {PreflightFailure.OTHER.value}


def test_the_job_is_at_fault_where_the_daemon_says_so() -> None:
    for _, reasons, fault in check_rows():
        for reason in reasons - {PreflightFailure.PEER_FAILED.value}:  # the other node's
            expected = "the job" if PreflightFailure(reason) in JOB_FAILURES else "the pool"
            assert fault == expected, (reason, fault)
