"""The deadline verdict of a plan: meets, at risk or cannot meet, with its slack."""

from __future__ import annotations

import pytest

from spotd.core.outlook import DeadlineVerdict, Outlook, outlook


def test_a_plan_with_more_slack_than_its_margin_meets_the_deadline() -> None:
    seen = outlook(hours_left=50.0, expected_hours=40.0, fastest_hours=38.0, margin_hours=1.25)
    assert seen == Outlook(DeadlineVerdict.MEETS, 10.0)


def test_a_plan_with_less_slack_than_its_margin_is_at_risk() -> None:
    seen = outlook(hours_left=41.0, expected_hours=40.0, fastest_hours=38.0, margin_hours=1.25)
    assert seen.verdict is DeadlineVerdict.AT_RISK
    assert seen.slack_hours == pytest.approx(1.0)


def test_expected_to_be_late_but_able_without_preemptions_is_at_risk() -> None:
    seen = outlook(hours_left=39.0, expected_hours=40.0, fastest_hours=38.0, margin_hours=0.5)
    assert seen.verdict is DeadlineVerdict.AT_RISK
    assert seen.slack_hours == pytest.approx(-1.0)


def test_too_little_time_even_without_preemptions_cannot_meet_it() -> None:
    seen = outlook(hours_left=37.0, expected_hours=40.0, fastest_hours=38.0, margin_hours=0.5)
    assert seen == Outlook(DeadlineVerdict.CANNOT_MEET, -3.0)


def test_a_passed_deadline_cannot_be_met_whatever_the_work() -> None:
    seen = outlook(hours_left=-2.0, expected_hours=0.0, fastest_hours=0.0, margin_hours=0.0)
    assert seen.verdict is DeadlineVerdict.CANNOT_MEET


def test_nothing_placed_now_is_at_best_at_risk() -> None:
    seen = outlook(hours_left=500.0, expected_hours=40.0, fastest_hours=40.0, margin_hours=0.5,
                   placed=False)  # fmt: skip
    assert seen == Outlook(DeadlineVerdict.AT_RISK, 460.0)


def test_the_verdicts_read_as_words_on_the_wire() -> None:
    assert [str(v) for v in DeadlineVerdict] == ["meets", "at-risk", "cannot-meet"]
