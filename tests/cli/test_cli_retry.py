"""``spotd retry`` and ``spotd release`` as commands, and the kept nodes ``spotd status``
shows. (A retry end to end, on a real daemon: tests/daemon/test_retry_e2e.py.)"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from spotd.cli.app import app
from spotd.cli.render.console import use_zone
from spotd.cli.render.jobs import held_lines
from spotd.daemon.views import HeldView, JobView

NOW = datetime(2026, 1, 5, 10, 30, tzinfo=UTC)


def _failed(held: HeldView | None) -> JobView:
    return JobView(
        id="j-41f68be2c3", name="t", status="failed", failure="user-command-failed",
        submitted_at=NOW, updated_at=NOW, preemptions=0, providers=[], cost_usd=1.0,
        attempts=[], spec={}, held=held,
    )  # fmt: skip


@pytest.fixture(autouse=True)
def utc() -> None:
    use_zone(UTC)


def test_status_shows_the_kept_nodes_their_addresses_and_how_to_stop_them() -> None:
    held = HeldView(attempt=2, until=NOW, instance_ids=["i-1", "i-2"],
                    addresses=["10.0.0.7", "10.0.0.8"])  # fmt: skip
    (one,) = held_lines([_failed(held)], one=True)
    assert one == (
        "kept for inspection until 2026-01-05 10:30Z: attempt 2's i-1, i-2 at 10.0.0.7, "
        "10.0.0.8 (`spotd release j-41f68be2c3` stops them now)"
    )
    (listed,) = held_lines([_failed(held), _failed(None)], one=False)
    assert listed.startswith("j-41f68be2c3 kept for inspection until")
    bare = HeldView(attempt=1, until=NOW, instance_ids=["i-1"], addresses=[])
    assert "i-1 at no address reported" in held_lines([_failed(bare)], one=True)[0]


def test_both_commands_are_registered_with_their_help() -> None:
    from typer.testing import CliRunner

    for name, words in (("retry", "last complete checkpoint"), ("release", "keep_on_failure")):
        result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert words in result.stdout, result.stdout
