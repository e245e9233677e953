"""spotd.core.ranks: the ranks' readings, kept as JSON, and a node's progress key; and
the hang's list facts kept with an event."""

from __future__ import annotations

import pytest

from spotd.core.agent_wire import HeartbeatReport
from spotd.core.ranks import (
    MAX_RANKS_PER_NODE,
    RankReading,
    RankState,
    progress_key,
    rank_file_name,
    ranks_json,
    ranks_of,
)
from spotd.core.values import EventFacts


def reading(rank: int, step: int | None, state: RankState = RankState.RUNNING) -> RankReading:
    return RankReading(rank=rank, step=step, pid=100 + rank, state=state)


def test_readings_survive_their_json() -> None:
    readings = (reading(0, 5), reading(1, None, RankState.DEAD))
    assert ranks_of(ranks_json(readings)) == readings
    assert ranks_of(None) == () and ranks_of("") == ()
    assert ranks_of("{not json") == () and ranks_of('{"rank": 1}') == ()
    assert rank_file_name(3) == "progress-rank-3.json"


def test_the_key_moves_with_any_step_and_not_with_a_process_state() -> None:
    base = progress_key(10, "ck/step-10", [reading(0, 10), reading(1, 10)])
    assert base is not None
    stopped = progress_key(10, "ck/step-10", [reading(1, 10, RankState.STOPPED), reading(0, 10)])
    assert stopped == base, "the order of the files and a process's state are no progress"
    assert progress_key(10, "ck/step-10", [reading(0, 10), reading(1, 11)]) != base
    assert progress_key(11, "ck/step-10", [reading(0, 10), reading(1, 10)]) != base
    assert progress_key(10, "ck/step-11", [reading(0, 10), reading(1, 10)]) != base
    assert progress_key(None, None, [reading(0, None)]) is None, "nothing reported: no key"
    assert progress_key(3, None, []) is not None, "the single progress file alone counts"


def test_a_heartbeat_carries_a_bounded_number_of_ranks() -> None:
    speaker = {"job_id": "j", "attempt": 1, "instance_id": "i", "provider": "sim",
               "at": "2026-01-01T00:00:00Z"}  # fmt: skip
    ok = HeartbeatReport.model_validate({**speaker, "ranks": [{"rank": 0, "step": 1}]})
    assert ok.ranks[0].state is RankState.UNKNOWN
    many = [{"rank": n} for n in range(MAX_RANKS_PER_NODE + 1)]
    with pytest.raises(ValueError, match="ranks"):
        HeartbeatReport.model_validate({**speaker, "ranks": many})
    old = HeartbeatReport.model_validate(speaker)
    assert old.ranks == (), "an agent without rank files sends none"


def test_list_facts_survive_the_store_and_refuse_the_wrong_items() -> None:
    facts = EventFacts(node="i-1", rank=1, process_ranks=(2, 3), nodes=("i-1", "i-2"))
    stored = facts.to_json()
    assert stored["process_ranks"] == [2, 3] and stored["nodes"] == ["i-1", "i-2"]
    assert EventFacts.from_json(stored) == facts
    with pytest.raises(ValueError, match="process_ranks"):
        EventFacts.from_json({"process_ranks": [1, "2"]})
    with pytest.raises(ValueError, match="nodes"):
        EventFacts.from_json({"nodes": "i-1"})
    with pytest.raises(ValueError, match="process_ranks"):
        EventFacts.from_json({"process_ranks": [True]})
