"""spotd.cli.render.progress: a spinner naming the wait on a terminal, nothing elsewhere."""

from __future__ import annotations

import io

from rich.console import Console

from spotd.cli.render.progress import working


def test_a_terminal_sees_what_is_waited_for_then_nothing_of_it() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=80)
    with working("polling 3 provider(s) [sim]", console=console):
        console.print("a line printed meanwhile")
    drawn = screen.getvalue()
    assert "polling 3 provider(s) [sim] ..." in drawn  # markup in the text kept as text
    assert "a line printed meanwhile" in drawn
    assert drawn.endswith("\x1b[2K")  # the spinner's line erased at the end


def test_a_pipe_or_a_log_gets_no_spinner() -> None:
    log = io.StringIO()
    console = Console(file=log, force_terminal=False)
    with working("waiting for j-1 to stop", console=console):
        console.print("done")
    assert log.getvalue() == "done\n"


def test_an_error_in_the_block_still_takes_the_spinner_down() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=80)
    try:
        with working("building the report", console=console):
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert screen.getvalue().endswith("\x1b[2K")
