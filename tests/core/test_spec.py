"""Tests for the job spec: examples, error messages, line locator, properties."""

from __future__ import annotations

import json
import math
import re
import sys
from datetime import UTC, date, datetime, time, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from spotd.core import limits
from spotd.core.errors import JobSpecError
from spotd.core.spec import SHELL, CheckpointSpec, JobSpec, MarketMode, MarketSpec, Resources
from spotd.core.spec_io import load_job_file, parse_job_toml, spec_from_json, spec_to_json
from spotd.core.toml_lines import KeyLines

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE = Path("/srv/jobs")

MINIMAL = """\
name = "t"
command = ["python3", "train.py"]

[resources]
gpus = ["H100"]
gpus_per_node = 8
"""


def parse(text: str, base: Path = BASE) -> JobSpec:
    return parse_job_toml(text, source="job.toml", base_dir=base)


def problems_of(text: str) -> list[str]:
    with pytest.raises(JobSpecError) as info:
        parse(text)
    return info.value.problems


# --------------------------------------------------------------------------
# Valid specs
# --------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_examples_load(path: Path) -> None:
    spec = load_job_file(path)
    assert spec.name
    assert spec.total_gpus >= 1
    assert spec_from_json(spec_to_json(spec)) == spec


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES.glob("*.toml")}
    assert {"job.toml", "multinode-70b.toml", "deadline.toml"} <= names


def test_example_job_resolves_paths_against_its_folder() -> None:
    spec = load_job_file(EXAMPLES / "job.toml")
    assert spec.command == ("python3", "train_tiny.py", "--steps", "200")
    assert spec.resources.gpus == ("A100", "H100", "L40S")
    assert spec.workdir == str(EXAMPLES)
    # No uri: each submission gets a checkpoint folder of its own from the daemon.
    assert spec.checkpoint.uri is None


def test_defaults() -> None:
    spec = parse(MINIMAL)
    assert spec.resources.nodes == 1
    assert spec.total_gpus == 8
    assert spec.env == {}
    assert spec.workdir is None
    assert spec.market == MarketSpec()
    assert spec.market.type is MarketMode.SPOT
    assert spec.market.providers == ("*",)
    assert spec.checkpoint == CheckpointSpec()
    assert spec.checkpoint.uri is None
    assert spec.checkpoint.interval == "auto"
    assert spec.checkpoint.size_gb == 1.0
    assert spec.checkpoint.on_notice is True
    assert spec.deadline is None
    assert spec.budget is None
    assert spec.notify.email == ()
    assert spec.notify.on_end is False


def test_shell_string_becomes_sh_c() -> None:
    spec = parse(MINIMAL.replace('["python3", "train.py"]', '"python3 train.py | tee log"'))
    assert spec.command == (SHELL, "-c", "python3 train.py | tee log")


def test_gpus_upper_cased_and_deduplicated_in_order() -> None:
    spec = parse(MINIMAL.replace('["H100"]', '["h100", "A100", "H100", "l40s"]'))
    assert spec.resources.gpus == ("H100", "A100", "L40S")


def test_relative_paths_resolve_against_base_dir() -> None:
    text = MINIMAL.replace('name = "t"', 'name = "t"\nworkdir = "../code"') + (
        '[checkpoint]\nuri = "ckpt/run1"\n'
    )
    spec = parse(text)
    assert spec.workdir == "/srv/code"
    assert spec.checkpoint.uri == "/srv/jobs/ckpt/run1"


@pytest.mark.parametrize(
    "uri",
    ["s3://bucket/run", "file:///data/ckpt", "gs://b/k", "simplecache::s3://b/k", "/abs/path"],
)
def test_uris_and_absolute_paths_kept(uri: str) -> None:
    spec = parse(MINIMAL + f'[checkpoint]\nuri = "{uri}"\n')
    assert spec.checkpoint.uri == uri


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"90s"', timedelta(seconds=90)),
        ('"15m"', timedelta(minutes=15)),
        ('"1h30m"', timedelta(hours=1, minutes=30)),
        ('"2h"', timedelta(hours=2)),
        ('"1h0m5s"', timedelta(hours=1, seconds=5)),
        ("600", timedelta(minutes=10)),
        ('"auto"', "auto"),
    ],
)
def test_durations(text: str, expected: object) -> None:
    spec = parse(MINIMAL + f"[checkpoint]\ninterval = {text}\n")
    assert spec.checkpoint.interval == expected


def test_finish_by_is_stored_in_utc() -> None:
    spec = parse(MINIMAL + "[deadline]\nfinish_by = 2026-12-24T02:00:00+02:00\n")
    assert spec.deadline is not None
    assert spec.deadline.finish_by == datetime(2026, 12, 24, tzinfo=UTC)
    assert spec.deadline.finish_by.utcoffset() == timedelta(0)
    assert spec.deadline.compute_hours is None


def test_market_globs() -> None:
    text = MINIMAL + '[market]\nproviders = ["AWS", "sim-*"]\nregions = ["us-east-*"]\n'
    spec = parse(text)
    assert spec.allows_provider("aws")
    assert spec.allows_provider("sim-eu")
    assert not spec.allows_provider("gcp")
    assert spec.allows_region("us-east-1")
    assert not spec.allows_region("us-west-2")
    assert parse(MINIMAL).allows_provider("anything")


