"""Budget alerts and job-end emails."""

from __future__ import annotations

import html as html_lib
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

import jinja2

from spotd.billing.ledger import ledger_so_far, spend_by_attempt, totals
from spotd.billing.savings import claims_saving
from spotd.core.failures import failure_sentence
from spotd.core.states import FailureCause
from spotd.core.timefmt import Precision, shown
from spotd.core.values import AttemptEnd, AttemptRecord, EventRecord, JobRecord, LedgerEntry
from spotd.mail.message import Composed

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BudgetAlert:
    """A job's spend (by its ledger) crossed a fraction of its budget."""

    job: JobRecord
    threshold: float
    spent_usd: float
    budget_usd: float

    @property
    def key(self) -> str:
        """The notification claim key of this (job, threshold)."""
        return budget_key(self.job.id, self.threshold)


def budget_key(job_id: str, threshold: float) -> str:
    """Claim key that makes one (job, threshold) alert fire once."""
    return f"budget:{job_id}:{threshold:g}"


def budget_alerts(
    jobs: Collection[JobRecord],
    spend_of: Callable[[JobRecord], float],
    thresholds: Sequence[float],
    claim: Callable[[str], bool],
) -> list[BudgetAlert]:
    """The alerts due now: at most one per job, for the highest threshold newly crossed.

    ``claim(key)`` is True only the first time a key is claimed (the store's
    notification claims), so a threshold fires once however many ticks see
    the spend above it. Lower thresholds crossed in the same jump are
    claimed silently: a job going from 70 % to 105 % gets one email, not two.
    """
    alerts: list[BudgetAlert] = []
    for job in jobs:
        if job.spec.budget is None:
            continue
        alert = _job_alert(job, spend_of(job), job.spec.budget.max_usd, thresholds, claim)
        if alert is not None:
            alerts.append(alert)
    return alerts


def _job_alert(
    job: JobRecord,
    spent: float,
    budget: float,
    thresholds: Sequence[float],
    claim: Callable[[str], bool],
) -> BudgetAlert | None:
    crossed = [t for t in sorted(thresholds) if spent >= t * budget]
    newly = [t for t in crossed if claim(budget_key(job.id, t))]
    if not newly:
        return None
    return BudgetAlert(job, max(newly), spent, budget)


def budget_email(alert: BudgetAlert) -> Composed:
    """The email of one budget alert."""
    job = alert.job
    share = alert.spent_usd / alert.budget_usd
    subject = f"spotd: job {job.name} reached {alert.threshold:.0%} of its budget"
    text = (
        f"Job {job.name} ({job.id}) has spent {alert.spent_usd:,.2f} USD, "
        f"{share:.0%} of its budget of {alert.budget_usd:,.2f} USD.\n"
        f"Status: {job.status}.\n"
    )
    if alert.threshold >= 1.0:
        text += "The daemon stops a job when its spend reaches the budget.\n"
    html = f"<html><body><p>{html_lib.escape(text).replace(chr(10), '<br>')}</p></body></html>"
    return Composed(subject, text, html)


_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("spotd.mail", "templates"),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
)


def job_end_email(
    job: JobRecord,
    attempts: Sequence[AttemptRecord],
    *,
    now: datetime,
    last_event: EventRecord | None = None,
    ledger: Sequence[LedgerEntry] = (),
    zone: tzinfo = UTC,
    clock_note: str | None = None,
) -> Composed:
    """The email of a job that ended, from the job-end templates.

    ``ledger`` is the job's stored ledger (``store.ledger(job_id=...)``), final
    once the engine billed the job's last attempt: the cost, the on-demand
    equivalent and the saving are its sums (:func:`spotd.billing.ledger.ledger_so_far`),
    as ``spotd report`` and ``spotd status`` show them. The attempts say
    where the job ran and how each ended, with what each cost. Its times are shown
    in ``zone``, with ``clock_note`` when the engine's clock is not at real speed.
    """
    ended = job.updated_at if job.status.terminal else now
    entries = ledger_so_far(job, attempts, ledger, now)
    spend, on_demand = totals(entries)
    by_attempt = spend_by_attempt(entries)
    saved = on_demand - spend
    context = {
        "job": job,
        "status": str(job.status),
        "failure": failure_sentence(job.failure, job.failure_facts, job.spec, spent_usd=spend,
                                    zone=zone) if job.failure else None,
        "detail": last_event.detail if last_event else "",
        "cost_usd": spend,
        "on_demand_usd": on_demand,
        # A job that failed or was cancelled claims no saving: its spend is shown alone.
        "savings_usd": saved if claims_saving(job.status) else None,
        "savings_pct": saved / on_demand * 100 if on_demand > 0 else 0.0,
        "egress_usd": sum(e.usd for e in entries if e.kind == "egress"),
        "runs": [_attempt_row(a, by_attempt.get(a.seq, 0.0)) for a in attempts],
        "attempts": len(attempts),
        "preemptions": sum(a.end_reason is AttemptEnd.PREEMPTED for a in attempts),
        "submitted_at": shown(job.submitted_at, zone, Precision.MINUTE),
        "ended_at": shown(ended, zone, Precision.MINUTE),
        "clock_note": clock_note,
        "elapsed": _hours(ended - job.submitted_at),
    }
    subject = f"spotd: job {job.name} {job.status}"
    if job.failure is FailureCause.OVER_BUDGET:
        subject += " (over budget)"
    text = _templates.get_template("job_end.txt.j2").render(context)
    html = _templates.get_template("job_end.html.j2").render(context)
    return Composed(subject, text, html)


def _attempt_row(a: AttemptRecord, cost_usd: float) -> dict[str, object]:
    """One attempt as the job-end email lists it: where, how bought, how it ended."""
    ended = a.ended_at or a.started_at
    return {
        "seq": a.seq,
        "provider": a.pool.provider,
        "region": a.pool.region,
        "zone": a.pool.zone,
        "instance_type": a.pool.instance_type,
        "market": str(a.market),
        "nodes": a.nodes,
        "hours": _hours(ended - a.started_at),
        "end_reason": str(a.end_reason) if a.end_reason else "open",
        "cost_usd": cost_usd,
    }


def _hours(delta: timedelta) -> str:
    hours = max(0.0, delta.total_seconds() / 3600)
    return f"{hours:.1f} h"
