"""spotd.core.spec_errors: a misspelt field gets a "did you mean", a TOML error its line."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from spotd.core.errors import JobSpecError
from spotd.core.spec_errors import closest, toml_syntax_problem
from spotd.core.spec_io import parse_job_toml

MINIMAL = 'name = "t"\ncommand = ["true"]\n\n[resources]\ngpus = ["A100"]\ngpus_per_node = 1\n'


def problems_of(text: str) -> list[str]:
    with pytest.raises(JobSpecError) as caught:
        parse_job_toml(text, source="job.toml", base_dir=Path("/tmp"))
    return caught.value.problems


@pytest.mark.parametrize(
    ("name", "known", "guess"),
    [
        ("gpu", ["gpus", "gpus_per_node", "nodes"], "gpus"),
        ("gpus_per_nodes", ["gpus", "gpus_per_node", "nodes"], "gpus_per_node"),
        ("nmae", ["name", "command"], "name"),
        ("Checkpoint", ["checkpoint", "deadline"], "checkpoint"),
        ("max-restarts-on-errors", ["max_restarts_on_errors"], "max_restarts_on_errors"),
        ("max_restarts", ["launch_failures", "max_restarts_on_errors"], "max_restarts_on_errors"),
        ("colour", ["type", "providers", "regions"], None),
        ("x", ["name", "command"], None),
    ],
)
def test_closest_is_the_field_a_typo_most_likely_meant(
    name: str, known: list[str], guess: str | None
) -> None:
    assert closest(name, known) == guess


def test_a_misspelt_top_level_field_is_told_the_one_it_meant() -> None:
    problems = problems_of(MINIMAL.replace("command", "comand"))
    (unknown,) = [p for p in problems if p.startswith("comand")]
    assert unknown.startswith("comand (line 2): unknown field; did you mean command? "
                              "(expected one of name, command, ")  # fmt: skip


def test_a_misspelt_nested_field_is_told_the_one_of_its_table() -> None:
    problems = problems_of(MINIMAL + "gpu_per_node = 2\n")
    assert problems == [
        "resources.gpu_per_node (line 7): unknown field; did you mean gpus_per_node? "
        "(expected one of gpus, gpus_per_node, nodes, model_size_b, min_gbps_per_gpu)"
    ]


def test_a_misspelt_table_is_told_the_table_it_meant() -> None:
    (problem,) = problems_of(MINIMAL + "\n[checkpont]\nuri = \"ckpt\"\n")
    assert problem.startswith("checkpont (line 8): unknown field; did you mean checkpoint?")


def test_a_field_like_none_gets_the_list_alone() -> None:
    (problem,) = problems_of(MINIMAL + 'colour = "red"\n')
    assert problem == ("resources.colour (line 7): unknown field; expected one of gpus, "
                       "gpus_per_node, nodes, model_size_b, min_gbps_per_gpu")  # fmt: skip


def _syntax(text: str) -> str:
    with pytest.raises(tomllib.TOMLDecodeError) as caught:
        tomllib.loads(text)
    return toml_syntax_problem(caught.value, text)


def test_a_file_cut_short_names_its_last_line_with_text() -> None:
    # Not line 4, the empty one after the last newline and the blank lines.
    text = 'name = "t"\ncommand = [\n  "true",\n\n\n'
    assert _syntax(text) == "line 3 (end of file): invalid TOML: Invalid value"
    assert _syntax('name = "t"\nx = [') == "line 2 (end of file): invalid TOML: Invalid value"


def test_an_error_inside_the_file_keeps_tomls_own_line_and_column() -> None:
    assert _syntax('a = 1\nb = = 2\nc = 3\n') == "line 2, column 5: invalid TOML: Invalid value"
