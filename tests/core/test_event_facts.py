"""spotd.core.values: an event's typed cause and its facts, and how they are stored."""

from __future__ import annotations

import pytest

from spotd.core.values import (
    EMPTY_FACTS,
    AttemptEnd,
    EventCause,
    EventFacts,
    ExitCause,
    event_cause,
    signal_of_exit,
)


def test_a_stored_cause_reads_back_as_its_enum() -> None:
    assert event_cause("preemption notice") is EventCause.NOTICE
    assert event_cause("user-failed") is AttemptEnd.USER_FAILED
    with pytest.raises(ValueError, match="'later' is no event cause nor attempt end"):
        event_cause("later")


def test_no_value_is_both_an_event_cause_and_an_attempt_end() -> None:
    """Reading tries EventCause first: a value in both would never read as an end."""
    assert not {c.value for c in EventCause} & {e.value for e in AttemptEnd}


@pytest.mark.parametrize(
    ("exit_code", "signal"),
    [(None, None), (0, None), (3, None), (128, None), (137, 9), (143, 15), (-9, 9), (200, None)],
)
def test_the_signal_of_an_exit_code(exit_code: int | None, signal: int | None) -> None:
    assert signal_of_exit(exit_code) == signal


def test_facts_dump_only_what_is_set_and_load_back() -> None:
    facts = EventFacts(exit_code=0, node="i-1", rank=0, error_class="CapacityError")
    dumped = facts.to_json()
    assert dumped == {"exit_code": 0, "node": "i-1", "rank": 0, "error_class": "CapacityError"}
    assert EventFacts.from_json(dumped) == facts
    assert EMPTY_FACTS.to_json() == {}
    assert EventFacts.from_json(None) == EventFacts.from_json({}) == EMPTY_FACTS


def test_facts_load_skips_unknown_keys_and_refuses_wrong_types() -> None:
    assert EventFacts.from_json({"signal": 9, "xid": 79, "node": None}) == EventFacts(signal=9)
    with pytest.raises(ValueError, match="rank is True, expected int"):
        EventFacts.from_json({"rank": True})
    with pytest.raises(ValueError, match="node is 7, expected str"):
        EventFacts.from_json({"node": 7})


def test_a_signal_is_named_where_python_names_it() -> None:
    assert EventFacts(signal=9).signal_name == "SIGKILL"
    assert EventFacts(signal=63).signal_name is None
    assert EMPTY_FACTS.signal_name is None


def test_how_a_command_failed_is_kept_as_its_enum_and_an_unknown_one_skipped() -> None:
    facts = EventFacts(exit_code=127, exit_cause=ExitCause.NOT_FOUND, oom_kills=0, check="disk")
    dumped = facts.to_json()
    assert dumped == {"exit_code": 127, "exit_cause": "not-found", "oom_kills": 0, "check": "disk"}
    loaded = EventFacts.from_json(dumped)
    assert loaded == facts and loaded.exit_cause is ExitCause.NOT_FOUND
    # A cause a newer spotd wrote is skipped like a key this one does not know.
    assert EventFacts.from_json({"exit_code": 1, "exit_cause": "cosmic-ray"}) == EventFacts(
        exit_code=1
    )
    with pytest.raises(ValueError, match="exit_cause is 7, expected ExitCause"):
        EventFacts.from_json({"exit_cause": 7})
