"""What people are shown of a failed job, of money and of notify, against a real daemon
on the simulated market, driven by the real CLI.

A command that is not found fails its job, and ``spotd status``, ``spotd events``,
the API and the dashboard say ``command not found (exit 127)``; the dashboard and
the cost page show the failed job's spend and never a saving, and a running job's
spend so far, marked so; a job asking a daemon without ``[email]`` for email is
warned at submit.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from daemon_support import TRAINER, Daemon, Setup, make_setup, wait_for
from dashboard_support import api_token, base_url, login

from spotd.core.states import FailureCause, JobStatus
from spotd.core.values import ExitCause
from spotd.store import SqlStore, open_store

NOT_FOUND = "command not found (exit 127)"
WAIT_SECONDS = 120.0
"""The safety net of the waits for a page to be built: it takes well under a second."""

JOB = """
name = "{name}"
command = {command}

[resources]
gpus = ["A100"]
gpus_per_node = 1
{extra}
"""


def job_file(setup: Setup, name: str, command: list[str], extra: str = "") -> Path:
    """A one-node job file running ``command``."""
    path = setup.root / f"{name}.toml"
    path.write_text(JOB.format(name=name, command=json.dumps(command), extra=extra))
    return path


def submitted(setup: Setup, path: Path) -> str:
    return str(json.loads(setup.cli("submit", str(path), "--json").stdout)["id"])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Setup, SqlStore]]:
    """A daemon on a calm market (no preemption), and its store."""
    setup = make_setup(tmp_path_factory.mktemp("causes"), seed=5, up=500.0)
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    running = Daemon(setup)
    try:
        yield setup, store
    finally:
        assert running.stop() == 0
        store.close()


def test_a_command_not_found_fails_its_job_and_status_and_events_say_so(
    daemon: tuple[Setup, SqlStore],
) -> None:
    setup, store = daemon
    job_id = submitted(setup, job_file(setup, "lost", ["no-such-command"]))
    job = wait_for(store, job_id, lambda j, _: j.status.terminal)
    assert (job.status, job.failure) == (JobStatus.FAILED, FailureCause.USER_COMMAND_FAILED)
    # Typed, on the job and on the event that failed it: nobody parses the detail.
    assert (job.failure_facts.exit_code, job.failure_facts.exit_cause) == (127, ExitCause.NOT_FOUND)
    last = store.events(job_id)[-1]
    assert last.facts.exit_cause is ExitCause.NOT_FOUND and last.to_status is JobStatus.FAILED

    view = json.loads(setup.cli("status", job_id, "--json").stdout)
    assert (view["failure"], view["failure_reason"]) == ("user-command-failed", NOT_FOUND)
    assert view["failure_facts"]["exit_cause"] == "not-found"
    assert f"failed: {NOT_FOUND}" in setup.cli("status", job_id).stdout
    assert f"{job_id} failed: {NOT_FOUND}" in setup.cli("status", "--all").stdout
    events = json.loads(setup.cli("events", job_id, "--json").stdout)
    assert (events[-1]["facts"]["exit_cause"], events[-1]["facts"]["exit_said"]) == (
        "not-found", NOT_FOUND,
    )  # fmt: skip
    assert NOT_FOUND in setup.cli("events", job_id).stdout
    followed = setup.cli("logs", job_id, "--follow")
    assert f"{job_id}: failed: {NOT_FOUND}" in followed.stderr


def test_every_money_view_shows_a_failed_jobs_spend_without_saving_and_a_running_ones_so_far(
    daemon: tuple[Setup, SqlStore],
) -> None:
    setup, store = daemon
    failed = submitted(setup, job_file(setup, "broken", ["no-such-command"]))
    long_run = [sys.executable, str(TRAINER), "--steps", "100000", "--step-seconds", "0.1"]
    running = submitted(setup, job_file(setup, "long", long_run))
    wait_for(store, failed, lambda j, _: j.status is JobStatus.FAILED)
    wait_for(store, running, lambda j, _: j.status is JobStatus.RUNNING)
    try:
        with httpx.Client(base_url=base_url(setup), timeout=30) as client:
            cookie = {"Cookie": f"spotd_session={login(client, api_token(setup))}"}
            page = client.get(f"/dashboard/jobs/{failed}", headers=cookie).text
            assert f"failed: {NOT_FOUND}" in page
            assert 'id="saved"' not in page, "no saving for a job that failed"
            assert "no saving is claimed" in page
            listed = client.get("/dashboard/jobs", headers=cookie).text
            assert NOT_FOUND in _row(listed, failed) and "none (failed)" in _row(listed, failed)
            assert 'id="saved"' in client.get(f"/dashboard/jobs/{running}", headers=cookie).text
            cost = _built_cost_part(client, cookie)
        assert "none" in _row(cost, failed) and "failed" in _row(cost, failed)
        assert "running, so far" in _row(cost, running)
        assert 'id="running-spend"' in cost and 'id="no-saving-spend"' in cost
        report = setup.cli("report").stdout
        assert re.search(rf"{running}\s+long\s+running, so far", report), report
        assert re.search(rf"{failed}\s+broken\s+failed\s+[\d.,]+\s+–", report), report
    finally:
        setup.cli("cancel", running)


def _row(html: str, job_id: str) -> str:
    """The table row of ``job_id`` in a page."""
    found = re.search(rf'<tr data-job="{job_id}".*?</tr>', html, re.DOTALL)
    assert found is not None, html
    return found.group(0)


def _built_cost_part(client: httpx.Client, cookie: dict[str, str]) -> str:
    """The cost page's part once its report is built (it is built behind the page)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        text = client.get("/dashboard/fragments/cost", headers=cookie).text
        if 'id="building"' not in text:
            return text
        assert time.monotonic() < deadline, "the cost report was never built"
        time.sleep(0.05)


def test_email_asked_of_a_daemon_without_email_is_warned_at_submit(
    daemon: tuple[Setup, SqlStore],
) -> None:
    setup, _ = daemon
    notify = '\n[notify]\nemail = ["ml-team@example.com"]\non_end = true\n'
    path = job_file(setup, "mailed", [sys.executable, "-c", "pass"], notify)
    shown = json.loads(setup.cli("submit", str(path), "--json").stdout)
    assert [w["kind"] for w in shown["warnings"]] == ["no-email"]
    said = setup.cli("submit", str(path)).stderr
    assert "warning: notify.on_end asks for email, and this daemon has no [email]" in said
    assert "the job is stored and runs without email" in said
    quiet = submitted(setup, job_file(setup, "quiet", [sys.executable, "-c", "pass"]))
    assert json.loads(setup.cli("status", quiet, "--json").stdout)["warnings"] == []
