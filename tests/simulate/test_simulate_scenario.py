"""Scenario files, trace loading and resampling, and the ``simulate`` command's errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from spotd.core.errors import SpotdError
from spotd.simulate.cli import simulate
from spotd.simulate.scenario import ScenarioError, load_scenario, scenario_from_traces
from spotd.simulate.timeline import TRACES_ENV, TraceMissingError, build_timeline, resample
from spotd.simulate.world import prepare
from spotd_sim.trace import TraceError

app = typer.Typer()
app.command()(simulate)


def write_trace(path: Path, data: list[int], gap: float = 3600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


def scenario_text(extra_job: str = "", extra_top: str = "", trace: str = "t/a.json") -> str:
    return f"""
name = "tiny"
{extra_top}
[[offerings]]
trace = "{trace}"
provider = "aws"
region = "us-east-1"
zone = "us-east-1a"
instance_type = "p3.2xlarge"

[[jobs]]
name = "j"
compute_hours = 3
deadline_fraction = 0.5
changeover_hours = 1
starts = 4
{extra_job}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    write_trace(tmp_path / "t" / "a.json", [1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1] * 2)
    path = tmp_path / "s.toml"
    path.write_text(scenario_text())
    return path


def test_scenario_loads_with_defaults(tiny: Path) -> None:
    s = load_scenario(tiny)
    job = s.jobs[0]
    assert (s.cost_model, job.window_hours, job.nodes, job.seed) == ("reference", 6.0, 1, 0)
    assert s.on_demand_ratio == pytest.approx(3.06 / 0.918)
    assert s.offerings[0].label == "us-east-1a"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (scenario_text(extra_job="colour = 1"), "jobs[0].colour: unknown field"),
        (scenario_text(extra_job="deadline_hours = 9"), "exactly one of deadline_hours"),
        (scenario_text(extra_job="nodes = 0"), "jobs[0].nodes"),
        (scenario_text(extra_job='checkpoint_on_notice = "yes"'), "jobs[0].checkpoint_on_notice"),
        (scenario_text(extra_top='cost_model = "cheap"'), "cost_model"),
        (scenario_text(extra_top='cost_model = "full"'), "needs spot_price and on_demand_price"),
        (scenario_text(extra_top='home = "nowhere"'), "home: 'nowhere' is none of"),
        ("name = [", "not valid TOML"),
    ],
)
def test_scenario_errors_name_file_and_field(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert str(path) in str(caught.value)
    assert expected in str(caught.value)


def test_missing_scenario_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read the file"):
        load_scenario(tmp_path / "nope.toml")


def test_resample_keeps_a_tick_only_if_every_probe_in_it_was_up() -> None:
    # 195 s probes into 360 s ticks: tick j holds the probes taken in [360 j, 360 j + 360).
    values = np.array([1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1], dtype=np.int64)
    out = resample(values, 195, 360)
    # probes at 0,195 | 390,585 | 780,975 | 1170,1365 | 1560,1755 | 1950 (cut: 5 whole ticks)
    assert out.tolist() == [1, 0, 1, 0, 1]
    assert resample(values, 195, 195).tolist() == values.tolist()
    with pytest.raises(ValueError, match="finer"):
        resample(values, 195, 60)


def test_resample_takes_the_minimum_node_count() -> None:
    out = resample(np.array([4, 3, 4, 4, 2, 4], dtype=np.int64), 300, 600)
    assert out.tolist() == [3, 4, 2]


def test_timeline_resolves_relative_to_traces_root_and_env(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = load_scenario(tiny)
    assert build_timeline(tiny, s, None).ticks == 32
    other = tmp_path / "elsewhere"
    write_trace(other / "t" / "a.json", [1] * 10)
    assert build_timeline(tiny, s, other).ticks == 10
    monkeypatch.setenv(TRACES_ENV, str(other))
    assert build_timeline(tiny, s, None).ticks == 10


def test_missing_trace_says_where_and_how_to_get_them(tiny: Path, tmp_path: Path) -> None:
    s = load_scenario(tiny)
    with pytest.raises(TraceMissingError) as caught:
        build_timeline(tiny, s, tmp_path / "empty")
    text = str(caught.value)
    assert str(tmp_path / "empty" / "t" / "a.json") in text
    assert "skypilot-org/spot-traces" in text and "NSDI 2024" in text


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", "is not valid JSON"),
        ('{"metadata": {}, "data": [1]}', "missing 'metadata.gap_seconds'"),
        ('{"metadata": {"gap_seconds": 60}, "data": [1, -2]}', "'data[1]' must not be negative"),
        ('{"metadata": {"gap_seconds": 60}, "data": [1, "x"]}', "'data[1]' must be an integer"),
        ('{"metadata": {"gap_seconds": 60}, "data": []}', "'data' is empty"),
    ],
)
def test_malformed_trace_gives_a_clear_error(
    tiny: Path, content: str, expected: str
) -> None:
    (tiny.parent / "t" / "a.json").write_text(content)
    with pytest.raises(TraceError) as caught:
        build_timeline(tiny, load_scenario(tiny), None)
    assert "a.json" in str(caught.value) and expected in str(caught.value)


