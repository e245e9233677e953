"""spotd.engine.submission.notify_warnings: what a job's ``notify`` asks that will not
happen is said at submit, never left a silent no-op."""

from __future__ import annotations

import pytest
from engine_support import spec

from spotd.core.values import SubmitWarningKind
from spotd.engine.submission import notify_warnings


@pytest.mark.parametrize(
    ("notify", "can_email", "kinds"),
    [
        ({}, False, []),
        ({}, True, []),
        ({"email": ["ml@example.com"]}, False, [SubmitWarningKind.NO_EMAIL]),
        ({"email": ["ml@example.com"], "on_end": True}, False, [SubmitWarningKind.NO_EMAIL]),
        ({"on_end": True}, False, [SubmitWarningKind.NO_EMAIL]),
        ({"email": ["ml@example.com"], "on_end": True}, True, []),
        ({"email": ["ml@example.com"]}, True, []),  # its budget alerts go to it
        ({"on_end": True}, True, [SubmitWarningKind.NO_ADDRESS]),
    ],
)
def test_notify_that_cannot_be_carried_out_is_warned_of(
    notify: dict[str, object], can_email: bool, kinds: list[SubmitWarningKind]
) -> None:
    found = notify_warnings(spec(notify=notify), can_email=can_email)
    assert [w.kind for w in found] == kinds


def test_the_warning_names_the_field_and_what_will_not_happen() -> None:
    (warning,) = notify_warnings(spec(notify={"on_end": True}), can_email=False)
    assert warning.detail.startswith("notify.on_end asks for email, and this daemon has no [email]")
    assert "no job-end email or budget alert is sent" in warning.detail
