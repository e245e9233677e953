"""Cost to finish as the readers show it: a running job's forecast in its view and its
status line, a report's running rows, and the budget check at submit."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from engine_support import FakeProvider, StepClock, run_until, spec

from spotd.billing.report_model import build_report
from spotd.cli.render.jobs import forecast_line
from spotd.core.errors import SubmitRefused
from spotd.core.forecast import ForecastBasis, OverBudgetAction
from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import InstanceState, SubmitWarningKind
from spotd.daemon.reader import Reader
from spotd.daemon.wiring import build_reader
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies.balanced import BalancedPolicy


@pytest.fixture
def engine(tmp_path: Path, sqlite_url: str) -> Iterator[Engine]:
    store = open_store(sqlite_url)
    yield Engine(
        store, {"fake": FakeProvider()}, BalancedPolicy(), StepClock(),  # type: ignore[arg-type]
        EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"),
    )  # fmt: skip
    store.close()


def sized(hours: float, budget: float | None = None) -> JobSpec:
    extra: dict[str, object] = {"deadline": {"compute_hours": hours}}
    if budget is not None:
        extra["budget"] = {"max_usd": budget}
    return spec(**extra)


def test_a_running_job_shows_what_it_is_expected_to_cost_until_it_ends(engine: Engine) -> None:
    engine.market.refresh_all()
    job = engine.store.create_job(sized(20.0, budget=500.0), now=engine.clock.now())
    job = run_until(engine, job.id, lambda j: j.status is JobStatus.RUNNING)
    reader = build_reader(engine)
    view = reader.view(job)
    f = view.forecast
    assert f is not None and f.basis is ForecastBasis.COMPUTE_HOURS
    assert f.work_left_hours == pytest.approx(20.0)
    # On the pool it runs on, at 1.00 USD/h or more: at least the work's own 20 hours,
    # the P90 above the expectation, and both ends after now.
    (attempt,) = engine.store.attempts(job.id)
    assert f.offering == f"{attempt.pool} {attempt.market}"
    assert 20.0 <= f.expected_usd <= f.p90_usd
    assert engine.clock.now() < f.finish_at <= f.p90_finish_at
    line = forecast_line(view)
    assert line is not None
    assert f"to finish: {f.expected_usd:,.2f} USD expected (P90 {f.p90_usd:,.2f})" in line
    assert "of its 500.00 USD budget in all" in line
    # A report of the period gives the running job's figure beside its spend so far.
    began = engine.clock.now()
    engine.clock.at += timedelta(hours=1)  # type: ignore[attr-defined]
    report = build_report(engine.store, since=began, until=engine.clock.now(),
                          clock=engine.clock, to_finish=reader.planner.to_finish)
    (row,) = [r for r in report.jobs if r.job_id == job.id]
    again = reader.view(job).forecast  # an hour on: less to go, and less to pay
    assert again is not None and again.work_left_hours < f.work_left_hours
    assert again.expected_usd < f.expected_usd
    assert row.so_far and (row.to_finish_usd, row.to_finish_p90_usd) == (
        again.expected_usd, again.p90_usd)


def test_an_ended_job_or_one_of_unknown_size_has_no_forecast(engine: Engine) -> None:
    engine.market.refresh_all()
    unsized = engine.store.create_job(spec(), now=engine.clock.now())
    unsized = run_until(engine, unsized.id, lambda j: j.status is JobStatus.RUNNING)
    reader = build_reader(engine)
    assert reader.view(unsized).forecast is None  # no compute hours, no steps reported
    provider = engine.providers["fake"]
    assert isinstance(provider, FakeProvider)
    for a in engine.store.attempts(unsized.id):
        for i in a.instance_ids:
            provider.states[i], provider.exit_codes[i] = InstanceState.EXITED, 0
    done = run_until(engine, unsized.id, lambda j: j.status.terminal)
    assert reader.view(done).forecast is None


def test_a_job_expected_to_cost_more_than_its_budget_is_warned_at_submit(engine: Engine) -> None:
    engine.market.refresh_all()
    reader = build_reader(engine)
    (warning,) = reader.submit_warnings(sized(100.0, budget=5.0))
    assert warning.kind is SubmitWarningKind.OVER_BUDGET
    assert "over its budget.max_usd of 5.00" in warning.detail
    assert "P90" in warning.detail
    assert reader.submit_warnings(sized(1.0, budget=500.0)) == []


def test_a_daemon_set_to_refuse_stores_nothing_and_gives_the_figures(engine: Engine) -> None:
    engine.market.refresh_all()
    base = build_reader(engine)
    refusing = Reader(
        base.store, base.market, base.clock,
        EngineSettings(owner="test", forecast_over_budget=OverBudgetAction.REFUSE),
        base.providers, base.planner,
    )  # fmt: skip
    with pytest.raises(SubmitRefused, match="expected to cost") as refused:
        refusing.submit(sized(100.0, budget=5.0))
    assert refused.value.field == "budget.max_usd"
    assert engine.store.list_jobs() == []
    assert refusing.submit(sized(1.0, budget=500.0)).status is JobStatus.PENDING
