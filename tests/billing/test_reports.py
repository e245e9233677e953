"""``spotd report``: totals from the ledger, the same in every format, findings, charts."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from engine_support import spec
from matplotlib.figure import Figure
from PIL import Image

from spotd.billing.charts import _jobs, job_labels
from spotd.billing.ledger import record_ledger
from spotd.billing.report_model import JobRow, usd
from spotd.billing.reports import (
    CHART_NAMES,
    Report,
    build_report,
    cid_sources,
    data_uri_sources,
    render_charts,
    render_csv,
    render_html,
    render_json,
    render_text,
)
from spotd.core.clock import ManualClock
from spotd.core.intents import IntentKind, IntentOutcome
from spotd.core.states import FailureCause, JobStatus, Transition
from spotd.core.values import (
    AttemptClose,
    AttemptEnd,
    EventCause,
    EventFacts,
    LedgerEntry,
    Market,
    NewAttempt,
    Pool,
)
from spotd.store import SqlStore

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
SINCE, UNTIL = datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 3, 9, tzinfo=UTC)
EAST = Pool("aws", "us-east-1", "us-east-1a", "p4d.24xlarge")
WEST = Pool("aws", "us-west-2", "us-west-2b", "p4d.24xlarge")
GCP = Pool("gcp", "us-central1", "us-central1-a", "a3-highgpu-8g")
ON_DEMAND = {EAST: 32.77, WEST: 32.77, GCP: 88.25}
PNG = b"\x89PNG\r\n\x1a\n"
S = JobStatus


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def _move(store: SqlStore, job_id: str, old: S, new: S, when: datetime, **kw: object) -> None:
    close = kw.get("close_attempt")
    cause = close.reason if isinstance(close, AttemptClose) else _CAUSES[new]
    store.compare_and_set(Transition(job_id, old, new, cause=cause, **kw), now=when)  # type: ignore[arg-type]


# The events' causes as the engine writes them: a report reads them back for drills.
_CAUSES = {S.PROVISIONING: EventCause.PLACED, S.RUNNING: EventCause.RUNNING}


def _attempt(
    store: SqlStore, job_id: str, old: S, pool: Pool, price: float, start: float, *,
    run_after: float, end: float, reason: AttemptEnd, final: S, market: Market = Market.SPOT,
) -> None:  # fmt: skip
    """One attempt: opened at ``start`` h, running ``run_after`` h later, closed at ``end`` h."""
    new = NewAttempt(pool, market, 1, price, resume_from="ck/1" if old is S.RECOVERING else None)
    _move(store, job_id, old, S.PROVISIONING, h(start), open_attempt=new)
    opened = store.attempts(job_id)[-1]
    store.set_attempt_instances(opened.id, [f"{job_id}-{opened.seq}"])
    store.mark_attempt_running(opened.id, at=h(start + run_after))
    _move(store, job_id, S.PROVISIONING, S.RUNNING, h(start + run_after))
    _move(store, job_id, S.RUNNING, final, h(end), close_attempt=AttemptClose(opened.id, reason))


@pytest.fixture
def filled(store: SqlStore) -> SqlStore:
    """Two jobs over a week: one preempted twice across regions, one on-demand on GCP."""
    big = store.create_job(spec(name="llama-70b", checkpoint={"size_gb": 100}), now=T0)
    _attempt(store, big.id, S.PENDING, EAST, 12.0, 0, run_after=0.1, end=10,
             reason=AttemptEnd.PREEMPTED, final=S.RECOVERING)  # fmt: skip
    _attempt(store, big.id, S.RECOVERING, WEST, 11.0, 10.2, run_after=0.2, end=30,
             reason=AttemptEnd.PREEMPTED, final=S.RECOVERING)  # fmt: skip
    _attempt(store, big.id, S.RECOVERING, WEST, 11.5, 30.5, run_after=0.25, end=50,
             reason=AttemptEnd.SUCCEEDED, final=S.SUCCEEDED)  # fmt: skip
    small = store.create_job(spec(name="eval"), now=T0)
    _attempt(store, small.id, S.PENDING, GCP, 88.25, 24, run_after=0.05, end=26,
             reason=AttemptEnd.SUCCEEDED, final=S.SUCCEEDED, market=Market.ON_DEMAND)  # fmt: skip
    for job_id in (big.id, small.id):
        record_ledger(store, store.get_job(job_id), h(200), on_demand_prices=ON_DEMAND)
    return store


@pytest.fixture
def report(filled: SqlStore) -> Report:
    return build_report(filled, since=SINCE, until=UNTIL)


def _sums(entries: list[LedgerEntry]) -> tuple[float, float, float]:
    return (
        sum(e.usd for e in entries),
        sum(e.on_demand_usd for e in entries),
        sum(e.gpu_hours for e in entries),
    )


# -- totals ------------------------------------------------------------------------------


def test_report_totals_are_the_sum_of_the_ledger(filled: SqlStore, report: Report) -> None:
    entries = filled.ledger(since=SINCE, until=UNTIL)
    spend, on_demand, gpu_hours = _sums(entries)
    t = report.totals
    assert t.spend_usd == pytest.approx(spend) and spend > 0
    assert t.on_demand_usd == pytest.approx(on_demand)
    assert t.savings_usd == pytest.approx(on_demand - spend)
    assert t.savings_pct == pytest.approx(100 * (on_demand - spend) / on_demand)
    assert t.gpu_hours == pytest.approx(gpu_hours)
    assert t.egress_usd == pytest.approx(100 * 0.02), "one move east -> west"
    assert (t.jobs, t.preemptions) == (2, 2)
    # The boots after the two preemptions; each job's first boot is its start, not a recovery.
    assert t.recovery_hours == pytest.approx(0.2 + 0.25)
    assert sum(j.spend_usd for j in report.jobs) == pytest.approx(spend)
    for rows in (report.by_provider, report.by_region, report.by_gpu, report.by_fabric,
                 report.by_gpu_fabric, report.by_market, report.by_day):  # fmt: skip
        assert sum(r.spend_usd for r in rows) == pytest.approx(spend)
        assert sum(r.on_demand_usd for r in rows) == pytest.approx(on_demand)
    daily = sum(sum(d.by_provider.values()) for d in report.daily)
    assert daily == pytest.approx(spend)
    assert [r.key for r in report.by_day] == sorted(r.key for r in report.by_day)
    assert {r.key for r in report.by_market} == {"spot", "on-demand"}


def test_a_period_and_a_job_select_their_lines(filled: SqlStore, report: Report) -> None:
    big = next(j for j in report.jobs if j.name.startswith("llama"))
    one = build_report(filled, since=SINCE, until=UNTIL, job_id=big.job_id)
    assert one.totals.spend_usd == pytest.approx(big.spend_usd)
    assert [j.job_id for j in one.jobs] == [big.job_id]
    day2 = build_report(filled, since=SINCE + timedelta(days=1), until=SINCE + timedelta(days=2))
    lines = filled.ledger(since=SINCE + timedelta(days=1), until=SINCE + timedelta(days=2))
    assert day2.totals.spend_usd == pytest.approx(_sums(lines)[0])
    empty = build_report(filled, since=UNTIL, until=UNTIL + timedelta(days=7))
    assert empty.totals.spend_usd == 0 and empty.jobs == []
    assert empty.findings == [f"Nothing was spent from {UNTIL.date()} to 2026-03-15."]


# -- formats ------------------------------------------------------------------------------


def _money(text: str) -> float:
    return float(text.replace(",", ""))


def test_every_format_carries_the_same_totals(report: Report) -> None:
    t = report.totals
    expected = {k: round(getattr(t, k), 2) for k in ("spend_usd", "on_demand_usd",
                                                      "savings_usd", "gpu_hours")}  # fmt: skip

    from_json = json.loads(render_json(report))["totals"]
    assert {k: round(from_json[k], 2) for k in expected} == expected

    rows = list(csv.DictReader(io.StringIO(render_csv(report))))
    (total,) = [r for r in rows if r["row"] == "total"]
    assert {k: float(total[k]) for k in expected} == expected
    assert sum(float(r["spend_usd"]) for r in rows if r["row"] == "job") == pytest.approx(
        t.spend_usd, abs=0.01
    )

    text = render_text(report)
    labels = {"spend_usd": "Spend", "on_demand_usd": "On-demand equivalent",
              "savings_usd": "Savings", "gpu_hours": "GPU-hours"}  # fmt: skip
    for key, label in labels.items():
        found = re.search(rf"^  {label}: +([\d,.-]+)", text, re.MULTILINE)
        assert found is not None, label
        assert _money(found.group(1)) == expected[key]

    html = render_html(report, cid_sources())
    for key, value in expected.items():
        found = re.search(rf'data-total="{key}">([\d,.-]+)', html)
        assert found is not None, key
        assert _money(found.group(1)) == value
    assert int(re.findall(r'data-total="preemptions">(\d+)', html)[0]) == t.preemptions
    assert f"Preemptions:           {t.preemptions}" in text
    assert total["preemptions"] == str(t.preemptions)


def test_html_references_each_chart_by_cid_and_escapes(report: Report) -> None:
    html = render_html(report, cid_sources())
    for name in CHART_NAMES:
        assert f'src="cid:{name}"' in html
    tricky = report.model_copy(update={"findings": ["<b>A & B</b>"]})
    assert "&lt;b&gt;A &amp; B&lt;/b&gt;" in render_html(tricky, cid_sources())
    assert "<b>A & B</b>" in render_text(tricky), "text is not HTML-escaped"
    standalone = render_html(report, data_uri_sources(render_charts(report)))
    assert standalone.count('src="data:image/png;base64,') == len(CHART_NAMES)
    assert "<img" not in render_html(report, {}), "charts left out are not shown"


# -- findings -----------------------------------------------------------------------------


def test_findings_say_the_right_numbers(report: Report) -> None:
    t = report.totals
    text = " ".join(report.findings)
    saved = f"Spot saved {t.savings_pct:.0f} % ({usd(t.savings_usd)} USD)"
    assert f"{saved} from 2026-03-02 to 2026-03-08" in text
    assert "1 job was preempted 2 times" in text
    # East ran 9.9 h for one preemption, west 19.8 h for one: east is the worse pool.
    assert f"{EAST} was the least reliable pool: 1 preemption in 9.9 running hours." in text
    top = report.jobs[0]
    assert top.name == "llama-70b"
    top_sentence = (
        f"The most expensive job was llama-70b ({top.job_id}) at {usd(top.spend_usd)} USD."
    )
    assert top_sentence in text
    assert report.findings[0].startswith("Spot saved")


# -- charts --------------------------------------------------------------------------------


def test_charts_are_png_images(report: Report) -> None:
    # No timing here: a loaded CI machine failed a time bound on correct charts.
    charts = render_charts(report)
    assert set(charts) == set(CHART_NAMES)
    for name, png in charts.items():
        assert png.startswith(PNG), name
        with Image.open(io.BytesIO(png)) as image:
            image.verify()
        with Image.open(io.BytesIO(png)) as image:
            assert image.format == "PNG" and image.size == (664, 300)


def test_an_empty_report_still_has_charts(filled: SqlStore) -> None:
    empty = build_report(filled, since=UNTIL, until=UNTIL + timedelta(days=1))
    assert all(png.startswith(PNG) for png in render_charts(empty).values())
    assert "No job spent anything" in render_html(empty, cid_sources())


def test_same_named_jobs_get_a_bar_each_in_the_jobs_chart(report: Report) -> None:
    def row(job_id: str, name: str, spend: float) -> JobRow:
        return JobRow(job_id=job_id, name=name, status="succeeded", spend_usd=spend,
                      on_demand_usd=spend * 3, savings_usd=spend * 2, gpu_hours=1.0,
                      preemptions=0, recovery_hours=0.0)  # fmt: skip

    rows = [row("j-1", "finetune", 3.0), row("j-2", "finetune", 2.0), row("j-3", "eval", 1.0)]
    assert job_labels(rows) == ["finetune (j-1)", "finetune (j-2)", "eval"]
    ax = Figure().add_subplot()
    _jobs(ax, report.model_copy(update={"jobs": rows}))
    assert len(ax.patches) == 6, "a spend and a savings bar for each of the three jobs"
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["eval", "finetune (j-2)", "finetune (j-1)"], "cheapest at the bottom"


def test_the_text_header_gives_the_period_to_the_minute(filled: SqlStore) -> None:
    # A window back from "now" (spotd report --since 1d) starts and ends mid-second.
    odd = timedelta(seconds=12, microseconds=345_678)
    text = render_text(build_report(filled, since=SINCE + odd, until=UNTIL + odd))
    assert text.splitlines()[0] == "spotd report 2026-03-02 00:00Z to 2026-03-09 00:00Z"


def test_a_report_shows_its_times_in_the_display_zone_and_says_a_fast_clock(
    filled: SqlStore,
) -> None:
    note = "simulated clock, 60x real time"
    built = build_report(filled, since=SINCE, until=UNTIL, zone="America/New_York",
                         clock_note=note)  # fmt: skip
    lines = render_text(built).splitlines()
    # New York moved its clocks on 2026-03-08, inside the week: each end has its offset.
    assert lines[0] == "spotd report 2026-03-01 19:00-05:00 to 2026-03-08 20:00-04:00"
    faster = "the simulated market's hours pass faster than real ones."
    assert lines[1] == f"Times are on the {note}: {faster}"
    html = render_html(built, {})
    assert "2026-03-01 19:00-05:00 to 2026-03-08 20:00-04:00" in html
    assert f"Times are on the {note}" in html
    real = render_text(build_report(filled, since=SINCE, until=UNTIL))
    assert "Times are on the" not in real, "no note on real time"


# -- honest money: no saving for a failed job, a running job's spend so far ----------------


def test_a_failed_jobs_spend_counts_with_no_saving_and_a_running_ones_so_far(
    filled: SqlStore,
) -> None:
    """A failed job's hours bought nothing kept: its spend is in every spend figure and in
    no saving. A running job's open attempt, which the stored ledger does not hold yet, is
    priced to the clock's now and marked so far; without a clock it is left out."""
    broken = filled.create_job(spec(name="broken"), now=T0)
    _move(filled, broken.id, S.PENDING, S.PROVISIONING, h(1),
          open_attempt=NewAttempt(EAST, Market.SPOT, 1, 12.0, resume_from=None))  # fmt: skip
    opened = filled.attempts(broken.id)[-1]
    filled.set_attempt_instances(opened.id, ["i-broken"])
    filled.mark_attempt_running(opened.id, at=h(1.1))
    _move(filled, broken.id, S.PROVISIONING, S.FAILED, h(3),
          failure=FailureCause.USER_COMMAND_FAILED,
          close_attempt=AttemptClose(opened.id, AttemptEnd.USER_FAILED, exit_code=127))  # fmt: skip
    record_ledger(filled, filled.get_job(broken.id), h(3), on_demand_prices=ON_DEMAND)
    long = filled.create_job(spec(name="long"), now=T0)
    _move(filled, long.id, S.PENDING, S.PROVISIONING, h(40),
          open_attempt=NewAttempt(GCP, Market.SPOT, 1, 20.0, resume_from=None))  # fmt: skip
    running = filled.attempts(long.id)[-1]
    filled.set_attempt_instances(running.id, ["i-long"])
    filled.mark_attempt_running(running.id, at=h(40.1))
    _move(filled, long.id, S.PROVISIONING, S.RUNNING, h(40.1))

    stored = build_report(filled, since=SINCE, until=UNTIL)
    assert long.id not in {j.job_id for j in stored.jobs}, "no clock: the stored ledger only"
    report = build_report(filled, since=SINCE, until=UNTIL, clock=ManualClock(h(42)))
    rows = {j.job_id: j for j in report.jobs}
    failed, so_far = rows[broken.id], rows[long.id]
    assert failed.savings_usd is None and failed.spend_usd == pytest.approx(12.0 * 2, rel=0.01)
    assert so_far.so_far and so_far.status_shown == "running, so far"
    assert so_far.spend_usd == pytest.approx(20.0 * 2, rel=0.01), "2 h at 20 USD/h so far"
    t = report.totals
    assert t.no_saving_usd == pytest.approx(failed.spend_usd)
    assert t.running_usd == pytest.approx(so_far.spend_usd)
    assert t.spend_usd == pytest.approx(stored.totals.spend_usd + so_far.spend_usd)
    claimed = [j.savings_usd for j in report.jobs if j.savings_usd is not None]
    assert t.savings_usd == pytest.approx(sum(claimed))
    east = next(r for r in report.by_provider if r.key == "aws")
    assert east.savings_usd < east.on_demand_usd - east.spend_usd, "the failed job's is left out"
    said = report.findings[0]
    assert f"{usd(t.no_saving_usd)} USD went to jobs that failed or were cancelled" in said
    assert f"{usd(t.running_usd)} USD is running jobs' spend so far" in said
    text = render_text(report)
    assert re.search(rf"{broken.id}\s+broken\s+failed\s+[\d.,]+\s+–", text), text
    assert re.search(rf"{long.id}\s+long\s+running, so far", text), text
    assert "Of which failed or cancelled jobs" in text and "Of which running jobs" in text
    lines = {r["job_id"]: r for r in csv.DictReader(io.StringIO(render_csv(report)))}
    assert (lines[broken.id]["savings_usd"], lines[broken.id]["savings_pct"]) == ("", "")
    assert lines[long.id]["status"] == "running, so far"
    html = render_html(report, {})
    assert 'data-total="no_saving_usd"' in html and 'data-total="running_usd"' in html
    dumped = {j["job_id"]: j for j in json.loads(render_json(report))["jobs"]}
    assert (dumped[broken.id]["savings_usd"], dumped[long.id]["so_far"]) == (None, True)


