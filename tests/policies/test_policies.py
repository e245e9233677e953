"""The placement policies: hard filters, expected cost, properties.

Deadline control has its own tests: test_deadline.py.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotd.core import progress
from spotd.core.network import Fabric, Interconnect
from spotd.core.spec import JobSpec
from spotd.core.values import Candidate, ExclusionKind, Market, Offering, PlacementContext, Pool
from spotd.market.cache import OfferingIndex
from spotd_policies import costmodel
from spotd_policies.balanced import BalancedPolicy, expected_cost
from spotd_policies.base import every_usable, fastest_usable
from spotd_policies.cheapest import CheapestPolicy
from spotd_policies.filters import first_exclusion, over_budget
from spotd_policies.on_demand import OnDemandPolicy
from spotd_policies.planned import PlannedPolicy
from spotd_sim import build_sim_providers

NOW = datetime(2026, 6, 1, tzinfo=UTC)
POLICIES = [BalancedPolicy, CheapestPolicy, OnDemandPolicy, PlannedPolicy]


def job(**over: object) -> JobSpec:
    body: dict[str, object] = {
        "name": "j",
        "command": ["true"],
        "resources": {"gpus": ["H100"], "gpus_per_node": 8, "nodes": 1},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}  # type: ignore[dict-item]
        else:
            body[key] = value
    return JobSpec.model_validate(body)


def ctx(spec: JobSpec, **kw: object) -> PlacementContext:
    return PlacementContext(job_id="j-test", spec=spec, now=NOW, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def sim_market(tmp_path_factory: pytest.TempPathFactory) -> list[Offering]:
    providers = build_sim_providers(
        tmp_path_factory.mktemp("sim"), seed=2, speed=1.0, mean_up_hours=1e6,
        mean_down_hours=1.0, boot_seconds=0, sim_epoch=NOW,
    )
    return [o for p in providers for o in p.offerings()]


# -- acceptance on the simulated market ------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_70b_four_nodes_never_below_800_gbps(policy: type, sim_market: list[Offering]) -> None:
    spec = job(resources={"gpus": ["B300", "H100"], "nodes": 4, "model_size_b": 70})
    decision = policy().place(ctx(spec), sim_market)
    assert decision.choice is not None
    assert decision.choice.offering.interconnect.gbps_per_gpu >= 800
    cheaper = [
        c for c in decision.candidates
        if c.offering.gpu == "H100" and c.price_per_hour < decision.choice.price_per_hour
    ]
    assert cheaper, "the market should hold cheaper H100 offerings that lose on fabric"
    for c in cheaper:
        assert c.excluded is not None and "800 Gbps/GPU" in c.excluded.detail
        assert c.excluded.kind is ExclusionKind.FABRIC


@pytest.mark.parametrize("policy", [BalancedPolicy, CheapestPolicy])
def test_one_node_job_takes_cheapest_adequate_gpu(policy: type, sim_market: list[Offering]) -> None:
    spec = job(resources={"gpus": ["A100", "L40S", "A10G"], "gpus_per_node": 1})
    decision = policy().place(ctx(spec), sim_market)
    assert decision.choice is not None and decision.choice.market is Market.SPOT
    one_gpu_spot = [
        o for o in sim_market
        if o.gpus_per_node == 1 and o.gpu in ("A100", "L40S", "A10G") and o.capacity
    ]
    chosen = decision.choice.offering
    # Ethernet at 10 Gbps is fine for one node: the fabric does not count.
    if policy is CheapestPolicy:
        assert chosen.spot_price == min(o.spot_price or 1e9 for o in one_gpu_spot)
    assert decision.choice.breakdown.get("efficiency", 1.0) == 1.0


def test_one_node_balanced_weighs_gpu_speed(sim_market: list[Offering]) -> None:
    """A slower GPU needs more hours for the same work: the score counts them."""
    from spotd.core import facts

    spec = job(resources={"gpus": ["A100", "A10G"], "gpus_per_node": 1},
               deadline={"compute_hours": 10})
    decision = BalancedPolicy().place(ctx(spec), sim_market)
    hours = {c.offering.gpu: c.breakdown["work_hours"] for c in decision.candidates
             if c.excluded is None}
    assert hours["A100"] == pytest.approx(10)
    assert hours["A10G"] == pytest.approx(10 * facts.gpu_speed("A100") / facts.gpu_speed("A10G"))
    best = decision.choice
    assert best is not None
    assert best.expected_cost_usd == min(
        c.expected_cost_usd for c in decision.candidates if c.excluded is None
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_7b_two_nodes_accepts_200_gbps(policy: type, sim_market: list[Offering]) -> None:
    spec = job(resources={"gpus": ["A100"], "nodes": 2, "model_size_b": 7})
    decision = policy().place(ctx(spec), sim_market)
    ok = {c.offering.pool.instance_type for c in decision.candidates if c.excluded is None}
    assert "Standard_ND96asr_v4" in ok, "HDR InfiniBand at 200 Gbps/GPU passes for 7B... "
    assert "p4d.24xlarge" not in ok, "...and EFA at 50 Gbps/GPU does not"
    spec_small = job(resources={"gpus": ["A100"], "nodes": 2, "model_size_b": 3})
    small = policy().place(ctx(spec_small), sim_market)
    assert small.choice is not None and small.choice.offering.interconnect.gbps_per_gpu >= 200


def test_override_of_the_bandwidth_rule(sim_market: list[Offering]) -> None:
    spec = job(resources={"gpus": ["A100"], "nodes": 2, "model_size_b": 70,
                          "min_gbps_per_gpu": 40})
    choice = BalancedPolicy().place(ctx(spec), sim_market).choice
    assert choice is not None and choice.offering.interconnect.gbps_per_gpu >= 40


@pytest.mark.parametrize("policy", POLICIES)
def test_price_cap_and_budget_hold(policy: type, sim_market: list[Offering]) -> None:
    capped = job(market={"max_price_per_gpu_hour": 6.0})
    decision = policy().place(ctx(capped), sim_market)
    # H100 spot is under 6 USD/GPU-hour here, on-demand is not.
    assert (decision.choice is None) == (policy is OnDemandPolicy)
    for c in decision.candidates:
        if c.excluded is None:
            assert (c.offering.price(c.market) or 0) / c.offering.gpus_per_node <= 6.0
    broke = job(budget={"max_usd": 1.0}, deadline={"compute_hours": 100})
    assert policy().place(ctx(broke), sim_market).choice is None
    spent = job(budget={"max_usd": 5000.0}, deadline={"compute_hours": 10})
    assert policy().place(ctx(spent, spent_usd=4999.0), sim_market).choice is None


def test_gpu_types_never_mixed(sim_market: list[Offering]) -> None:
    spec = job(resources={"gpus": ["H100", "A100"], "nodes": 2, "model_size_b": 3})
    choice = BalancedPolicy().place(ctx(spec), sim_market).choice
    assert choice is not None
    # One offering is one instance type: every node of the gang gets the same GPU.
    assert choice.nodes == 2 and choice.offering.gpu in ("H100", "A100")


def test_running_job_stays_unless_the_saving_pays(sim_market: list[Offering]) -> None:
    spec = job(resources={"gpus": ["A100"], "gpus_per_node": 1},
               deadline={"compute_hours": 2}, checkpoint={"size_gb": 500})
    policy = BalancedPolicy()
    best = policy.place(ctx(spec), sim_market).choice
    assert best is not None
    ranked = [c for c in policy.place(ctx(spec), sim_market).candidates if c.excluded is None]
    runner_up = next(c for c in ranked if c.offering.pool.provider != best.offering.pool.provider)
    here = ctx(spec, current=runner_up.offering.pool, current_market=runner_up.market)
    stay = policy.place(here, sim_market).choice
    assert stay is not None
    assert stay.offering.pool == runner_up.offering.pool, (
        "moving a 500 GB checkpoint across providers for a 2-hour job does not pay"
    )


# -- properties ----------------------------------------------------------------------

FABRICS = list(Fabric)


@st.composite
def offerings(draw: st.DrawFn) -> list[Offering]:
    n = draw(st.integers(1, 12))
    out = []
    for i in range(n):
        gpus = draw(st.sampled_from([1, 8]))
        od = draw(st.floats(1, 100))
        spot = draw(st.one_of(st.none(), st.floats(0.2, 1.0).map(lambda f, od=od: f * od)))
        out.append(Offering(
            pool=Pool(draw(st.sampled_from(["aws", "gcp", "azure"])),
                      draw(st.sampled_from(["us-east-1", "eu-west-1"])), f"z{i}", f"t{i}"),
            gpu=draw(st.sampled_from(["H100", "A100", "L4"])),
            gpus_per_node=gpus, gpu_memory_gb=80,
            interconnect=Interconnect(draw(st.sampled_from(FABRICS)),
                                      draw(st.sampled_from([10, 50, 200, 400, 800]))),
            spot_price=spot, on_demand_price=od,
            capacity=draw(st.one_of(st.none(), st.sampled_from([0.0, 0.3, 1.0]))),
        ))
    return out


@st.composite
def specs(draw: st.DrawFn) -> JobSpec:
    body: dict[str, object] = {
        "name": "p", "command": ["true"],
        "resources": {
            "gpus": draw(st.lists(st.sampled_from(["H100", "A100", "L4"]), min_size=1,
                                  max_size=3, unique=True)),
            "gpus_per_node": draw(st.sampled_from([1, 8])),
            "nodes": draw(st.integers(1, 4)),
            "model_size_b": draw(st.sampled_from([1.0, 13.0, 70.0])),
        },
        "market": {"type": draw(st.sampled_from(["spot", "on-demand", "auto"]))},
        "deadline": {"compute_hours": draw(st.floats(0.5, 50))},
    }
    if draw(st.booleans()):
        body["budget"] = {"max_usd": draw(st.floats(10, 1e5))}
    if draw(st.booleans()):
        body["market"] = {**body["market"], "max_price_per_gpu_hour": draw(st.floats(0.5, 12))}  # type: ignore[dict-item]
    return JobSpec.model_validate(body)


@pytest.mark.parametrize("policy", POLICIES)
@given(market=offerings(), spec=specs())
@settings(max_examples=150, deadline=None)
def test_choice_passes_every_hard_filter(
    policy: type, market: list[Offering], spec: JobSpec
) -> None:
    c = ctx(spec)
    decision = policy().place(c, market)
    if decision.choice is not None:
        ch = decision.choice
        assert first_exclusion(c, ch.offering, ch.market) is None
        assert over_budget(c, ch.expected_cost_usd) is None
        assert ch.excluded is None
    feasible = [x for x in decision.candidates if x.excluded is None]
    assert (decision.choice is not None) == bool(feasible), "a feasible market gets a choice"


@pytest.mark.parametrize("policy", POLICIES)
@given(market=offerings(), spec=specs(), pick=st.integers(0, 11), factor=st.floats(1.01, 5))
@settings(max_examples=150, deadline=None)
def test_raising_a_price_never_makes_it_more_preferred(
    policy: type, market: list[Offering], spec: JobSpec, pick: int, factor: float
) -> None:
    from dataclasses import replace

    target = market[pick % len(market)]
    dearer = replace(
        target,
        spot_price=target.spot_price * factor if target.spot_price else None,
        on_demand_price=(target.on_demand_price or 1.0) * factor,
    )
    before = _rank(policy().place(ctx(spec), market), target.pool)
    after = _rank(policy().place(ctx(spec), [dearer if o is target else o for o in market]),
                  target.pool)
    assert after >= before


def _rank(decision: object, pool: Pool) -> int:
    usable = [c for c in decision.candidates if c.excluded is None]  # type: ignore[attr-defined]
    for i, c in enumerate(usable):
        if c.offering.pool == pool:
            return i
    return len(usable) + 1000


@given(market=offerings(), spec=specs(), capacity_off=st.booleans())
@settings(max_examples=200, deadline=None)
def test_fast_screen_agrees_with_the_filters(
    market: list[Offering], spec: JobSpec, capacity_off: bool
) -> None:
    from spotd_policies.filters import Screen

    cooling = {market[0].pool: "preempted"} if capacity_off else {}
    c = ctx(spec, cooldown=cooling)
    screen = Screen(c)
    for off in market:
        for m in Market:
            assert screen.reason(off, m) == first_exclusion(c, off, m)


@pytest.mark.parametrize("policy", [BalancedPolicy, CheapestPolicy])
@given(market=offerings(), spec=specs())
@settings(max_examples=150, deadline=None)
def test_best_first_finds_the_cheapest_of_the_full_ranking(
    policy: type, market: list[Offering], spec: JobSpec
) -> None:
    from spotd.core.spec import deadline_controlled

    decision = policy().place(ctx(spec), market)
    usable = [c for c in decision.candidates if c.excluded is None]
    if deadline_controlled(spec) or not usable:
        return
    assert decision.choice is not None
    assert decision.choice.expected_cost_usd == pytest.approx(
        min(c.expected_cost_usd for c in usable)
    )


@pytest.fixture(scope="module")
def cloud_market(tmp_path_factory: pytest.TempPathFactory) -> list[Offering]:
    """Offerings of the three real adapters, polled from their test fakes."""
    from contextlib import ExitStack

    import harnesses.aws
    import harnesses.azure
    import harnesses.gcp

    root = tmp_path_factory.mktemp("clouds")
    with ExitStack() as stack:
        found: list[Offering] = []
        for module in (harnesses.aws, harnesses.gcp, harnesses.azure):
            h = stack.enter_context(module.make_harness(root / module.__name__))
            found.extend(h.provider.offerings())
        return found


def test_cloud_fakes_70b_never_below_800(cloud_market: list[Offering]) -> None:
    spec = job(resources={"gpus": ["H100", "H200", "B200"], "nodes": 4, "model_size_b": 70})
    decision = BalancedPolicy().place(ctx(spec), cloud_market)
    h100 = [
        c for c in decision.candidates
        if c.offering.gpu == "H100" and c.offering.gpus_per_node == 8
    ]
    assert h100, "the fakes offer 8x H100 nodes"
    assert decision.choice is None or decision.choice.offering.interconnect.gbps_per_gpu >= 800
    for c in h100:
        if c.offering.interconnect.gbps_per_gpu < 800:
            assert c.excluded and "800 Gbps/GPU" in c.excluded.detail


def test_cloud_fakes_one_node_cheapest_whatever_fabric(cloud_market: list[Offering]) -> None:
    gpus = sorted({o.gpu for o in cloud_market if o.gpus_per_node == 1})
    spec = job(resources={"gpus": gpus, "gpus_per_node": 1})
    decision = CheapestPolicy().place(ctx(spec), cloud_market)
    assert decision.choice is not None
    spot = [o.spot_price for o in cloud_market if o.gpus_per_node == 1 and o.spot_price
            and (o.capacity is None or o.capacity > 0)]
    assert decision.choice.offering.spot_price == min(spot)
    assert {c.offering.pool.provider for c in decision.candidates} >= {"aws", "gcp", "azure"}


# -- the search for the fastest usable offering (policies/spotd_policies/base.py) ----------------


def test_fastest_usable_scores_only_what_is_faster(sim_market: list[Offering]) -> None:
    """The fastest on-demand offering a 2-node H100/A100 job may use (InfiniBand H100 of
    the simulated market), found while scoring only offerings faster than the best so far."""
    spec = job(resources={"gpus": ["H100", "A100"], "nodes": 2, "model_size_b": 13})
    here = ctx(spec)
    index = OfferingIndex.of(sim_market)

    def speed(off: Offering) -> float:
        return progress.efficiency(spec, off) * progress.speed(spec, off)

    scored: list[Offering] = []
    score = expected_cost(here)

    def counting(off: Offering, market: Market) -> Candidate:
        scored.append(off)
        return score(off, market)

    found = fastest_usable(here, index, Market.ON_DEMAND, counting, speed=speed)
    everyone = every_usable(here, index, Market.ON_DEMAND, score)
    assert found is not None and everyone
    assert speed(found.offering) == max(speed(c.offering) for c in everyone)
    assert found.offering.gpu == "H100" and found.offering.interconnect.fabric is Fabric.INFINIBAND
    assert len(scored) < len(everyone), "slower offerings are not scored"
    # Known candidates as the start: the fastest of them unless the market holds a faster one.
    slowest = min(everyone, key=lambda c: speed(c.offering))
    assert speed(slowest.offering) < speed(found.offering)
    again = fastest_usable(here, index, Market.ON_DEMAND, score, speed=speed, start=[slowest])
    assert again is not None and speed(again.offering) == speed(found.offering)
    assert fastest_usable(here, index, Market.ON_DEMAND, score, speed=speed,
                          start=[found]) is found


# -- the cost model's preemption loss (spotd_policies.costmodel) ---------------------------------


def test_a_checkpoint_on_the_notice_takes_the_lost_work_out_of_the_estimate() -> None:
    """An 80 GB checkpoint (80 s at 1 GB/s, 10 s to react) fits in AWS's 120 s notice, not
    in GCP's 30 s: on the first a preemption costs only the changeover; a job that does not
    checkpoint on the notice loses half an interval on both."""
    def spot(provider: str, notice: int) -> Offering:
        return Offering(
            pool=Pool(provider, "r", "z", "h100-8x"), gpu="H100", gpus_per_node=8,
            gpu_memory_gb=80, interconnect=Interconnect(Fabric.INFINIBAND, 400),
            spot_price=20.0, on_demand_price=60.0, capacity=0.5, notice_seconds=notice,
        )

    aws, gcp = spot("aws", 120), spot("gcp", 30)
    for on_notice in (True, False):
        spec = job(checkpoint={"size_gb": 80, "interval": 1800, "on_notice": on_notice},
                   deadline={"compute_hours": 10})
        here = ctx(spec, changeover_hours=0.2)
        on_aws = costmodel.estimate(here, aws, Market.SPOT)
        on_gcp = costmodel.estimate(here, gcp, Market.SPOT)
        assert on_gcp.lost_per_preemption_hours == pytest.approx(0.25)
        assert on_aws.lost_per_preemption_hours == (0.0 if on_notice else pytest.approx(0.25))
        assert (on_aws.preemption_overhead_hours < on_gcp.preemption_overhead_hours) is on_notice
        assert on_aws.breakdown()["lost_per_preemption_hours"] == on_aws.lost_per_preemption_hours
    # On-demand is never preempted: its overhead is the periodic writes alone (80 s
    # every half hour), which the job makes there too.
    od = costmodel.estimate(here, aws, Market.ON_DEMAND)
    assert od.lost_per_preemption_hours == 0.0 or od.preemptions_per_hour == 0.0
    assert od.preemption_overhead_hours == pytest.approx(od.work_hours * (80 / 3600) / 0.5)


# -- exclusion kinds ---------------------------------------------------------------

GOOD = Offering(
    pool=Pool("sim-aws", "us-east-1", "us-east-1a", "p5.48xlarge"),
    gpu="H100", gpus_per_node=8, gpu_memory_gb=80,
    interconnect=Interconnect(Fabric.EFA, 400), spot_price=40.0, on_demand_price=98.0,
    capacity=1.0,
)  # fmt: skip


def _exclusion_cases() -> list[tuple[ExclusionKind, PlacementContext, Offering, Market]]:
    from dataclasses import replace

    base = job()
    spot = Market.SPOT
    return [
        (ExclusionKind.GPU_MODEL, ctx(base), replace(GOOD, gpu="A100"), spot),
        (ExclusionKind.GPUS_PER_NODE, ctx(base), replace(GOOD, gpus_per_node=4), spot),
        (ExclusionKind.FABRIC, ctx(job(resources={"nodes": 4, "model_size_b": 70})), GOOD, spot),
        (ExclusionKind.PROVIDER, ctx(job(market={"providers": ["gcp"]})), GOOD, spot),
        (ExclusionKind.REGION, ctx(job(market={"regions": ["eu-*"]})), GOOD, spot),
        (ExclusionKind.NOT_SOLD, ctx(base), replace(GOOD, spot_price=None), spot),
        (ExclusionKind.PRICE_CAP, ctx(job(market={"max_price_per_gpu_hour": 1.0})), GOOD, spot),
        (ExclusionKind.NO_CAPACITY, ctx(base), replace(GOOD, capacity=0.0), spot),
        (ExclusionKind.COOLING_DOWN, ctx(base, cooldown={GOOD.pool: "preempted in us-east-1a"}),
         GOOD, spot),
    ]  # fmt: skip


def test_every_hard_filter_names_its_kind_and_the_screen_agrees() -> None:
    from spotd_policies.filters import Screen

    cases = _exclusion_cases()
    for kind, c, off, market in cases:
        assert first_exclusion(ctx(job()), GOOD, market) is None, "the base offering passes"
        found = first_exclusion(c, off, market)
        assert found is not None and found.kind is kind, (kind, found)
        assert found.detail and str(found) == found.detail
        assert Screen(c).reason(off, market) == found
    budget = over_budget(ctx(job(budget={"max_usd": 10.0}), spent_usd=4.0), 7.5)
    assert budget is not None and budget.kind is ExclusionKind.OVER_BUDGET
    assert budget.detail == "expected cost 7.50 USD is over the 6.00 USD left in budget"
    covered = {kind for kind, *_ in cases} | {ExclusionKind.OVER_BUDGET}
    assert covered == set(ExclusionKind), "a test case for every kind"


def test_only_capacity_and_cooldowns_rule_an_offering_out_for_now() -> None:
    transient = {k for k in ExclusionKind if k.transient}
    assert transient == {ExclusionKind.NO_CAPACITY, ExclusionKind.COOLING_DOWN}


def test_balanced_tells_passing_exclusions_by_kind_not_by_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataclasses import replace

    from spotd.core.values import Exclusion
    from spotd_policies import balanced, filters

    cooled = replace(GOOD, pool=replace(GOOD.pool, zone="us-east-1b"))
    empty = replace(GOOD, pool=replace(GOOD.pool, zone="us-east-1c"), capacity=0.0)
    elsewhere = replace(GOOD, pool=Pool("sim-aws", "us-west-2", "us-west-2a", "p5.48xlarge"))
    c = ctx(job(market={"regions": ["us-east-1"]}), cooldown={cooled.pool: "preempted"})
    # Reworded messages change nothing: the policy reads the kind.
    monkeypatch.setattr(filters, "cooldown", lambda *_: Exclusion(
        ExclusionKind.COOLING_DOWN, "resting a while"))  # fmt: skip
    monkeypatch.setattr(filters, "spot_capacity", lambda *_: Exclusion(
        ExclusionKind.NO_CAPACITY, "full up"))  # fmt: skip
    market = OfferingIndex.of([GOOD, cooled, empty, elsewhere])
    found = {o.pool.zone for o in balanced._spot_offerings(c, market)}
    assert found == {"us-east-1a", "us-east-1b", "us-east-1c"}


def test_the_plan_view_keeps_the_message_and_adds_the_kind() -> None:
    from spotd.daemon.planning import CandidateView, candidate_view

    c = ctx(job(market={"type": "auto"}),
            cooldown={GOOD.pool: "preempted in us-east-1a (1x in us-east-1)"})
    decision = CheapestPolicy().place(c, [GOOD])
    (view,) = [candidate_view(x) for x in decision.candidates if x.market is Market.SPOT]
    dumped = view.model_dump(mode="json")
    assert dumped["excluded"] == "pool cooling down: preempted in us-east-1a (1x in us-east-1)"
    assert dumped["excluded_kind"] == "cooling-down"
    assert CandidateView.model_validate(dumped).excluded_kind is ExclusionKind.COOLING_DOWN
    usable = candidate_view(decision.candidates[0]).model_dump(mode="json")
    assert usable["excluded"] is None and usable["excluded_kind"] is None
    # A reply of a daemon that predates the kinds still reads.
    del dumped["excluded_kind"]
    assert CandidateView.model_validate(dumped).excluded_kind is None