def test_constructed_in_python() -> None:
    spec = JobSpec(
        name="py",
        command=("python3", "x.py"),
        resources=Resources(gpus=("h100",), gpus_per_node=4, nodes=2),
        checkpoint=CheckpointSpec(interval=timedelta(minutes=5)),
    )
    assert spec.resources.gpus == ("H100",)
    assert spec.total_gpus == 8
    assert spec_from_json(spec_to_json(spec)) == spec


def test_specs_are_frozen_and_hashable() -> None:
    spec = parse(MINIMAL + '[env]\nA = "1"\nB = "2"\n')
    same = parse(MINIMAL + '[env]\nB = "2"\nA = "1"\n')
    assert spec == same
    assert hash(spec) == hash(same)
    with pytest.raises(ValueError, match="frozen"):
        spec.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "other",
    ["priority = 5\n", 'team = "vision"\n'],
    ids=["priority", "team"],
)
def test_specs_that_differ_in_priority_or_team_are_neither_equal_nor_hash_alike(
    other: str,
) -> None:
    spec = parse(MINIMAL)
    differs = parse(other + MINIMAL)
    assert spec != differs
    assert hash(spec) != hash(differs)
    assert len({spec, differs}) == 2


def test_equal_specs_hash_alike_whatever_the_order_of_their_tables() -> None:
    fabric = '[fabric_env.efa]\nFI_A = "1"\nFI_B = "2"\n[fabric_env.infiniband]\nNCCL_X = "3"\n'
    reordered = '[fabric_env.infiniband]\nNCCL_X = "3"\n[fabric_env.efa]\nFI_B = "2"\nFI_A = "1"\n'
    head = 'priority = 7\nteam = "nlp"\n'
    spec = parse(head + MINIMAL + '[env]\nA = "1"\nB = "2"\n' + fabric)
    same = parse(head + MINIMAL + '[env]\nB = "2"\nA = "1"\n' + reordered)
    assert spec == same
    assert hash(spec) == hash(same)
    assert {spec: "kept"}[same] == "kept"


# --------------------------------------------------------------------------
# Bad specs: each error names the file, the field path and the line
# --------------------------------------------------------------------------

GOOD = """\
name = "bad-cases"
command = ["python3", "train.py"]

[resources]
gpus = ["H100"]
gpus_per_node = 8
nodes = 1

[checkpoint]
interval = "auto"

[deadline]
finish_by = 2026-12-24T00:00:00Z

[notify]
email = ["ml-team@example.com"]
"""

