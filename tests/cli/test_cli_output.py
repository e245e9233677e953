"""What the CLI prints a newcomer: whole job ids, whole lines, labelled times, plain flags."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from daemon_support import Daemon, Setup, make_setup
from rich.console import Console
from typer.testing import CliRunner

from spotd.cli.app import app
from spotd.cli.demo import event_line, print_event
from spotd.cli.render.jobs import events_table, facts_text, status_table
from spotd.daemon.views import AttemptView, EventFactsView, EventView, JobView

NOW = datetime(2026, 1, 5, 10, 30, tzinfo=UTC)


def _job(job_id: str) -> JobView:
    attempt = AttemptView.model_validate({
        "seq": 1, "provider": "sim-azure", "region": "westus3", "zone": "westus3-2",
        "instance_type": "Standard_ND96asr_v4", "market": "spot", "nodes": 1,
        "price_per_node_hour": 9.5, "instance_ids": ["i-1"], "started_at": NOW,
        "running_at": NOW, "ended_at": None, "end_reason": None, "cost_usd": 1.0,
        "resume_from": None,
    })  # fmt: skip
    return JobView(
        id=job_id, name="a-job-name-long-enough-to-crowd-an-80-column-table",
        status="running", failure=None, submitted_at=NOW, updated_at=NOW, preemptions=12,
        providers=["sim-azure"], cost_usd=1234.5, attempts=[attempt], spec={},
    )


def test_the_status_table_never_cuts_a_job_id_at_80_columns() -> None:
    jobs = [_job("j-41f68be2c3"), _job("j-0a9d77e1b5")]
    for width in (80, 60):
        shown = io.StringIO()
        Console(file=shown, width=width, force_terminal=True).print(status_table(jobs))
        assert "…" not in shown.getvalue()
        for job in jobs:
            assert job.id in shown.getvalue(), shown.getvalue()


def test_a_demo_event_line_stays_one_line_when_piped() -> None:
    event = EventView(
        at=NOW, from_status="running", to_status="recovering", cause="preempted",
        detail="sim-gcp/us-central1/us-central1-b/a2-highgpu-1g: the market took the pool's "
        "capacity back; resuming from step-00000090",
    )  # fmt: skip
    piped = io.StringIO()
    print_event(Console(file=piped, width=80), event)  # not a terminal: rich takes 80 columns
    assert piped.getvalue() == event_line(event) + "\n"
    assert len(event_line(event)) > 80


def test_events_show_their_facts_in_a_column_of_their_own() -> None:
    """Exit code (with the signal's name), node and rank, error class: from the event's
    facts; the column is there only when some event has any."""
    plain = EventView(at=NOW, from_status=None, to_status="pending", cause="submitted",
                      detail="")  # fmt: skip
    killed = EventView(
        at=NOW, from_status="running", to_status="recovering", cause="user-failed",
        detail="command on i-7 exited with 137",
        facts=EventFactsView(exit_code=137, signal=9, signal_name="SIGKILL", node="i-7", rank=1),
    )  # fmt: skip
    refused = EventView(
        at=NOW, from_status="provisioning", to_status="recovering", cause="no-capacity",
        detail="no room", facts=EventFactsView(error_class="CapacityError", provider="aws"),
    )  # fmt: skip
    assert facts_text(killed.facts) == "exit 137 SIGKILL, node i-7 rank 1"
    assert facts_text(refused.facts) == "CapacityError"
    assert facts_text(plain.facts) == ""

    def shown(rows: list[EventView]) -> str:
        text = io.StringIO()
        Console(file=text, width=200).print(events_table(rows))
        return text.getvalue()

    with_facts = shown([plain, killed, refused])
    assert "FACTS" in with_facts and "exit 137 SIGKILL, node i-7 rank 1" in with_facts
    assert "FACTS" not in shown([plain])
    # From a daemon that says how the command ended, its words; a failed check by name.
    said = EventFactsView(exit_code=127, exit_cause="not-found", node="i-7",
                          exit_said="command not found (exit 127)")  # fmt: skip
    assert facts_text(said) == "command not found (exit 127), node i-7"
    assert facts_text(EventFactsView(check="checkpoint_writable")) == (
        "check checkpoint_writable failed"
    )


def test_flags_show_no_value_type_and_daemon_takes_a_plain_verbose() -> None:
    runner = CliRunner()
    commands = ["status", "logs", "daemon", "plan", "report", "demo", "prices", "submit"]
    for args in ([], *([name] for name in commands)):
        shown = runner.invoke(app, [*args, "-h"], terminal_width=120)
        assert shown.exit_code == 0, shown.output
        assert "<bool>" not in shown.stdout, shown.stdout
    daemon = runner.invoke(app, ["daemon", "-h"], terminal_width=120).stdout
    assert re.search(r"--verbose\s+-v\s+Log at DEBUG", daemon), daemon
    assert "--no-verbose" not in daemon
    logs = runner.invoke(app, ["logs", "-h"], terminal_width=120).stdout
    assert re.search(r"--follow\s+-f\s+Keep printing new output", logs), logs
    # A flag still parses as one: -h's type is gone from the help, not from the parser.
    assert runner.invoke(app, ["status", "--json", "--all", "-h"]).exit_code == 0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    # No capacity ever drops (mean_up_hours), so the job runs once to its end.
    setup = make_setup(tmp_path_factory.mktemp("cli-output"), seed=3, up=1e6, boot=60)
    process = Daemon(setup)
    try:
        yield setup
    finally:
        process.stop()


def test_logs_follow_prints_a_jobs_output_until_it_ends(daemon: Setup) -> None:
    job = json.loads(daemon.cli("submit", str(daemon.job_file), "--json").stdout)
    followed = daemon.cli("logs", job["id"], "--follow")
    # Everything the trainer printed, its last line included, and how the job ended.
    assert re.search(r"^digest: [0-9a-f]{64}$", followed.stdout, re.MULTILINE), followed.stdout
    rules = [line for line in followed.stdout.splitlines() if line.startswith("─")]
    assert len(rules) == 1 and " attempt 1 " in rules[0], rules  # one per node, not per poll
    assert f"{job['id']}: succeeded" in followed.stderr
    # The same as the logs read at once, after the end.
    whole = daemon.cli("logs", job["id"]).stdout
    assert followed.stdout == whole


def test_job_ids_are_whole_and_times_say_their_clock(daemon: Setup) -> None:
    job = json.loads(daemon.cli("submit", str(daemon.job_file), "--json").stdout)
    config = ["-c", str(daemon.config)]
    runner = CliRunner()
    # CliRunner's output is a pipe: rich lays tables out on 80 columns there.
    listed = runner.invoke(app, ["status", "--all", *config])
    assert listed.exit_code == 0, listed.output
    assert job["id"] in listed.stdout, listed.stdout
    # The list is headed by the clock's note, above the table.
    assert listed.stdout.startswith("times on the simulated clock, 600x real time\n"), listed.stdout
    shown = runner.invoke(app, ["status", job["id"], *config]).stdout
    assert "attempts (times: simulated clock, 600x real time)" in shown, shown
    assert job["id"] in shown
    events = runner.invoke(app, ["events", job["id"], *config]).stdout
    assert "events (times: simulated clock, 600x real time)" in events, events
    assert re.search(r"^ *2026-02-02 \d\d:\d\d:\d\dZ ", events, re.MULTILINE), events
    as_json = json.loads(runner.invoke(app, ["events", job["id"], "--json", *config]).stdout)
    assert {e["clock"] for e in as_json} == {"simulated clock, 600x real time"}


def test_a_wall_clock_daemon_labels_no_times(tmp_path: Path) -> None:
    from spotd.core.clock import WallClock, clock_note

    assert clock_note(WallClock()) is None


@pytest.mark.parametrize(("columns", "width"), [(None, 200), ("90", 90)])
def test_piped_output_has_room_for_a_table_row_on_one_line(
    columns: str | None, width: int
) -> None:
    """A pipe has no width: rich would take 80 columns and fold a demo's summary row
    mid-word (``Standard_NC24ads_A10`` / ``0_v4``); COLUMNS, when set, still rules."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    probe = "from spotd.cli.render.console import out; print(out.width)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=60, check=True)  # fmt: skip
    assert int(done.stdout) == width