def test_traces_with_different_ticks_do_not_share_a_timeline(tmp_path: Path) -> None:
    write_trace(tmp_path / "t" / "a.json", [1] * 10, gap=60)
    write_trace(tmp_path / "t" / "b.json", [1] * 10, gap=120)
    text = scenario_text() + """
[[offerings]]
trace = "t/b.json"
provider = "aws"
region = "us-east-1"
zone = "us-east-1b"
instance_type = "p3.2xlarge"
"""
    path = tmp_path / "two.toml"
    path.write_text(text)
    with pytest.raises(TraceError, match="must share a timeline"):
        build_timeline(path, load_scenario(path), None)


def test_prepare_rounds_to_ticks_and_draws_seeded_starts(tiny: Path) -> None:
    s = load_scenario(tiny)
    tl = build_timeline(tiny, s, None)
    p = prepare(s, tl, s.jobs[0], str(tiny))
    w = p.world
    assert (w.need, w.window, w.changeover, w.spot_cost[0]) == (3, 6, 1, 1.0)
    assert w.od_cost[0] == pytest.approx(3.06 / 0.918)
    assert len(p.starts) == 4 and all(0 <= x <= 32 - 6 for x in p.starts)
    again = prepare(s, tl, s.jobs[0], str(tiny))
    assert again.starts == p.starts
    assert prepare(s, tl, s.jobs[0], str(tiny), starts=7, seed=5).starts != p.starts


FULL_OFFERINGS = """
name = "notice"
cost_model = "full"

[[offerings]]
trace = "t/a.json"
provider = "aws"
region = "us-east-1"
zone = "us-east-1a"
instance_type = "p5.48xlarge"
spot_price = 25.0
on_demand_price = 63.0

[[offerings]]
trace = "t/a.json"
provider = "gcp"
region = "us-central1"
zone = "us-central1-a"
instance_type = "a3-megagpu-8g"
spot_price = 20.0
on_demand_price = 58.0
{notice}
[[jobs]]
name = "j"
compute_hours = 3
deadline_fraction = 0.5
checkpoint_gb = {size}
{job}
"""


@pytest.mark.parametrize(
    ("size", "notice", "job", "saves"),
    [
        # 80 GB at 1 GB/s plus 10 s to react fits in AWS's 120 s, not in GCP's 30 s.
        (80, "", "", (True, False)),
        (320, "", "", (False, False)),
        (80, "notice_seconds = 90", "", (True, True)),
        (80, "", "checkpoint_on_notice = false", (False, False)),
    ],
)
def test_full_model_keeps_work_where_the_notice_holds_the_checkpoint(
    tmp_path: Path, size: int, notice: str, job: str, saves: tuple[bool, bool]
) -> None:
    write_trace(tmp_path / "t" / "a.json", [2] * 12)
    path = tmp_path / "s.toml"
    path.write_text(FULL_OFFERINGS.format(size=size, notice=notice, job=job))
    s = load_scenario(path)
    p = prepare(s, build_timeline(path, s, None), s.jobs[0], str(path))
    assert p.world.notice_saves == saves
    # Policies are shown the same notices and the same promise of the job.
    assert [o.notice_seconds for o in p.offerings] == [120, 90 if notice else 30]
    assert p.spec.checkpoint.on_notice is (job == "")