BAD_CASES: list[tuple[str, str, str, str, int | None, str]] = [
    # (id, old, new, path in message, line, what the message says)
    ("missing-name", 'name = "bad-cases"\n', "", "name", None, "field required"),
    (
        "missing-nested",
        'gpus = ["H100"]\n',
        "",
        "resources.gpus",
        None,
        "field required (table [resources] at line 4)",
    ),
    ("wrong-type", "gpus_per_node = 8", 'gpus_per_node = "8"', "resources.gpus_per_node", 6,
     "expected an integer, got string '8'"),
    ("wrong-type-bool", "nodes = 1", "nodes = true", "resources.nodes", 7, "expected an integer"),
    ("unknown-top", 'name = "bad-cases"', 'name = "bad-cases"\ncolour = "red"', "colour", 2,
     "unknown field"),
    ("unknown-nested", "nodes = 1", 'nodes = 1\ncolour = "red"', "resources.colour", 8,
     "unknown field; expected one of gpus, gpus_per_node"),
    ("unknown-table", "[notify]", "[notfy]", "notfy", 15, "unknown field"),
    ("negative-gpus", "gpus_per_node = 8", "gpus_per_node = -2", "resources.gpus_per_node", 6,
     "must be >= 1, got -2"),
    ("too-many-gpus", "gpus_per_node = 8", "gpus_per_node = 17", "resources.gpus_per_node", 6,
     "must be <= 16, got 17"),
    ("zero-nodes", "nodes = 1", "nodes = 0", "resources.nodes", 7, "must be >= 1, got 0"),
    ("no-gpu-models", 'gpus = ["H100"]', "gpus = []", "resources.gpus", 5, "at least one GPU"),
    ("bad-toml", "nodes = 1", "nodes = = 1", "line 7, column", None, "invalid TOML"),
    ("bad-toml-eof", 'email = ["ml-team@example.com"]', "email = [", "line 16 (end of file)",
     None, "invalid TOML"),
    ("bad-duration", 'interval = "auto"', 'interval = "5 minutes"', "checkpoint.interval", 10,
     "expected \"auto\" or a duration"),
    ("zero-duration", 'interval = "auto"', "interval = 0", "checkpoint.interval", 10, "> 0"),
    ("float-duration", 'interval = "auto"', "interval = 1.5", "checkpoint.interval", 10,
     "integer of seconds"),
    ("naive-finish-by", "finish_by = 2026-12-24T00:00:00Z", "finish_by = 2026-12-24T00:00:00",
     "deadline.finish_by", 13, "add an offset or Z"),
    ("date-finish-by", "finish_by = 2026-12-24T00:00:00Z", "finish_by = 2026-12-24",
     "deadline.finish_by", 13, "offset date-time"),
    ("quoted-finish-by", "finish_by = 2026-12-24T00:00:00Z",
     'finish_by = "2026-12-24T00:00:00Z"', "deadline.finish_by", 13, "without quotes"),
    ("bad-email", '["ml-team@example.com"]', '["ml-team@example.com", "nobody"]',
     "notify.email[1]", 16, "not an email address"),
    ("email-two-ats", '["ml-team@example.com"]', '["a@b@example.com"]', "notify.email[0]", 16,
     "not an email address"),
    ("email-space", '["ml-team@example.com"]', '["ml team@example.com"]', "notify.email[0]", 16,
     "not an email address"),
    ("empty-command", '["python3", "train.py"]', "[]", "command", 2, "must not be empty"),
    ("blank-shell-command", '["python3", "train.py"]', '"  "', "command", 2, "must not be empty"),
    ("command-not-strings", '["python3", "train.py"]', '["python3", 7]', "command[1]", 2,
     "expected a string, got integer 7"),
    ("bad-name", 'name = "bad-cases"', 'name = "-bad name"', "name", 1, "1-63 characters"),
    ("long-name", 'name = "bad-cases"', f'name = "{"x" * 64}"', "name", 1, "1-63 characters"),
    ("bad-env-name", "[checkpoint]", '[env]\n"1X" = "y"\n[checkpoint]', "env.1X", 10,
     "not a valid environment variable name"),
    ("env-not-string", "[checkpoint]", "[env]\nX = 1\n[checkpoint]", "env.X", 10,
     "expected a string, got integer 1"),
    ("bad-market", "[checkpoint]", '[market]\ntype = "cheap"\n[checkpoint]', "market.type", 10,
     "expected one of 'spot', 'on-demand' or 'auto'"),
    ("table-not-table", '"train.py"]', '"train.py"]\nbudget = 5', "budget", 3,
     "expected a table, got integer 5"),
    ("negative-budget", "[checkpoint]", "[budget]\nmax_usd = -1.0\n[checkpoint]",
     "budget.max_usd", 10, "must be > 0, got -1"),
    ("inf-price", "[checkpoint]", "[market]\nmax_price_per_gpu_hour = inf\n[checkpoint]",
     "market.max_price_per_gpu_hour", 10, "finite"),
    ("empty-providers", "[checkpoint]", "[market]\nproviders = []\n[checkpoint]",
     "market.providers", 10, "at least one pattern"),
    ("unknown-protocol", "[checkpoint]", '[checkpoint]\nuri = "s4://b/k"', "checkpoint.uri", 10,
     "unknown storage protocol 's4'"),
    ("on-end-not-bool", "[notify]", "[notify]\non_end = 1", "notify.on_end", 16,
     "expected true or false"),
    ("on-notice-not-bool", 'interval = "auto"', 'on_notice = "yes"', "checkpoint.on_notice", 10,
     "expected true or false"),
    ("empty-table", 'gpus = ["H100"]\ngpus_per_node = 8\nnodes = 1\n', "",
     "resources.gpus_per_node", None, "field required (table [resources] at line 4)"),
]


@pytest.mark.parametrize(
    ("old", "new", "path", "line", "says"),
    [case[1:] for case in BAD_CASES],
    ids=[case[0] for case in BAD_CASES],
)
def test_bad_files(
    tmp_path: Path, old: str, new: str, path: str, line: int | None, says: str
) -> None:
    assert old in GOOD
    file = tmp_path / "bad job.toml"
    file.write_text(GOOD.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(JobSpecError) as info:
        load_job_file(file)
    err = info.value
    assert err.source == str(file)
    assert str(file) in str(err)
    matching = [p for p in err.problems if p.startswith(path)]
    assert matching, err.problems
    problem = matching[0]
    assert says in problem, problem
    if line is not None:
        assert f"{path} (line {line}): " in problem, problem


def test_good_base_of_bad_cases_is_valid() -> None:
    # Each bad case changes one line of GOOD, so GOOD itself must pass as written.
    spec = parse(GOOD)
    assert (spec.name, spec.resources.gpus, spec.resources.gpus_per_node) == (
        "bad-cases", ("H100",), 8
    )
    assert spec.notify.email == ("ml-team@example.com",)


def test_every_problem_is_reported_at_once() -> None:
    text = GOOD.replace("nodes = 1", "nodes = 0\ncolour = 1").replace("[notify]", "[notify]\nx=1")
    problems = problems_of(text)
    assert len(problems) == 3
    paths = [p.split(" ")[0] for p in problems]
    assert paths == ["resources.nodes", "resources.colour", "notify.x"]


def test_inline_tables_and_dotted_keys_are_located() -> None:
    text = (
        'name = "t"\n'
        'command = "x"\n'
        "resources.gpus = [1]\n"
        "resources.gpus_per_node = 0\n"
        'market = { type = "spot", colour = 1 }\n'
    )
    assert problems_of(text) == [
        "resources.gpus[0] (line 3): expected a string, got integer 1",
        "resources.gpus_per_node (line 4): must be >= 1, got 0",
        "market.colour (line 5): unknown field; expected one of type, providers, regions, "
        "max_price_per_gpu_hour, max_run_hours",
    ]


def test_missing_whole_table() -> None:
    assert problems_of('name = "t"\ncommand = "x"\n') == ["resources: field required"]


def test_crlf_line_numbers() -> None:
    text = GOOD.replace("nodes = 1", "nodes = 0").replace("\n", "\r\n")
    assert "resources.nodes (line 7): must be >= 1, got 0" in problems_of(text)


def test_deep_nesting_is_a_spec_error() -> None:
    with pytest.raises(JobSpecError):
        parse("a = " + "[" * 5000 + "]" * 5000)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match="cannot read"):
        load_job_file(tmp_path / "missing.toml")
    with pytest.raises(JobSpecError, match="cannot read"):
        load_job_file(tmp_path)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"name = \xff\xfe\n")
    with pytest.raises(JobSpecError, match="not UTF-8"):
        load_job_file(binary)


