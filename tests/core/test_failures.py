"""spotd.core.failures and spotd.core.values.exit_cause_of: how a command failed, from its
exit code and the agent's evidence, and why a job failed, said from typed data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from spotd.core.failures import exit_sentence, failure_sentence
from spotd.core.spec import JobSpec
from spotd.core.values import EMPTY_FACTS, EventFacts, ExitCause, FailureCause, exit_cause_of


def spec(**extra: object) -> JobSpec:
    body: dict[str, object] = {
        "name": "t", "command": ["train"], "resources": {"gpus": ["A100"], "gpus_per_node": 1},
    }  # fmt: skip
    return JobSpec.model_validate({**body, **extra})


@pytest.mark.parametrize(
    ("exit_code", "oom_kills", "cause"),
    [
        (None, None, None),
        (0, None, None),
        (0, 2, None),  # a job that succeeded failed of nothing, whatever was killed in it
        (127, None, ExitCause.NOT_FOUND),
        (126, None, ExitCause.NOT_EXECUTABLE),
        (137, None, ExitCause.SIGNAL),  # a SIGKILL alone is no evidence of memory
        (137, 0, ExitCause.SIGNAL),
        (137, 1, ExitCause.OUT_OF_MEMORY),
        (1, 3, ExitCause.OUT_OF_MEMORY),  # a launcher whose worker the OOM killer took
        (143, None, ExitCause.SIGNAL),
        (-9, None, ExitCause.SIGNAL),
        (3, None, ExitCause.ERROR),
        (255, None, ExitCause.ERROR),
    ],
)
def test_the_cause_of_an_exit(exit_code: int | None, oom_kills: int | None, cause: object) -> None:
    assert exit_cause_of(exit_code, oom_kills) is cause


def facts_of(code: int, oom_kills: int | None = None) -> EventFacts:
    """Facts as the engine records them (:func:`spotd.engine.judge.node_facts`)."""
    signal = code - 128 if 128 < code <= 192 else None
    return EventFacts(exit_code=code, signal=signal, oom_kills=oom_kills,
                      exit_cause=exit_cause_of(code, oom_kills))  # fmt: skip


@pytest.mark.parametrize(
    ("facts", "said"),
    [
        (facts_of(127), "command not found (exit 127)"),
        (facts_of(126), "command not executable (exit 126)"),
        (facts_of(3), "exited with code 3"),
        (facts_of(137), "killed by SIGKILL (exit 137)"),
        (facts_of(143), "killed by SIGTERM (exit 143)"),
        (facts_of(137, 1),
         "out of memory: the kernel's OOM killer killed a process of the job (exit 137, SIGKILL)"),
        (facts_of(1, 2),
         "out of memory: the kernel's OOM killer killed 2 processes of the job (exit 1)"),
        # An event stored before spotd kept the cause: said from its code alone.
        (EventFacts(exit_code=127), "command not found (exit 127)"),
        (EventFacts(exit_code=137), "killed by SIGKILL (exit 137)"),
        (EventFacts(exit_code=0), None),
        (EMPTY_FACTS, None),
    ],
)  # fmt: skip
def test_how_a_command_ended_in_a_few_words(facts: EventFacts, said: str | None) -> None:
    assert exit_sentence(facts) == said


def test_a_failure_is_said_from_its_cause_its_facts_and_its_spec() -> None:
    plain = spec()
    assert failure_sentence(FailureCause.USER_COMMAND_FAILED, facts_of(127), plain) == (
        "command not found (exit 127)"
    )
    assert failure_sentence(FailureCause.USER_COMMAND_FAILED, EMPTY_FACTS, plain) == (
        "the command failed"
    )
    assert failure_sentence(FailureCause.SETUP_FAILED, facts_of(2), plain) == (
        "setup failed: exited with code 2"
    )
    budget = spec(budget={"max_usd": 15.0})
    assert failure_sentence(FailureCause.OVER_BUDGET, EMPTY_FACTS, budget, spent_usd=16.39) == (
        "over budget: spent 16.39 of 15.00 USD"
    )
    checkpoint = EventFacts(check="checkpoint_writable")
    assert failure_sentence(FailureCause.INVALID_SPEC, checkpoint, plain) == (
        "preflight failed: the nodes cannot write the checkpoint location"
    )
    assert failure_sentence(FailureCause.INVALID_SPEC, EventFacts(check="disk"), plain) == (
        "preflight failed: its disk check failed"
    )
    refused = EventFacts(error_class="InvalidRequestError", error_code="provider-invalid")
    assert failure_sentence(FailureCause.INVALID_SPEC, refused, plain) == (
        "every pool refuses its launch request (provider-invalid)"
    )
    capacity = EventFacts(provider_code="InsufficientInstanceCapacity")
    assert failure_sentence(FailureCause.LAUNCH_FAILED, capacity, plain).endswith(
        "(InsufficientInstanceCapacity)"
    )


def test_a_deadline_failure_shows_its_time_in_the_zone_asked() -> None:
    by = datetime(2030, 1, 2, 12, 0, tzinfo=UTC)
    late = spec(deadline={"compute_hours": 24.0, "finish_by": by.isoformat()})
    said = failure_sentence(FailureCause.DEADLINE_IMPOSSIBLE, EMPTY_FACTS, late)
    assert said == "deadline impossible: 24 h of compute cannot end by 2030-01-02 12:00Z"
    east = timezone(timedelta(hours=2))
    assert failure_sentence(FailureCause.DEADLINE_IMPOSSIBLE, EMPTY_FACTS, late, zone=east) == (
        "deadline impossible: 24 h of compute cannot end by 2030-01-02 14:00+02:00"
    )
