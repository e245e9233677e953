"""Line numbers of job file problems: the line the editor shows, first, middle and last.

Each case puts the problem on a known line and checks the message names that line,
for a TOML syntax error (tomllib's position) and for a validation error (the key's
line, found by spotd.core.toml_lines.KeyLines), with and without a final newline,
with Windows line ends and after multi-line strings and arrays.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spotd.core.errors import JobSpecError
from spotd.core.spec_io import parse_job_toml
from spotd.core.toml_lines import KeyLines

LINES = [
    'name = "t"',
    'command = ["python3",',
    '  "train.py"]',
    "[env]",
    'NOTE = """',
    'two lines of text"""',
    "[resources]",
    'gpus = ["A100"]',
    "gpus_per_node = 1",
]
"""A valid job file of nine lines; the cases change one of them."""


def problem_of(lines: list[str], *, end: str = "\n", newline: str = "\n") -> str:
    """The one problem of the file, a required field it lacks aside."""
    text = newline.join(lines) + end
    with pytest.raises(JobSpecError) as caught:
        parse_job_toml(text, source="job.toml", base_dir=Path("/tmp"))
    (problem,) = [p for p in caught.value.problems if "field required" not in p]
    return problem


def changed(line: int, to: str) -> list[str]:
    lines = list(LINES)
    lines[line - 1] = to
    return lines


def test_the_file_as_written_is_valid() -> None:
    parse_job_toml("\n".join(LINES) + "\n", source="job.toml", base_dir=Path("/tmp"))


@pytest.mark.parametrize("end", ["\n", ""])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize(
    ("line", "to", "says"),
    [
        (1, 'name = = "t"', "line 1, column 8: invalid TOML"),
        (7, "[resources", "line 7, column 11: invalid TOML"),
        (9, "gpus_per_node = 1 1", "line 9, column 19: invalid TOML"),
    ],
)
def test_a_syntax_error_names_its_line(
    line: int, to: str, says: str, end: str, newline: str
) -> None:
    problem = problem_of(changed(line, to), end=end, newline=newline)
    assert problem.startswith(says), problem


@pytest.mark.parametrize("end", ["\n", ""])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize(
    ("line", "to", "says"),
    [
        (1, 'nme = "t"', "nme (line 1): unknown field; did you mean name?"),
        (4, "[evn]", "evn (line 4): unknown field; did you mean env?"),
        (8, 'gpus = ["A100", 1]', "resources.gpus[1] (line 8): expected a string"),
        (9, "gpus_per_node = -2", "resources.gpus_per_node (line 9): must be >= 1, got -2"),
    ],
)
def test_a_validation_error_names_the_line_of_its_key(
    line: int, to: str, says: str, end: str, newline: str
) -> None:
    problem = problem_of(changed(line, to), end=end, newline=newline)
    assert problem.startswith(says), problem


def test_the_last_line_left_open_is_named_not_the_one_after_it() -> None:
    problem = problem_of([*LINES[:8], "gpus_per_node = ["])
    assert problem == "line 9 (end of file): invalid TOML: Invalid value"


@pytest.mark.parametrize(
    ("text", "keys", "line"),
    [
        ('a = 1\nb = 2\nc = 3', ["a"], 1),
        ('a = 1\nb = 2\nc = 3', ["b"], 2),
        ('a = 1\nb = 2\nc = 3', ["c"], 3),
        ('a = """\n[x]\n"""\nb = 1', ["b"], 4),
        ("a = [\n  1,\n]\n[t]\nb = 1\n", ["t", "b"], 5),
        ("a = 1\f\nb = 2", ["b"], 2),  # a form feed ends no TOML line
    ],
)
def test_key_lines_are_one_based_and_counted_at_newlines_only(
    text: str, keys: list[str], line: int
) -> None:
    assert KeyLines(text).line_of(keys) == line