def test_bom_is_accepted(tmp_path: Path) -> None:
    file = tmp_path / "bom.toml"
    file.write_bytes(b"\xef\xbb\xbf" + MINIMAL.encode())
    assert load_job_file(file).name == "t"


def test_lone_surrogates_are_rejected() -> None:
    text = MINIMAL.replace('"train.py"', '"\ud800"')
    assert problems_of(text) == ["line 2: not valid Unicode text (lone surrogate '\\ud800')"]


def test_spec_from_json_rejects_garbage() -> None:
    with pytest.raises(JobSpecError):
        spec_from_json("{not json")
    with pytest.raises(JobSpecError):
        spec_from_json('{"name": "x"}')


# --------------------------------------------------------------------------
# Bounds: every number and size has one a real job can use (spotd.core.limits)
# --------------------------------------------------------------------------


def job(top: str = "", resources: str = "", tables: str = "") -> str:
    """MINIMAL with ``top`` keys from line 3, then ``[resources]`` (its header on line 3
    when ``top`` is empty) with ``resources`` keys after its own, then ``tables``."""
    return (
        f'name = "t"\ncommand = ["python3", "train.py"]\n{top}'
        f'[resources]\ngpus = ["H100"]\ngpus_per_node = 8\n{resources}{tables}'
    )


def strings(*items: str) -> str:
    """A TOML array of the (plain) strings ``items``."""
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def env_lines(count: int, size: int) -> str:
    return "".join(f'V{i} = "{"x" * size}"\n' for i in range(count))


BIG = "x" * 900 * 1024
LONGEST = 'must be at most 366 days ("8784h" or 31622400 seconds)'
ENV_SUM = "must add up to at most {} bytes (each NAME=value with a NUL, as exec counts them)"
CODE = f'[code]\nuri = "s3://b/c.tar.gz"\nsha256 = "{"0" * 64}"\n'
SECRETS = [f"S{i}" for i in range(1025)]

