"""spotd.core.exit_codes: 2 for what the user gave wrong, 1 for what failed, 130 for Ctrl-C."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotd.core.errors import (
    ApiError,
    BadCursor,
    ConfigError,
    IdempotencyKeyReused,
    JobNotFound,
    JobSpecError,
    ProviderSdkMissing,
    RequestInvalid,
    SpotdError,
    StoreUnavailable,
    SubmitRefused,
    UnknownProviderKind,
)
from spotd.core.exit_codes import ExitCode, exit_code
from spotd.simulate.plots import PlotError
from spotd.simulate.scenario import ScenarioError
from spotd.simulate.timeline import TraceMissingError


@pytest.mark.parametrize(
    "exc",
    [
        JobSpecError("job.toml", ["name: field required"]),
        ConfigError("spotd.toml: daemon.prot: Extra inputs are not permitted"),
        UnknownProviderKind("no provider kind named 'aws2'"),
        RequestInvalid("limit: must be >= 1"),
        BadCursor("not a cursor of this daemon"),
        ScenarioError("s.toml", ["jobs[0].colour: unknown field"]),
        TraceMissingError("t.json: no such file"),
    ],
)
def test_an_error_in_what_was_given_exits_2(exc: SpotdError) -> None:
    assert exc.bad_input
    assert exit_code(exc) is ExitCode.BAD_INPUT
    assert int(exit_code(exc)) == 2


@pytest.mark.parametrize(
    "exc",
    [
        ApiError("no spotd daemon is running"),
        JobNotFound("no job j-nope"),
        StoreUnavailable("database is locked"),
        SubmitRefused("no provider offers H200"),
        IdempotencyKeyReused("key of another job"),
        ProviderSdkMissing("pip install 'spotd[aws]'"),
        PlotError("cannot write plots"),
        SpotdError("anything else"),
        ValueError("a bug"),
    ],
)
def test_a_failure_exits_1(exc: Exception) -> None:
    assert exit_code(exc) is ExitCode.FAILED
    assert int(exit_code(exc)) == 1


def test_ctrl_c_exits_130() -> None:
    assert exit_code(KeyboardInterrupt()) is ExitCode.INTERRUPTED
    assert int(ExitCode.INTERRUPTED) == 130


def test_the_codes_are_the_ones_docs_operations_lists() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    table = doc.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")}
    assert {str(int(code)) for code in ExitCode} <= rows, rows
