"""``spotd status JOB`` says which nodes of a gang were replaced and which kept."""

from __future__ import annotations

from datetime import UTC, datetime

from spotd.cli.render.jobs import repair_lines
from spotd.daemon.views import AttemptView, JobView

NOW = datetime(2026, 1, 5, 10, 30, tzinfo=UTC)


def attempt(seq: int, *ids: str) -> AttemptView:
    return AttemptView.model_validate({
        "seq": seq, "provider": "sim-aws", "region": "us-east-1", "zone": "us-east-1a",
        "instance_type": "p4d.24xlarge", "market": "spot", "nodes": len(ids),
        "price_per_node_hour": 9.5, "instance_ids": list(ids), "started_at": NOW,
        "running_at": NOW, "ended_at": None, "end_reason": None, "cost_usd": 1.0,
        "resume_from": None,
    })  # fmt: skip


def job(*attempts: AttemptView) -> JobView:
    return JobView(id="j-1", name="gang", status="running", failure=None, submitted_at=NOW,
                   updated_at=NOW, preemptions=1, providers=["sim-aws"], cost_usd=1.0,
                   attempts=list(attempts), spec={})  # fmt: skip


def test_an_attempt_that_kept_nodes_of_the_one_before_says_which() -> None:
    shown = repair_lines(job(attempt(1, "i-a", "i-b", "i-c"), attempt(2, "i-a", "i-d", "i-c"),
                             attempt(3, "i-e", "i-f", "i-g")))  # fmt: skip
    assert shown == ["attempt 2: node 1 replaced, nodes 0, 2 kept (i-a, i-c)"]
    assert repair_lines(job(attempt(1, "i-a", "i-b"))) == []