BOUND_CASES: list[tuple[str, str, str]] = [
    # (id, job file, its one problem)
    # The four: each was accepted, then broke or stalled the job's passes.
    ("size_gb=1e308", job(tables="[checkpoint]\nsize_gb = 1e308\n"),
     "checkpoint.size_gb (line 7): must be <= 1000000, got 1e+308"),
    ("nodes=10**30", job(resources=f"nodes = {10**30}\n"),
     f"resources.nodes (line 6): must be <= 4096, got {10**30}"),
    ("env-900KB", job(tables=f'[env]\nBIG = "{BIG}"\n'),
     "env.BIG (line 7): must be at most 32768 bytes (UTF-8), got 921600"),
    ("interval=99999999h", job(tables='[checkpoint]\ninterval = "99999999h"\n'),
     f"checkpoint.interval (line 7): {LONGEST}, got string '99999999h'"),
    ("interval=10**20", job(tables=f"[checkpoint]\ninterval = {10**20}\n"),
     f"checkpoint.interval (line 7): {LONGEST}, got integer {10**20}"),
    # Numbers
    ("size_gb-least", job(tables="[checkpoint]\nsize_gb = 1e-7\n"),
     "checkpoint.size_gb (line 7): must be >= 1e-06, got 1e-07"),
    ("nodes", job(resources="nodes = 4097\n"),
     "resources.nodes (line 6): must be <= 4096, got 4097"),
    ("model_size_b", job(resources="model_size_b = 100000.5\n"),
     "resources.model_size_b (line 6): must be <= 100000, got 100000.5"),
    ("min_gbps_per_gpu", job(resources="min_gbps_per_gpu = 1e5\n"),
     "resources.min_gbps_per_gpu (line 6): must be <= 10000, got 100000"),
    ("max_price_per_gpu_hour", job(tables="[market]\nmax_price_per_gpu_hour = 1001\n"),
     "market.max_price_per_gpu_hour (line 7): must be <= 1000, got 1001"),
    ("max_run_hours", job(tables="[market]\nmax_run_hours = 2881\n"),
     "market.max_run_hours (line 7): must be <= 2880, got 2881"),
    ("compute_hours", job(tables="[deadline]\ncompute_hours = 1e15\n"),
     "deadline.compute_hours (line 7): must be <= 8784, got 1000000000000000"),
    ("max_usd", job(tables="[budget]\nmax_usd = 2e9\n"),
     "budget.max_usd (line 7): must be <= 1000000000, got 2000000000"),
    ("min_busbw_gbps", job(tables="[preflight]\nmin_busbw_gbps = 10000.5\n"),
     "preflight.min_busbw_gbps (line 7): must be <= 10000, got 10000.5"),
    ("priority", job(top="priority = 1000001\n"),
     "priority (line 3): must be <= 1000000, got 1000001"),
    ("launch_failures", job(tables="[retry]\nlaunch_failures = 1001\n"),
     "retry.launch_failures (line 7): must be <= 1000, got 1001"),
    ("master_port", job(tables="[gang]\nmaster_port = 65536\n"),
     "gang.master_port (line 7): must be <= 65535, got 65536"),
    ("code.size_bytes", job(tables=f"{CODE}size_bytes = {2**40 + 1}\nfiles = 1\n"),
     f"code.size_bytes (line 9): must be <= {2**40}, got {2**40 + 1}"),
    ("code.files", job(tables=f"{CODE}size_bytes = 1\nfiles = 100000001\n"),
     "code.files (line 10): must be <= 100000000, got 100000001"),
    ("nan", job(tables="[checkpoint]\nsize_gb = nan\n"),
     "checkpoint.size_gb (line 7): expected a finite number, got nan"),
    ("inf", job(tables="[budget]\nmax_usd = inf\n"),
     "budget.max_usd (line 7): expected a finite number, got float inf"),
    # Durations: one bound, said alike however the duration is written
    ("interval-seconds", job(tables="[checkpoint]\ninterval = 31622401\n"),
     f"checkpoint.interval (line 7): {LONGEST}, got integer 31622401"),
    ("gang.timeout", job(tables='[gang]\ntimeout = "8784h0m1s"\n'),
     f"gang.timeout (line 7): {LONGEST}, got string '8784h0m1s'"),
    ("preflight.timeout", job(tables="[preflight]\ntimeout = 99999999999\n"),
     f"preflight.timeout (line 7): {LONGEST}, got integer 99999999999"),
    # What a node execs
    ("env-name", job(tables=f'[env]\n{"N" * 256} = "1"\n'),
     f"env.{'N' * 256} (line 7): must be at most 255 characters, got 256"),
    ("env-value-in-utf8", job(tables=f'[env]\nV = "{"é" * 16385}"\n'),
     "env.V (line 7): must be at most 32768 bytes (UTF-8), got 32770"),
    ("env-variables", job(tables="[env]\n" + env_lines(1025, 1)),
     "env (line 6): must have at most 1024 variables, got 1025"),
    ("env-in-all", job(tables="[env]\n" + env_lines(9, 32000)),
     f"env (line 6): {ENV_SUM.format(262144)}, got 288036"),
    ("fabric_env-value", job(tables=f'[fabric_env.efa]\nFI_X = "{BIG}"\n'),
     "fabric_env.efa.FI_X (line 7): must be at most 32768 bytes (UTF-8), got 921600"),
    ("fabric_env-in-all", job(tables="[fabric_env.roce]\n" + env_lines(3, 30000)),
     f"fabric_env.roce (line 6): {ENV_SUM.format(65536)}, got 90012"),
    ("secrets", job(top=f"secrets = {strings(*SECRETS)}\n"),
     "secrets (line 3): must have at most 1024 names, got 1025"),
    ("command-items", job().replace('"train.py"', ", ".join(['"t"'] * 4096)),
     "command (line 2): must have at most 4096 items, got 4097"),
    ("command-item", job().replace('"train.py"', f'"{BIG}"'),
     "command[1] (line 2): must be at most 32768 bytes (UTF-8), got 921600"),
    ("shell-command", job().replace('["python3", "train.py"]', f'"{BIG}"'),
     "command[2] (line 2): must be at most 32768 bytes (UTF-8), got 921600"),
    ("command-in-all", job().replace('"train.py"', ", ".join([f'"{"x" * 30000}"'] * 5)),
     "command (line 2): must add up to at most 131072 bytes (each item with a NUL, as exec "
     "counts them), got 150013"),
    ("setup-line", job(top=f"setup = {strings(BIG)}\n"),
     "setup[0] (line 3): must be at most 32768 bytes (UTF-8), got 921600"),
    ("setup-lines", job(top=f"setup = {strings(*['true'] * 257)}\n"),
     "setup (line 3): must have at most 256 lines, got 257"),
    # Paths, names and lists
    ("workdir", job(top=f'workdir = "{"/d" * 2048}"\n'),
     "workdir (line 3): must be at most 4095 bytes (UTF-8), got 4096"),
    ("workdir-as-resolved", job(top=f'workdir = "{"d/" * 2044}"\n'),
     "workdir (line 3): must be at most 4095 bytes (UTF-8), got 4097 once made absolute"),
    ("checkpoint.uri", job(tables=f'[checkpoint]\nuri = "s3://b/{"k" * 4089}"\n'),
     "checkpoint.uri (line 7): must be at most 4095 bytes (UTF-8), got 4096"),
    ("code.uri", job(tables=CODE.replace("c.tar.gz", "c" * 4089) + "size_bytes = 1\nfiles = 1\n"),
     "code.uri (line 7): must be at most 4095 bytes (UTF-8), got 4096"),
    ("image", job(top=f'image = "{"i" * 513}"\n'),
     "image (line 3): must be at most 512 characters, got 513"),
    ("gpu-name", job().replace('["H100"]', strings("H" * 64)),
     "resources.gpus[0] (line 4): must be at most 63 characters, got 64"),
    ("gpus", job().replace('["H100"]', strings(*["H100"] * 65)),
     "resources.gpus (line 4): must have at most 64 models, got 65"),
    ("providers", job(tables=f"[market]\nproviders = {strings(*['aws'] * 65)}\n"),
     "market.providers (line 7): must have at most 64 patterns, got 65"),
    ("region-pattern", job(tables=f"[market]\nregions = {strings('r' * 256)}\n"),
     "market.regions[0] (line 7): must be at most 255 characters, got 256"),
    ("emails", job(tables=f"[notify]\nemail = {strings(*['a@b.io'] * 65)}\n"),
     "notify.email (line 7): must have at most 64 addresses, got 65"),
    ("email", job(tables=f"[notify]\nemail = {strings('a' * 250 + '@b.io')}\n"),
     "notify.email[0] (line 7): must be at most 254 characters, got 255"),
    ("exit-codes", job(tables=f"[retry]\nrestart_on_exit_codes = {[1] * 512}\n"),
     "retry.restart_on_exit_codes (line 7): must have at most 511 codes, got 512"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "problem"), [c[1:] for c in BOUND_CASES], ids=[c[0] for c in BOUND_CASES]
)
def test_every_field_is_bounded_and_its_problem_names_the_field_and_the_bound(
    text: str, problem: str
) -> None:
    assert problems_of(text) == [problem]


