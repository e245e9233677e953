"""Why a job failed, or how a command ended, in a short sentence, from typed data.

The engine records the facts: the job's ``failure`` (:class:`FailureCause`) and
``failure_facts``, each event's :class:`~spotd.core.values.EventFacts` (exit code,
signal, :class:`~spotd.core.values.ExitCause`, the OOM killer's count, the failed
preflight check). These functions say them for ``spotd status``, the dashboard and
the API's views. Nothing stores their sentences: they are said anew at each read.
"""

from __future__ import annotations

from datetime import UTC, tzinfo
from typing import TYPE_CHECKING

from spotd.core.timefmt import Precision, shown
from spotd.core.values import EventFacts, ExitCause, FailureCause, exit_cause_of, signal_of_exit

if TYPE_CHECKING:
    from spotd.core.spec import JobSpec

CHECK_WORDS: dict[str, str] = {
    "checkpoint_writable": "the nodes cannot write the checkpoint location",
    "job_python": "the job's python interpreter is not on its nodes ([preflight] python)",
    "torch_import": "torch is not installed in the job's python interpreter",
}
"""What a failed preflight check means, by the check's name; others are said by name."""


def exit_sentence(facts: EventFacts) -> str | None:
    """How a command ended, e.g. ``command not found (exit 127)``, ``killed by SIGKILL
    (exit 137)``; None for facts without a failing exit."""
    code = facts.exit_code
    cause = facts.exit_cause or exit_cause_of(code, facts.oom_kills)
    if code is None or cause is None:
        return None
    signal = _signal_name(facts)
    match cause:
        case ExitCause.NOT_FOUND:
            return f"command not found (exit {code})"
        case ExitCause.NOT_EXECUTABLE:
            return f"command not executable (exit {code})"
        case ExitCause.OUT_OF_MEMORY:
            kills = facts.oom_kills or 0
            processes = "a process" if kills <= 1 else f"{kills} processes"
            how = f"exit {code}, {signal}" if signal else f"exit {code}"
            return f"out of memory: the kernel's OOM killer killed {processes} of the job ({how})"
        case ExitCause.SIGNAL:
            return f"killed by {signal} (exit {code})"
    return f"exited with code {code}"


def _signal_name(facts: EventFacts) -> str | None:
    """The signal's name (``SIGKILL``), else ``signal N``; None without a signal."""
    number = facts.signal if facts.signal is not None else signal_of_exit(facts.exit_code)
    if number is None:
        return None
    return EventFacts(signal=number).signal_name or f"signal {number}"


def failure_sentence(
    failure: FailureCause,
    facts: EventFacts,
    spec: JobSpec,
    *,
    spent_usd: float | None = None,
    zone: tzinfo = UTC,
) -> str:
    """Why a job failed, in a few words: its ``failure`` said with the facts of the event
    that failed it and what its spec asked (the budget, the deadline). ``spent_usd`` is
    the job's cost by its ledger; ``zone`` the zone times are shown in."""
    said = exit_sentence(facts)
    match failure:
        case FailureCause.USER_COMMAND_FAILED:
            return said or "the command failed"
        case FailureCause.SETUP_FAILED:
            return f"setup failed: {said}" if said else "setup failed"
        case FailureCause.OVER_BUDGET:
            return _over_budget(spec, spent_usd)
        case FailureCause.DEADLINE_IMPOSSIBLE:
            return _deadline(spec, zone)
        case FailureCause.INVALID_SPEC:
            return _invalid(facts)
        case FailureCause.NO_CAPACITY:
            return "no offering could run it within scheduling.no_capacity_timeout_hours"
        case FailureCause.LAUNCH_FAILED:
            return "its launches failed more often than its retry limits allow" + _codes(facts)
        case FailureCause.HUNG:
            return "it hung on more attempts in a row than retry.hangs allows" + _suspects(facts)
    return "the provider failed" + _codes(facts)


def _over_budget(spec: JobSpec, spent_usd: float | None) -> str:
    limit = spec.budget.max_usd if spec.budget is not None else None
    if limit is None or spent_usd is None:
        return "over budget"
    return f"over budget: spent {spent_usd:,.2f} of {limit:,.2f} USD"


def _deadline(spec: JobSpec, zone: tzinfo) -> str:
    deadline = spec.deadline
    if deadline is None or deadline.finish_by is None or deadline.compute_hours is None:
        return "deadline impossible"
    by = shown(deadline.finish_by, zone, Precision.MINUTE)
    return f"deadline impossible: {deadline.compute_hours:g} h of compute cannot end by {by}"


def _invalid(facts: EventFacts) -> str:
    if facts.check is not None:
        words = CHECK_WORDS.get(facts.check, f"its {facts.check} check failed")
        return f"preflight failed: {words}"
    if facts.error_class is not None:
        return "every pool refuses its launch request" + _codes(facts)
    return "its spec cannot run here"


def _suspects(facts: EventFacts) -> str:
    """`` (suspect rank 1 on i-0abc)``: the hang's first suspect, where the facts name one."""
    if not facts.process_ranks or facts.node is None:
        return ""
    return f" (suspect rank {facts.process_ranks[0]} on {facts.node})"


def _codes(facts: EventFacts) -> str:
    """`` (InsufficientInstanceCapacity)``: the error's codes, where the facts name one."""
    code = facts.provider_code or facts.error_code
    return f" ({code})" if code else ""
