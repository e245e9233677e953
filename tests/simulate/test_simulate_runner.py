"""spotd.simulate.runner's progress: every run of a replay told, and shown as a bar only
on a terminal; stdout (``--json``) never carries it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from spotd.simulate.cli import replay_progress, simulate
from spotd.simulate.runner import Step, run_scenario

JOB = """
[[jobs]]
name = "{name}"
compute_hours = 3
deadline_fraction = 0.5
changeover_hours = 1
starts = 4
"""
SCENARIO = """
name = "tiny"

[[offerings]]
trace = "t/a.json"
provider = "aws"
region = "us-east-1"
zone = "us-east-1a"
instance_type = "p3.2xlarge"
""" + JOB.format(name="j") + JOB.format(name="k")


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    """Two jobs of four start points each on a one-offering trace."""
    trace = tmp_path / "t" / "a.json"
    trace.parent.mkdir()
    data = [1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1] * 2
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": data}))
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    return path


def test_every_run_of_every_job_is_told_up_to_its_total(scenario: Path) -> None:
    steps: list[Step] = []
    report = run_scenario(scenario, ["balanced"], on_step=steps.append)
    assert [j.prepared.job.name for j in report.jobs] == ["j", "k"]
    for job in report.jobs:
        told = [s for s in steps if s.job == job.prepared.job.name]
        runs = len(job.runs) * len(job.prepared.starts)  # the optimum's included
        assert told[-1].done == told[-1].total == runs
        assert [s.done for s in told] == sorted(s.done for s in told)
        assert {s.total for s in told} == {runs}
        assert {s.policy for s in told} == {r.name for r in job.runs}


def test_the_bar_is_drawn_on_a_terminal_and_gone_at_the_end(scenario: Path) -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with replay_progress(console) as on_step:
        run_scenario(scenario, on_step=on_step)
    drawn = screen.getvalue()
    assert "j: omniscient" in drawn and "k: omniscient" in drawn, drawn
    assert "16/16" in drawn  # (3 baselines + the optimum) x 4 start points, all done
    assert drawn.endswith("\x1b[1A\x1b[2K")  # and erased: the results print in its place


def test_nothing_is_drawn_where_stderr_is_no_terminal(scenario: Path) -> None:
    log = io.StringIO()
    with replay_progress(Console(file=log, force_terminal=False)) as on_step:
        run_scenario(scenario, on_step=on_step)
    assert log.getvalue() == ""


def test_json_output_stays_clean(scenario: Path) -> None:
    app = typer.Typer()
    app.command()(simulate)
    result = CliRunner().invoke(app, ["--scenario", str(scenario), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["scenario"] == "tiny"
    assert result.stderr == ""