def test_figures_at_the_bounds_are_accepted() -> None:
    # Each figure a bound names is one a real job may use: here most of them at once.
    top = (
        f'workdir = "{"/d" * 2047}w"\nimage = "{"i" * 512}"\n'
        f"setup = {strings('s' * 32768, *['true'] * 255)}\n"
        f"secrets = {strings(*SECRETS[:1024])}\n"
    )
    resources = "nodes = 4096\nmodel_size_b = 100000\nmin_gbps_per_gpu = 10000\n"
    tables = (
        # 8 variables of 2 + 1 + 32764 + 1 bytes: 262144, what [env] may hold in all.
        "[env]\n" + env_lines(8, 32764)
        + f"[market]\nproviders = {strings(*['*'] * 64)}\nregions = {strings('r' * 255)}\n"
        + "max_price_per_gpu_hour = 1000\nmax_run_hours = 2880\n"
        + '[checkpoint]\ninterval = "8784h"\nsize_gb = 1e6\n'
        + "[deadline]\ncompute_hours = 8784\n[budget]\nmax_usd = 1e9\n"
        + f"[retry]\nrestart_on_exit_codes = {list(range(-255, 256))}\n"
        + f"[notify]\nemail = {strings(*['a' * 249 + '@b.io'] * 64)}\n"
        + '[gang]\ntimeout = 31622400\n[preflight]\ntimeout = "8784h"\n'
        + "min_busbw_gbps = 10000\n"
        + "[fabric_env.infiniband]\n" + env_lines(2, 32764)
        + CODE.replace("c.tar.gz", "c" * 4088) + f"size_bytes = {2**40}\nfiles = 100000000\n"
    )  # fmt: skip
    text = job(top, resources, tables)
    text = text.replace('["H100"]', strings("H100", *["G" * 63] * 63), 1)
    # 4096 items, one of 32768 bytes.
    text = text.replace('"train.py"', ", ".join([f'"{"a" * 32768}"', *['"t"'] * 4094]), 1)
    spec = parse(text)
    assert (spec.resources.nodes, spec.checkpoint.size_gb) == (4096, 1e6)
    assert spec.checkpoint.interval == timedelta(days=366)
    assert spec.gang.timeout == spec.preflight.timeout == timedelta(days=366)
    assert len(spec.command) == 4096
    assert sum(len(k) + len(v) + 2 for k, v in spec.env.items()) == 262144
    assert len(spec.workdir or "") == 4095
    assert len(spec.notify.email) == 64
    assert spec_from_json(spec_to_json(spec)) == spec


def test_a_json_submit_meets_the_same_bounds() -> None:
    # POST /v1/jobs validates its body with the same model, with no job file.
    body: dict[str, Any] = {
        "name": "t",
        "command": ["python3", "train.py"],
        "env": {"BIG": BIG},
        "resources": {"gpus": ["H100"], "gpus_per_node": 8, "nodes": 10**30},
        "checkpoint": {"size_gb": 1e308, "interval": 10**20},
    }
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(body)
    said = {".".join(map(str, e["loc"])): e["msg"] for e in info.value.errors()}
    assert said == {
        "env.BIG": "Value error, must be at most 32768 bytes (UTF-8), got 921600",
        "resources.nodes": f"Value error, must be <= 4096, got {10**30}",
        "checkpoint.interval": f"Value error, {LONGEST}, got integer {10**20}",
        "checkpoint.size_gb": "Value error, must be <= 1000000, got 1e+308",
    }
    body["checkpoint"] = {"interval": "99999999h"}
    with pytest.raises(ValidationError, match="must be at most 366 days"):
        JobSpec.model_validate(body)