def test_reference_model_has_no_notice(tiny: Path) -> None:
    s = load_scenario(tiny)
    p = prepare(s, build_timeline(tiny, s, None), s.jobs[0], str(tiny))
    assert p.world.notice_saves == (False,)
    assert p.spec.checkpoint.on_notice is False


def test_prepare_refuses_a_deadline_longer_than_the_traces(tmp_path: Path) -> None:
    write_trace(tmp_path / "t" / "a.json", [1] * 4)
    path = tmp_path / "s.toml"
    path.write_text(scenario_text())
    s = load_scenario(path)
    with pytest.raises(ScenarioError, match="shorter than the deadline"):
        prepare(s, build_timeline(path, s, None), s.jobs[0], str(path))


def test_errors_are_spotd_errors() -> None:
    assert issubclass(ScenarioError, SpotdError)
    assert issubclass(TraceMissingError, SpotdError)
    assert issubclass(TraceError, SpotdError)


# --- the command ------------------------------------------------------------------------


def test_cli_prints_a_table(tiny: Path) -> None:
    result = CliRunner().invoke(app, ["--scenario", str(tiny), "--policy", "cheapest"])
    assert result.exit_code == 0, result.output
    for name in ("od-only", "greedy-1z", "up-1z", "policy:cheapest", "omniscient"):
        assert name in result.output


