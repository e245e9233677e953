"""Every shipped example, planned on the embedded default, keeps what its comments promise.

Each file is loaded with the spec loader ``spotd plan`` uses and planned by
:func:`spotd.daemon.planning.plan_job`, the code behind ``spotd plan FILE``, on the
simulated market of a default configuration. Its clock is pinned (an epoch, and a
speed at which a test's seconds are milliseconds of it), so each plan is the same
on every run. A new example needs its promises here: the first test says so.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path

import pytest

from spotd.core.outlook import CostBasis, DeadlineVerdict
from spotd.core.spec import JobSpec
from spotd.core.spec_io import load_job_file
from spotd.core.values import ExclusionKind
from spotd.daemon.config import Settings, load_settings
from spotd.daemon.planning import CandidateView, PlanView, plan_job

EXAMPLES = Path(str(resources.files("spotd.examples")))


def settings(tmp_path: Path, epoch: datetime) -> Settings:
    """A default configuration (the simulated market), its clock standing at ``epoch``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = tmp_path / "spotd.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "state"}"\n'
        f"[providers.sim]\nspeed = 0.001\nepoch = {epoch.isoformat()}\n"
    )
    return load_settings(config)


def planned(tmp_path: Path, name: str, *, before_deadline: timedelta | None = None,
            edit: Callable[[str], str] | None = None) -> tuple[JobSpec, PlanView]:  # fmt: skip
    """The example's spec and its plan, ``before_deadline`` its ``finish_by`` (default: a
    fixed day), with ``edit`` applied to its text first."""
    path = EXAMPLES / name
    if edit is not None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        path = tmp_path / name
        path.write_text(edit((EXAMPLES / name).read_text()))
    spec = load_job_file(path)
    epoch = EPOCH
    if before_deadline is not None:
        assert spec.deadline is not None and spec.deadline.finish_by is not None
        epoch = spec.deadline.finish_by - before_deadline
    return spec, plan_job(spec, settings(tmp_path / "plan", epoch))


EPOCH = datetime.fromisoformat("2026-12-01T00:00:00+00:00")


def usable(view: PlanView) -> list[CandidateView]:
    return [c for c in view.candidates if c.excluded is None]


def per_gpu_hour(c: CandidateView) -> float:
    return c.price_per_hour / (c.nodes * c.gpus_per_node)


# -- job.toml ---------------------------------------------------------------------


def check_job(tmp_path: Path) -> None:
    spec, view = planned(tmp_path, "job.toml")
    # "This file runs as it is on the embedded default": a spot node of one GPU it takes.
    c = view.choice
    assert c is not None and c.market == "spot"
    assert c.gpu in spec.resources.gpus and (c.nodes, c.gpus_per_node) == (1, 1)
    # "max_price_per_gpu_hour = 3.5: offers above it are never used".
    assert all(per_gpu_hour(x) <= 3.5 for x in usable(view))
    # "max_usd = 5.0": nothing expected to cost more is usable.
    assert all(x.expected_cost_usd <= 5.0 for x in usable(view))
    # No compute_hours: the plan says its figures are one hour's, and gives no verdict.
    assert view.covers is not None and view.covers.basis is CostBasis.ONE_HOUR
    assert view.deadline is None


# -- deadline.toml ----------------------------------------------------------------


def check_deadline(tmp_path: Path) -> None:
    # "compute_hours = 36.0 on the GPUs asked for: 1 node of 8", from its first GPU.
    _, view = planned(tmp_path, "deadline.toml", before_deadline=timedelta(days=10))
    assert view.covers is not None
    assert (view.covers.basis, view.covers.compute_hours) == (CostBasis.WORK_LEFT, 36.0)
    assert (view.covers.reference_gpu, view.covers.nodes, view.covers.gpus_per_node) == (
        "A100", 1, 8,
    )  # fmt: skip
    # "run on spot while there is slack": ten days for 36 hours.
    c = view.choice
    assert c is not None and c.market == "spot"
    assert view.deadline is not None and view.deadline.verdict is DeadlineVerdict.MEETS
    assert view.deadline.slack_hours is not None and view.deadline.slack_hours > 200
    # regions ["us-*", "europe-*"], and the 3000 USD budget.
    assert all(x.region.startswith(("us-", "europe-")) for x in usable(view))
    assert c.expected_cost_usd <= 3000.0
    # Under 36 hours before its finish_by, a new job cannot make it: the plan says so.
    _, late = planned(tmp_path / "late", "deadline.toml", before_deadline=timedelta(hours=30))
    assert late.deadline is not None and late.deadline.verdict is DeadlineVerdict.CANNOT_MEET
    assert late.deadline.fails_at_once


# -- multinode-70b.toml -----------------------------------------------------------


def check_multinode(tmp_path: Path) -> None:
    spec, view = planned(tmp_path, "multinode-70b.toml")
    # "4 nodes of 8 H100" on sim-aws (EFA) or sim-azure (InfiniBand), at 400 Gbps/GPU.
    c = view.choice
    assert c is not None and c.gpu in ("H100", "H200") and (c.nodes, c.gpus_per_node) == (4, 8)
    assert (c.provider, c.interconnect.fabric) in {("sim-aws", "efa"),
                                                   ("sim-azure", "infiniband")}  # fmt: skip
    assert c.interconnect.gbps_per_gpu >= 400 and per_gpu_hour(c) <= 6.0
    # Its InfiniBand: every ND H100 v5 of sim-azure in a US region passes every rule of
    # what the offering and the job are (region, provider, fabric); capacity may lack.
    infiniband = [x for x in view.candidates
                  if x.interconnect.fabric == "infiniband" and x.gpu == "H100"]  # fmt: skip
    in_us = [x for x in infiniband if x.region in ("eastus", "westus3")]
    assert in_us, "the simulated market sells the ND H100 v5 in US regions"
    assert all(x.excluded_kind is None or not ExclusionKind(x.excluded_kind).static
               for x in in_us)  # fmt: skip
    assert any(x.excluded is None for x in in_us), "one has spot capacity on this clock"
    # On Azure alone, it plans onto InfiniBand, with the team's preflight figure.
    _, azure = planned(
        tmp_path / "azure",
        "multinode-70b.toml",
        edit=lambda text: text.replace(
            'providers = ["aws", "azure", "sim-aws", "sim-azure"]', 'providers = ["sim-azure"]'
        ),
    )
    assert azure.choice is not None and azure.choice.interconnect.fabric == "infiniband"
    assert azure.preflight_min_busbw_gbps == spec.preflight.min_busbw_gbps == 40.0


PROMISES: dict[str, Callable[[Path], None]] = {
    "job.toml": check_job,
    "deadline.toml": check_deadline,
    "multinode-70b.toml": check_multinode,
}


def test_every_shipped_example_has_its_promises_checked() -> None:
    assert {p.name for p in EXAMPLES.glob("*.toml")} == set(PROMISES), "a new example: add it"


@pytest.mark.parametrize("name", sorted(PROMISES))
def test_each_example_plans_as_its_comments_say(name: str, tmp_path: Path) -> None:
    PROMISES[name](tmp_path)


def test_the_deadline_example_rides_spot_a_year_before_its_deadline(tmp_path: Path) -> None:
    _, view = planned(tmp_path, "deadline.toml", before_deadline=timedelta(days=384))
    assert view.choice is not None and view.choice.market == "spot"