def test_a_stored_spec_beyond_the_bounds_is_still_read() -> None:
    # A job stored before the bounds stays readable: one spec that no longer read would
    # stop every read of the jobs beside it, a listing or a reconcile pass.
    stored = json.loads(spec_to_json(parse(MINIMAL)))
    stored["resources"]["nodes"] = 10**30
    stored["checkpoint"].update(size_gb=1e308, interval=99999999 * 3600)
    stored["env"] = {"BIG": BIG}
    spec = spec_from_json(json.dumps(stored))
    assert spec.resources.nodes == 10**30
    assert spec.checkpoint.size_gb == 1e308
    assert spec.checkpoint.interval == timedelta(hours=99999999)
    assert spec.env == {"BIG": BIG}
    assert spec_from_json(spec_to_json(spec)) == spec


def test_an_integer_too_long_for_python_to_read_is_a_spec_error() -> None:
    assert problems_of(job(resources=f"nodes = {'1' * 5000}\n")) == [
        f"invalid TOML: an integer of over {sys.get_int_max_str_digits()} digits"
    ]


# --------------------------------------------------------------------------
# The line locator
# --------------------------------------------------------------------------

LOCATOR_TEXT = '''\
top = 1
[a]
x = 1
"quoted key" = 2
[a.b]
y.z = 3
s = """
[fake]
fake_key = 1
"""
arr = [
  "[not a table]",
  { k = 1 },
]
after = 4
[[list]]
item = 5
'''


@pytest.mark.parametrize(
    ("keys", "line"),
    [
        (["top"], 1),
        (["a"], 2),
        (["a", "x"], 3),
        (["a", "quoted key"], 4),
        (["a", "b"], 5),
        (["a", "b", "y"], 6),
        (["a", "b", "y", "z"], 6),
        (["a", "b", "s"], 7),
        (["fake"], None),
        (["a", "b", "fake_key"], 5),  # falls back to the table it would be in
        (["a", "b", "arr"], 11),
        (["a", "b", "after"], 15),
        (["list"], 16),
        (["list", "item"], 17),
        (["nowhere"], None),
    ],
)
def test_locator(keys: list[str], line: int | None) -> None:
    assert KeyLines(LOCATOR_TEXT).line_of(keys) == line


@given(st.text(), st.lists(st.text(max_size=5), max_size=3))
@settings(max_examples=200, deadline=None)
def test_locator_never_crashes(text: str, keys: list[str]) -> None:
    line = KeyLines(text).line_of(keys)
    assert line is None or line >= 1


# --------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def toml_string(value: str) -> str:
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_key(key: str) -> str:
    return key if _BARE.fullmatch(key) else toml_string(key)


def toml_value(value: Any) -> str:
    """A TOML value for the types the strategies make (nested tables inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def toml_document(doc: dict[str, Any]) -> str:
    """Top-level tables as [headers], everything else as key = value before them."""
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for key, table in doc.items():
        if isinstance(table, dict):
            lines.append(f"[{toml_key(key)}]")
            lines.extend(f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


TABLES: dict[str, list[str]] = {
    "env": ["PATH", "HF_HOME", "1BAD", "a b"],
    "resources": ["gpus", "gpus_per_node", "nodes", "model_size_b", "min_gbps_per_gpu"],
    "market": ["type", "providers", "regions", "max_price_per_gpu_hour"],
    "checkpoint": ["uri", "interval", "size_gb", "on_notice"],
    "deadline": ["compute_hours", "finish_by"],
    "budget": ["max_usd"],
    "notify": ["email", "on_end"],
}
SCALARS = ["name", "command", "workdir"]

offsets = st.integers(-12 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
aware = st.datetimes(
    min_value=datetime(1990, 1, 1), max_value=datetime(2200, 1, 1), timezones=offsets
)
plausible = st.sampled_from(
    [
        "H100", "auto", "spot", "on-demand", "1h30m", "90s", "0s", "ckpt", "s3://b/k",
        "a@b.com", "", "*", 0, 1, 8, 16, 17, -2, 3.5, 0.0, ["H100", "a100"], ["*"],
        ["a@b.com"], ["python3", "x.py"], [], True, False,
    ]
)
scalars = (
    st.text(max_size=12)
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.booleans()
    | aware
    | st.datetimes()
    | st.dates()
    | st.times()
    | plausible
)
any_key = st.text(max_size=6)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_key, inner, max_size=4),
    max_leaves=8,
)


@st.composite
def spec_like_docs(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key in SCALARS:
        if draw(st.booleans()):
            doc[key] = draw(values)
    for table, keys in TABLES.items():
        if draw(st.booleans()):
            if draw(st.integers(0, 4)) == 0:
                doc[table] = draw(values)
            else:
                doc[table] = draw(
                    st.dictionaries(st.sampled_from(keys) | any_key, values, max_size=len(keys))
                )
    doc.update(draw(st.dictionaries(any_key, values, max_size=2)))
    return doc


@st.composite
def mutated_valid_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid document with a few keys set to random values: errors one at a time."""
    doc = draw(valid_docs())
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["", *TABLES]))
        if where == "":
            doc[draw(st.sampled_from(SCALARS) | any_key)] = draw(values)
        else:
            table = doc.setdefault(where, {})
            if isinstance(table, dict):
                table[draw(st.sampled_from(TABLES[where]) | any_key)] = draw(values)
    return doc