def test_cli_json_and_plots(tiny: Path, tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    result = CliRunner().invoke(
        app, ["--scenario", str(tiny), "--json", "--plot", str(plots), "--starts", "3"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    job = data["jobs"][0]
    assert set(job["policies"]) == {"od-only", "greedy-1z", "up-1z", "omniscient"}
    greedy = job["policies"]["greedy-1z"]
    assert len(greedy["results"]) == 3
    assert {"mean_cost", "p75_cost", "misses", "gap", "goodput"} <= set(greedy["metrics"])
    assert sorted(p.name for p in plots.iterdir()) == ["tiny-j-costs.png", "tiny-j-timeline.png"]


def test_cli_replays_policies_on_hindsight_statistics_too(tiny: Path) -> None:
    result = CliRunner().invoke(app, [
        "--scenario", str(tiny), "--json", "--starts", "3", "--policy", "balanced",
        "--hindsight-stats",
    ])
    assert result.exit_code == 0, result.output
    policies = json.loads(result.stdout)["jobs"][0]["policies"]
    assert {"policy:balanced", "policy:balanced+hindsight"} <= set(policies)
    for name in ("policy:balanced", "policy:balanced+hindsight"):
        assert len(policies[name]["results"]) == 3
        assert policies[name]["metrics"]["misses"] == 0


@pytest.mark.parametrize("args", [["--policy", "no-such-policy"], []])
def test_cli_errors_exit_1_without_traceback(tiny: Path, args: list[str]) -> None:
    if not args:
        (tiny.parent / "t" / "a.json").write_text("[1, 2]")
    result = CliRunner().invoke(app, ["--scenario", str(tiny), *args])
    assert result.exit_code == 1
    assert "error:" in result.output and "Traceback" not in result.output


# --- trace files without a scenario ------------------------------------------------------


def test_cli_replays_trace_files_given_alone(tmp_path: Path) -> None:
    """Any trace of the shared format, named on the command line: one offering per file
    (one market when several), the reference cost model, one job from the flags."""
    up = [2, 0, 2, 2, 1, 0, 2, 2, 2, 2, 0, 2, 2, 2, 2, 2] * 3
    first = write_trace(tmp_path / "set" / "zone-a.json", up)
    second = write_trace(tmp_path / "set" / "zone-b.json", up[3:] + up[:3])
    result = CliRunner().invoke(app, [
        "--trace", str(first), "--trace", str(second), "--compute-hours", "4",
        "--deadline-fraction", "0.5", "--nodes", "2", "--starts", "3", "--json",
    ])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["scenario"], data["file"]) == ("set", None)
    assert data["traces"] == [str(first.resolve()), str(second.resolve())]
    (job,) = data["jobs"]
    assert (job["job"]["name"], job["job"]["nodes"], job["job"]["compute_hours"]) == (
        "c4-f0.5-2node", 2, 4,
    )  # fmt: skip
    assert job["model"]["offerings"] == ["zone-a", "zone-b"]
    assert {"greedy-any", "up-any", "omniscient"} <= set(job["policies"])
    assert len(job["policies"]["greedy-any"]["results"]) == 3
    # A folder stands for its files; one file names the run after itself.
    folder = CliRunner().invoke(app, ["-t", str(tmp_path / "set"), "--starts", "2", "--json",
                                      "--compute-hours", "4"])  # fmt: skip
    assert json.loads(folder.stdout)["traces"] == data["traces"]
    plots = tmp_path / "plots"
    table = CliRunner().invoke(app, ["-t", str(first), "--compute-hours", "4", "--starts", "2",
                                     "--plot", str(plots)])  # fmt: skip
    assert table.exit_code == 0, table.output
    assert "4 h compute, deadline 5 h, 1 node(s)" in table.output
    assert "interconnect" not in table.output, "no warning about the anonymous offering"
    assert sorted(p.name for p in plots.iterdir()) == [
        "zone-a-c4-f0.8-costs.png", "zone-a-c4-f0.8-timeline.png",
    ]


def test_a_scenario_from_traces_names_offerings_after_their_files(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "one" / "z.json", [1, 1])
    b = write_trace(tmp_path / "two" / "z.json", [1, 1])
    c = write_trace(tmp_path / "two" / "y.json", [1, 1])
    made = scenario_from_traces([a, b, c])
    assert [o.label for o in made.offerings] == ["one/z", "two/z", "y"]
    assert made.offerings[0].trace == str(a.resolve())
    (job,) = made.jobs
    assert (job.compute_hours, job.window_hours, job.starts, job.seed) == (48, 60, 100, 0)
    with pytest.raises(ScenarioError, match=r"(?s)--trace.*jobs\[0\]\.compute_hours"):
        scenario_from_traces([a], compute_hours=-1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give either --scenario FILE or one or more --trace FILE"),
        (["--scenario", "{tiny}", "--trace", "{trace}"], "give either --scenario"),
        (["--scenario", "{tiny}", "--nodes", "2"], "--nodes: for --trace only"),
        (["--trace", "{missing}"], "nope.json: no such file or folder"),
        (["--trace", "{empty}"], "a folder with no .json files"),
        (["--trace", "{trace}", "--traces", "{empty}"], "--traces: for --scenario only"),
        (["--trace", "{trace}", "--deadline-fraction", "0.01", "--compute-hours", "1"],
         "shorter than the deadline (100 h)"),
    ],
)
def test_cli_trace_mode_errors(tiny: Path, args: list[str], message: str) -> None:
    (tiny.parent / "empty").mkdir()
    here = tiny.parent
    paths = {"tiny": str(tiny), "trace": str(here / "t" / "a.json"),
             "missing": str(here / "nope.json"), "empty": str(here / "empty")}  # fmt: skip
    result = CliRunner().invoke(app, [a.format(**paths) for a in args])
    assert result.exit_code == 2, result.output  # bad input
    assert message in " ".join(result.output.split()) and "Traceback" not in result.output


def test_a_job_no_trace_can_carry_is_run_and_flagged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    one_node = write_trace(tmp_path / "one.json", [1, 1, 0, 1] * 10)
    result = CliRunner().invoke(app, ["-t", str(one_node), "--nodes", "2", "--compute-hours",
                                      "4", "--starts", "2", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    spot = json.loads(result.stdout)["jobs"][0]["policies"]["greedy-1z"]["metrics"]
    assert spot["spot_share"] == 0.0
    assert "needs 2 node(s) and no trace of its offerings ever shows that many" in caplog.text