# -- drills -----------------------------------------------------------------------------


def test_a_drill_is_reported_as_a_drill_not_as_the_pools_preemption(store: SqlStore) -> None:
    """A drill ends its attempt ``preempted`` like the market: the report counts it as a
    drill, with what resuming from it cost, and leaves the pool's reliability alone."""
    job = store.create_job(spec(name="drilled"), now=T0)
    new = NewAttempt(EAST, Market.SPOT, 1, 12.0, resume_from=None)
    _move(store, job.id, S.PENDING, S.PROVISIONING, h(0), open_attempt=new)
    first = store.attempts(job.id)[-1]
    store.set_attempt_instances(first.id, ["i-drilled"])
    store.mark_attempt_running(first.id, at=h(0.1))
    _move(store, job.id, S.PROVISIONING, S.RUNNING, h(0.1))
    intent = store.request_intent(job.id, IntentKind.DRILL, at=h(4), node=0)
    store.settle_intent(intent, IntentOutcome.APPLIED, at=h(4), cause=EventCause.DRILL,
                        detail="drill", facts=EventFacts(node="i-drilled", rank=0))  # fmt: skip
    _move(store, job.id, S.RUNNING, S.RECOVERING, h(4.05),
          close_attempt=AttemptClose(first.id, AttemptEnd.PREEMPTED))  # fmt: skip
    _attempt(store, job.id, S.RECOVERING, EAST, 12.0, 4.1, run_after=0.3, end=8,
             reason=AttemptEnd.SUCCEEDED, final=S.SUCCEEDED)  # fmt: skip
    record_ledger(store, store.get_job(job.id), h(20), on_demand_prices=ON_DEMAND)

    report = build_report(store, since=SINCE, until=UNTIL)

    resume = [e for e in store.ledger(job_id=job.id) if e.kind == "changeover" and e.attempt == 2]
    assert resume, "the resumed attempt's changeover is billed"
    (row,) = report.jobs
    assert (row.preemptions, row.drills) == (0, 1)
    assert row.drill_usd == pytest.approx(sum(e.usd for e in resume)) and row.drill_usd > 0
    assert (report.totals.preemptions, report.totals.drills) == (0, 1)
    text = " ".join(report.findings)
    assert "No job was preempted." in text and "least reliable" not in text
    assert f"1 drill preempted 1 job on purpose (drilled); resuming from them cost " \
           f"{usd(row.drill_usd)} USD." in text  # fmt: skip
    (csv_row, total) = list(csv.DictReader(io.StringIO(render_csv(report))))
    assert (csv_row["drills"], csv_row["preemptions"], total["drills"]) == ("1", "0", "1")
    assert float(csv_row["drill_usd"]) == pytest.approx(row.drill_usd, abs=0.005)
    assert "Drills:                1" in render_text(report)
