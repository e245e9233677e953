"""spotd.engine.attempts.with_report: what the provider says, corrected by what the agent said."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from spotd.core.agent_wire import ExitReport
from spotd.core.values import Instance, InstanceReport, InstanceState, Market, Pool
from spotd.engine.attempts import with_kept_exit, with_report
from spotd.exits import KeptExit

NOW = datetime(2026, 12, 1, tzinfo=UTC)
POOL = Pool("sim-aws", "us-east-1", "us-east-1a", "p4d.24xlarge")


def node(state: InstanceState) -> Instance:
    return Instance(id="i-1", pool=POOL, market=Market.SPOT, state=state)


def report(**fields: object) -> InstanceReport:
    return InstanceReport("i-1", "sim-aws", "j-1", 1, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "fields", "expected"),
    [
        # The agent's exit decides how the job ended, whatever the VM shows.
        (InstanceState.RUNNING, {"exit_code": 0}, InstanceState.EXITED),
        (InstanceState.TERMINATED, {"exit_code": 3}, InstanceState.EXITED),
        # An exit after a preemption notice is the preemption, reported by the agent...
        (InstanceState.RUNNING, {"exit_code": 143, "notice_at": NOW, "notice_kind": "preemption"},
         InstanceState.PREEMPTED),
        # ...or shown by the provider itself, before the agent's watcher saw it.
        (InstanceState.NOTICE, {"exit_code": 143}, InstanceState.PREEMPTED),
        # A rebalance recommendation is no notice.
        (InstanceState.RUNNING, {"exit_code": 1, "notice_at": NOW, "notice_kind": "rebalance"},
         InstanceState.EXITED),
        # A job that finished during the notice finished...
        (InstanceState.NOTICE, {"exit_code": 0}, InstanceState.EXITED),
        # ...and so did one whose node the market took back after it ended; any other
        # exit of a node the provider saw preempted is the preemption.
        (InstanceState.PREEMPTED, {"exit_code": 0}, InstanceState.EXITED),
        (InstanceState.PREEMPTED, {"exit_code": 3}, InstanceState.PREEMPTED),
        (InstanceState.RUNNING, {"notice_at": NOW, "notice_kind": "preemption"},
         InstanceState.NOTICE),
        (InstanceState.RUNNING, {}, InstanceState.RUNNING),
    ],
)  # fmt: skip
def test_the_agents_word_over_the_providers(
    state: InstanceState, fields: dict[str, object], expected: InstanceState
) -> None:
    merged = with_report(node(state), report(**fields))
    assert merged is not None and merged.state is expected


def test_the_agents_count_of_oom_kills_goes_with_its_exit() -> None:
    merged = with_report(node(InstanceState.TERMINATED), report(exit_code=137, oom_kills=2))
    assert (merged.state, merged.exit_code, merged.oom_kills) == (InstanceState.EXITED, 137, 2)
    kept = with_kept_exit(node(InstanceState.TERMINATED), KeptExit(
        exit=ExitReport(job_id="j-1", attempt=1, instance_id="i-1", provider="sim-aws",
                        at=NOW, exit_code=137, oom_kills=1),
        notice=None, stopped=False,
    ))  # fmt: skip
    assert (kept.exit_code, kept.oom_kills) == (137, 1)