@given(spec_like_docs() | mutated_valid_docs())
@settings(max_examples=200, deadline=None)
def test_random_documents_give_spec_or_spec_error(doc: dict[str, Any]) -> None:
    text = toml_document(doc)
    try:
        spec = parse(text)
    except JobSpecError as err:
        assert err.problems
        assert all(isinstance(p, str) and p for p in err.problems)
    else:
        assert isinstance(spec, JobSpec)


@given(st.text())
@settings(max_examples=200, deadline=None)
def test_arbitrary_text_gives_spec_or_spec_error(text: str) -> None:
    try:
        parse(text)
    except JobSpecError as err:
        assert err.problems


env_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
no_nul_text = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=20
)


def positive(bound: float) -> st.SearchStrategy[float]:
    """Finite floats > 0 up to ``bound`` (one of spotd.core.limits), the bound included."""
    return st.floats(min_value=1e-6, max_value=bound) | st.just(bound)


durations = (
    st.just("auto")
    | st.integers(1, int(limits.MAX_DURATION.total_seconds()))
    | st.tuples(st.integers(0, 8783), st.integers(0, 59), st.integers(0, 59))
    .filter(any)
    .map(lambda hms: "".join(f"{n}{u}" for n, u in zip(hms, "hms", strict=True) if n))
)
emails = st.from_regex(r"[a-z0-9._+-]{1,10}@[a-z0-9-]{1,10}\.[a-z]{2,6}", fullmatch=True)
paths = st.from_regex(r"[A-Za-z0-9_.-]{1,10}(/[A-Za-z0-9_.-]{1,10}){0,2}", fullmatch=True)


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


@st.composite
def valid_docs(draw: st.DrawFn) -> dict[str, Any]:
    def put(table: dict[str, Any], key: str, strategy: st.SearchStrategy[Any]) -> None:
        value = draw(optional(strategy))
        if value is not None:
            table[key] = value

    doc: dict[str, Any] = {
        "name": draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", fullmatch=True)),
        "command": draw(
            no_nul_text.filter(lambda s: s.strip() != "")
            | st.lists(no_nul_text, min_size=1, max_size=4).filter(lambda a: a[0].strip() != "")
        ),
    }
    put(doc, "workdir", paths | st.just("."))
    put(doc, "env", st.dictionaries(env_names, no_nul_text, max_size=3))
    resources = {
        "gpus": draw(st.lists(st.sampled_from(["H100", "h100", "A100", "L40S"]), min_size=1)),
        "gpus_per_node": draw(st.integers(1, 16)),
    }
    put(resources, "nodes", st.integers(1, limits.MAX_NODES))
    put(resources, "model_size_b", positive(limits.MAX_MODEL_SIZE_B))
    put(resources, "min_gbps_per_gpu", positive(limits.MAX_GBPS_PER_GPU))
    doc["resources"] = resources
    market: dict[str, Any] = {}
    put(market, "type", st.sampled_from(["spot", "on-demand", "auto"]))
    put(market, "providers", st.lists(st.sampled_from(["*", "aws", "sim-*", "GCP"]), min_size=1))
    put(market, "regions", st.lists(st.sampled_from(["*", "us-east-*", "eu?"]), min_size=1))
    put(market, "max_price_per_gpu_hour", positive(limits.MAX_PRICE_PER_GPU_HOUR))
    checkpoint: dict[str, Any] = {}
    put(checkpoint, "uri", paths | st.sampled_from(["s3://b/k", "file:///x", "memory://m"]))
    put(checkpoint, "interval", durations)
    put(checkpoint, "size_gb", positive(limits.MAX_CHECKPOINT_GB))
    put(checkpoint, "on_notice", st.booleans())
    deadline: dict[str, Any] = {}
    put(deadline, "compute_hours", positive(limits.MAX_COMPUTE_HOURS))
    put(deadline, "finish_by", aware)
    notify: dict[str, Any] = {}
    put(notify, "email", st.lists(emails, max_size=3))
    put(notify, "on_end", st.booleans())
    for name, table in [("market", market), ("checkpoint", checkpoint), ("notify", notify)]:
        empty_too: bool = draw(st.booleans())
        if table or empty_too:
            doc[name] = table
    if draw(st.booleans()):
        doc["deadline"] = deadline
    if draw(st.booleans()):
        doc["budget"] = {"max_usd": draw(positive(limits.MAX_BUDGET_USD))}
    return doc


@given(valid_docs())
@settings(max_examples=200, deadline=None)
def test_valid_specs_round_trip_through_json(doc: dict[str, Any]) -> None:
    spec = parse(toml_document(doc))
    text = spec_to_json(spec)
    back = spec_from_json(text)
    assert back == spec
    assert hash(back) == hash(spec)
    assert spec_to_json(back) == text
    assert isinstance(back.checkpoint.interval, str | timedelta)
    if spec.deadline is not None and spec.deadline.finish_by is not None:
        assert back.deadline is not None
        assert back.deadline.finish_by == spec.deadline.finish_by
