"""The shapes the API returns and the CLI prints: a job's estimated progress."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from spotd.cli.render.jobs import failure_lines, progress_line, warning_line
from spotd.core.spec import JobSpec
from spotd.core.states import FailureCause, JobStatus
from spotd.core.values import (
    AttemptEnd,
    AttemptRecord,
    EventFacts,
    ExitCause,
    JobRecord,
    Market,
    Pool,
    SubmitWarning,
    SubmitWarningKind,
)
from spotd.daemon.views import JobView, job_view, warning_view

T0 = datetime(2026, 6, 1, tzinfo=UTC)


def due(compute_hours: float, in_hours: float) -> dict[str, object]:
    """A deadline: ``compute_hours`` of work to finish ``in_hours`` after T0."""
    return {"compute_hours": compute_hours,
            "finish_by": (T0 + timedelta(hours=in_hours)).isoformat()}


def record(status: JobStatus = JobStatus.RUNNING, **spec: object) -> JobRecord:
    body: dict[str, object] = {
        "name": "t", "command": ["true"], "resources": {"gpus": ["H100"], "gpus_per_node": 8},
    }  # fmt: skip
    body.update(spec)
    return JobRecord(
        id="j-1", name="t", spec=JobSpec.model_validate(body), status=status, failure=None,
        submitted_at=T0, updated_at=T0,
    )  # fmt: skip


def ran(hours: float, *, rate: float, end: AttemptEnd | None = None, seq: int = 1) -> AttemptRecord:
    return AttemptRecord(
        id=seq, job_id="j-1", seq=seq, pool=Pool("aws", "r", "z", "p5"), market=Market.SPOT,
        nodes=1, price_per_node_hour=1.0, client_token=f"t{seq}", instance_ids=("i",),
        resume_from=None, started_at=T0, running_at=T0,
        ended_at=T0 + timedelta(hours=hours) if end else None, end_reason=end,
        work_per_hour=rate, checkpoint_interval_hours=1.0, saves_on_notice=True,
    )  # fmt: skip


def test_a_deadline_job_shows_its_progress_time_left_and_slack() -> None:
    job = record(deadline=due(20, 30))
    now = T0 + timedelta(hours=10)
    view = job_view(job, [ran(10, rate=0.8)], now).progress
    assert view.done_hours == pytest.approx(8.0)
    assert (view.compute_hours, view.hours_to_deadline) == (20.0, pytest.approx(20.0))
    assert view.slack_hours == pytest.approx(20.0 - (20.0 - 8.0))
    assert view.finish_in_hours == pytest.approx((20.0 - 8.0) / 0.8)
    (attempt,) = job_view(job, [ran(10, rate=0.8)], now).attempts
    assert (attempt.work_per_hour, attempt.checkpoint_interval_hours) == (0.8, 1.0)
    line = progress_line(job_view(job, [ran(10, rate=0.8)], now))
    assert line == (
        "progress: 8.0 of 20.0 compute hours (estimate); deadline in 20.0 h, 8.0 h of slack;"
        " 15.0 h to go at the current rate"
    )


def test_a_job_behind_its_deadline_shows_its_slack_in_red() -> None:
    job = record(deadline=due(20, 12))
    line = progress_line(job_view(job, [ran(10, rate=0.5)], T0 + timedelta(hours=10)))
    assert line.endswith(
        "deadline in 2.0 h, [red]-13.0 h of slack[/]; [red]30.0 h to go at the current rate[/]"
    )


def test_time_to_go_is_at_the_running_attempts_rate_and_only_while_one_runs() -> None:
    job = record(deadline=due(20, 30))
    preempted = ran(4, rate=0.5, end=AttemptEnd.PREEMPTED)
    second = replace(ran(0, rate=0.8, seq=2), started_at=T0 + timedelta(hours=4))
    now = T0 + timedelta(hours=8)
    for attempts in ([preempted], [preempted, replace(second, running_at=None)]):
        view = job_view(job, attempts, now).progress
        assert view is not None and view.finish_in_hours is None  # nothing runs
    running = job_view(job, [preempted, replace(second, running_at=second.started_at)], now)
    assert running.progress is not None
    assert running.progress.done_hours == pytest.approx(4 * 0.5 + 4 * 0.8)
    assert running.progress.finish_in_hours == pytest.approx((20 - 5.2) / 0.8)


def test_a_passed_deadline_says_so() -> None:
    job = record(deadline=due(20, 12))
    line = progress_line(job_view(job, [ran(15, rate=1.0)], T0 + timedelta(hours=15)))
    assert line is not None and line.endswith(
        "; [red]deadline passed 3.0 h ago[/]; [red]5.0 h to go at the current rate[/]"
    )
    # A job with compute hours but no finish_by still gets its time to go.
    open_ended = record(deadline={"compute_hours": 20})
    line = progress_line(job_view(open_ended, [ran(5, rate=0.5)], T0 + timedelta(hours=5)))
    assert line == (
        "progress: 2.5 of 20.0 compute hours (estimate); 35.0 h to go at the current rate"
    )


def test_without_a_deadline_or_once_ended_only_the_work_done_shows() -> None:
    plain = job_view(record(), [ran(3, rate=1.0)], T0 + timedelta(hours=3))
    assert plain.progress is not None
    assert (plain.progress.compute_hours, plain.progress.slack_hours) == (None, None)
    assert progress_line(plain) == "progress: 3.0 compute hours (estimate)"
    quick = job_view(record(JobStatus.SUCCEEDED), [], T0 + timedelta(hours=3))
    assert progress_line(quick) == "progress: complete"  # it ended before a pass saw it run
    # Ended: no deadline figures, and a success is complete whatever the estimate said.
    done = record(JobStatus.SUCCEEDED, deadline=due(2, 9))
    slow = [ran(2, rate=0.8, end=AttemptEnd.SUCCEEDED)]
    view = job_view(done, slow, T0 + timedelta(hours=50))
    assert view.progress is not None
    assert (view.progress.hours_to_deadline, view.progress.slack_hours) == (None, None)
    assert progress_line(view) == "progress: 2.0 of 2.0 compute hours (estimate)"
    failed = job_view(record(JobStatus.FAILED, deadline=due(2, 9)), slow, T0 + timedelta(hours=50))
    assert progress_line(failed) == "progress: 1.6 of 2.0 compute hours (estimate)"


def test_a_reply_from_a_daemon_without_progress_still_reads() -> None:
    view = job_view(record(), [], T0).model_dump(mode="json")
    del view["progress"]
    old = JobView.model_validate(view)
    assert old.progress is None and progress_line(old) is None


def test_status_shows_the_ledgers_cost_not_price_times_time() -> None:
    """A closed attempt at its stored bill; the open one billed to now by the same rules
    (a minute at least): the figures the budget is enforced against and reports show."""
    from spotd.billing.ledger import build_ledger

    job = record()
    first = ran(2, rate=1.0, end=AttemptEnd.PREEMPTED)
    second = replace(ran(0, rate=1.0, seq=2), started_at=T0 + timedelta(hours=2),
                     running_at=T0 + timedelta(hours=2), price_per_node_hour=3.6)
    now = T0 + timedelta(hours=2, seconds=10)
    stored = [replace(e, usd=2.75) for e in build_ledger(job, [first], lambda *_: (), now)]
    assert len(stored) == 1, "one compute line"
    view = job_view(job, [first, second], now, ledger=stored)
    # Price x wall time: 2.0 and 0.01. The ledger: 2.75 billed, a minute at 3.6 USD/h.
    assert [a.cost_usd for a in view.attempts] == [pytest.approx(2.75), pytest.approx(0.06)]
    assert view.cost_usd == pytest.approx(2.81)
    assert job_view(job, [first, second], now).cost_usd == pytest.approx(2.06), (
        "nothing stored yet: the closed attempt is billed by the same rules too"
    )


def test_a_failed_job_says_why_from_its_typed_facts_and_an_older_daemons_reply_reads() -> None:
    failed = replace(record(JobStatus.FAILED), failure=FailureCause.USER_COMMAND_FAILED,
                     failure_facts=EventFacts(exit_code=137, signal=9, node="i-1",
                                              exit_cause=ExitCause.SIGNAL))  # fmt: skip
    view = job_view(failed, [], T0)
    assert view.failure_reason == "killed by SIGKILL (exit 137)"
    assert view.failure_facts is not None and view.failure_facts.exit_cause == "signal"
    assert failure_lines([view], one=True) == ["[red]failed: killed by SIGKILL (exit 137)[/]"]
    assert job_view(record(), [], T0).failure_reason is None
    older = view.model_dump(mode="json")
    del older["failure_reason"], older["failure_facts"]
    assert failure_lines([JobView.model_validate(older)], one=False) == []


def test_a_deadline_failure_is_said_in_the_daemons_zone() -> None:
    late = replace(record(JobStatus.FAILED, deadline=due(10, 5)),
                   failure=FailureCause.DEADLINE_IMPOSSIBLE)  # fmt: skip
    berlin = ZoneInfo("Europe/Berlin")
    said = job_view(late, [], T0, zone=berlin).failure_reason
    assert said == "deadline impossible: 10 h of compute cannot end by 2026-06-01 07:00+02:00"


def test_submit_warnings_are_typed_and_an_older_daemons_bare_strings_read_as_the_markets() -> (
    None
):
    view = job_view(record(), [], T0).model_dump(mode="json")
    view["warnings"] = ["no offering has 3 A100 GPUs per node"]
    (old,) = JobView.model_validate(view).warnings
    assert (old.kind, old.detail) == ("market", "no offering has 3 A100 GPUs per node")
    given = warning_view(SubmitWarning(SubmitWarningKind.NO_EMAIL, "no [email] here"))
    # Escaped for rich: the console prints "[email]" as it is written.
    assert warning_line(given) == (
        "[yellow]warning:[/yellow] no \\[email] here; the job is stored and runs without email"
    )
