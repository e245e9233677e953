"""spotd.cli.app: help text wraps at the terminal's width, never where the source did."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from spotd.cli.app import app, reflowed


def shown(args: list[str], columns: int) -> str:
    """``spotd ARGS`` as a terminal of ``columns`` shows it (rich reads COLUMNS)."""
    result = CliRunner().invoke(app, args, env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.stdout


def commands() -> dict[str, Any]:
    """Every command by its path, the subcommands of a group included (``config check``),
    as ``--help`` gets them."""
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    ctx = typer.Context(root)
    found: dict[str, Any] = {}
    for name in root.list_commands(ctx):
        command = root.get_command(ctx, name)
        assert command is not None
        found[name] = command
        if isinstance(command, typer.core.TyperGroup):
            for sub in command.list_commands(ctx):
                found[f"{name} {sub}"] = command.get_command(typer.Context(command), sub)
    return found


def test_a_paragraph_becomes_one_line_and_paragraphs_stay_apart() -> None:
    text = """Run the agent: `spotd agent --
    CMD`.

    It runs the job's command, watches
    the notice.
    """
    assert reflowed(text) == (
        "Run the agent: `spotd agent -- CMD`.\n\nIt runs the job's command, watches the notice."
    )
    assert reflowed("\b\nkept\n  as written") == "\b\nkept\n  as written"
    assert reflowed(None) is None


def test_every_commands_help_has_no_line_break_inside_a_paragraph() -> None:
    found = commands()
    assert {"submit", "status", "agent", "simulate", "demo", "config check"} <= set(found)
    for name, command in found.items():
        assert command.help, name
        for paragraph in command.help.split("\n\n"):
            assert "\n" not in paragraph, (name, paragraph)


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("path", sorted(commands()))
def test_each_help_fits_the_terminal(path: str, columns: int) -> None:
    text = shown([*path.split(), "--help"], columns)
    assert max(len(line) for line in text.splitlines()) == columns, text


def test_the_command_list_gives_each_summary_on_one_line_at_120_columns() -> None:
    text = shown(["--help"], 120)
    for name, command in commands().items():
        if " " in name:
            continue
        summary = (command.help or "").split("\n\n")[0]
        if len(summary) <= 120 - 20:  # the box and the names take 20 columns
            assert f" {name} " in text and summary in text, (name, summary, text)


def test_the_command_list_wraps_a_summary_at_80_columns_between_words() -> None:
    text = " ".join(shown(["--help"], 80).replace("│", " ").split())
    summary = commands()["status"].help.split("\n\n")[0]
    assert summary in text, text  # its words in order, each whole


def test_a_later_paragraph_wraps_at_the_terminals_width() -> None:
    # Its source breaks after "notice,": at 120 columns the line goes on past it.
    wide = shown(["agent", "--help"], 120)
    assert "watches the provider's preemption notice, signals the job to checkpoint" in wide
    narrow = shown(["agent", "--help"], 60)
    assert max(len(line) for line in narrow.splitlines()) == 60
    assert "Configured by SPOTD_AGENT_* variables (see docs/agent.md)." in " ".join(narrow.split())
