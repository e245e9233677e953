"""The ranking's tie-break: on an exact tie of expected cost, the job's GPU models in the
order it lists them ("best first"), then pool and market; never anything but ties."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from spotd.core.network import Fabric, Interconnect
from spotd.core.spec import JobSpec
from spotd.core.values import Candidate, Market, Offering, PlacementContext, Pool
from spotd_policies.base import rank_key
from spotd_policies.cheapest import CheapestPolicy

NOW = datetime(2026, 6, 1, tzinfo=UTC)
A100 = Offering(
    pool=Pool("aws", "us-east-1", "us-east-1a", "p4d.24xlarge"),
    gpu="A100", gpus_per_node=8, gpu_memory_gb=80,
    interconnect=Interconnect(Fabric.EFA, 400), spot_price=30.0, on_demand_price=90.0,
    capacity=1.0,
)  # fmt: skip
# Same price, a pool that sorts after the A100's: only the GPU order can put it first.
H100 = replace(A100, pool=Pool("gcp", "us-east4", "us-east4-a", "a3-highgpu-8g"), gpu="H100")


def ctx(gpus: list[str]) -> PlacementContext:
    spec = JobSpec.model_validate({
        "name": "j", "command": ["true"],
        "resources": {"gpus": gpus, "gpus_per_node": 8}, "market": {"type": "spot"},
    })  # fmt: skip
    return PlacementContext(job_id="j-test", spec=spec, now=NOW)


@pytest.mark.parametrize("gpus", [["H100", "A100"], ["A100", "H100"]])
def test_a_tie_goes_to_the_gpu_the_job_lists_first(gpus: list[str]) -> None:
    decision = CheapestPolicy().place(ctx(gpus), [A100, H100])
    assert decision.choice is not None and decision.choice.offering.gpu == gpus[0]
    usable = [c.offering.gpu for c in decision.candidates if c.excluded is None]
    assert usable == gpus, "the ranking shown follows the same order"


def test_a_cheaper_offering_still_wins_over_the_preferred_gpu() -> None:
    cheaper = replace(A100, spot_price=29.99)
    decision = CheapestPolicy().place(ctx(["H100", "A100"]), [cheaper, H100])
    assert decision.choice is not None and decision.choice.offering.gpu == "A100"


def test_the_key_orders_cost_then_preference_then_pool_and_market() -> None:
    key = rank_key(ctx(["H100", "A100"]))

    def candidate(off: Offering, cost: float) -> Candidate:
        return Candidate(off, Market.SPOT, 1, 30.0, cost)

    a, h = candidate(A100, 10.0), candidate(H100, 10.0)
    other = candidate(replace(H100, pool=Pool("aws", "us-east-1", "us-east-1b", "p5")), 10.0)
    unlisted = candidate(replace(A100, gpu="L4"), 10.0)
    assert sorted([unlisted, a, h, candidate(A100, 9.0)], key=key)[0].expected_cost_usd == 9.0
    assert sorted([unlisted, a, h], key=key) == [h, a, unlisted]
    assert sorted([h, other], key=key) == [other, h], "then the pool, as before"
