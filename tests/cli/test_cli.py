"""The CLI's own output: messages keep their text whatever brackets it holds."""

from __future__ import annotations

import json
import os
import webbrowser
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotd.cli.app import app
from spotd.cli.commands.options import again

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_spec_error_keeps_the_table_name_in_brackets(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "x"\ncommand = ["true"]\n\n[resources]\ngpus = ["A100"]\n')
    result = CliRunner().invoke(app, ["submit", str(job), "--config", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert "resources.gpus_per_node: field required (table [resources] at line 4)" in (
        result.stderr
    )


def test_help_keeps_the_config_table_in_brackets() -> None:
    result = CliRunner().invoke(app, ["report", "--help"], terminal_width=120)
    assert result.exit_code == 0
    assert "[email] to" in result.stdout


def test_the_next_command_carries_the_config_it_was_given() -> None:
    assert again("status", "j-1", None) == "spotd status j-1"
    assert again("status", "j-1", Path("/etc/my spotd.toml")) == (
        "spotd status j-1 --config '/etc/my spotd.toml'"
    )


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "spotd.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "state"}"\n'
        "[providers.sim]\nspeed = 60\nepoch = 2031-01-01T00:00:00Z\n"
    )
    return config


def test_report_windows_end_on_the_simulated_clock(tmp_path: Path) -> None:
    config = _config(tmp_path)
    # The market's clock starts with the first command that builds it, as the daemon's does.
    assert CliRunner().invoke(app, ["plan", str(EXAMPLES / "job.toml"), "-c", str(config)],
                              terminal_width=120).exit_code == 0  # fmt: skip
    result = CliRunner().invoke(app, ["report", "--format", "json", "--since", "1d",
                                      "-c", str(config)])  # fmt: skip
    assert result.exit_code == 0, result.output
    until = datetime.fromisoformat(json.loads(result.stdout)["period"]["until"])
    assert datetime(2031, 1, 1, tzinfo=UTC) <= until < datetime(2031, 1, 2, tzinfo=UTC)


def test_the_default_report_window_is_a_week_of_real_time(tmp_path: Path) -> None:
    """On a simulated market 60 times faster, the last week of its clock is under three
    real hours: the default window reaches back a real week, 420 of its days."""
    config = _config(tmp_path)
    assert CliRunner().invoke(app, ["plan", str(EXAMPLES / "job.toml"), "-c", str(config)],
                              terminal_width=120).exit_code == 0  # fmt: skip
    result = CliRunner().invoke(app, ["report", "--format", "json", "-c", str(config)])
    assert result.exit_code == 0, result.output
    period = json.loads(result.stdout)["period"]
    since, until = (datetime.fromisoformat(period[k]) for k in ("since", "until"))
    assert until - since == timedelta(days=7 * 60)
    assert datetime(2031, 1, 1, tzinfo=UTC) <= until < datetime(2031, 1, 2, tzinfo=UTC)


def test_plan_shows_the_usable_offerings_and_counts_the_rest_by_kind(tmp_path: Path) -> None:
    config = _config(tmp_path)
    args = ["plan", str(EXAMPLES / "job.toml"), "-c", str(config), "--top", "3"]
    result = CliRunner().invoke(app, args, terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("OFFERING"))
    # Each figure's name, and its unit on the line below.
    assert lines[head - 1].split() == ["FABRIC", "PRICE", "SPEED", "LOSS", "EXPECTED"]
    assert lines[head].split() == ["OFFERING", "Gbps/GPU", "MARKET", "USD/h", "×", "h", "USD"]
    rows = lines[head + 1 : head + 4]
    assert all(row.startswith("sim-") and len(row) <= 80 for row in rows), "3 rows in 80 columns"
    summary = next(i for i, line in enumerate(lines) if "candidates excluded" in line)
    # A line per kind (a long detail may wrap onto the next line).
    counted = [line for line in lines[summary + 1 :] if line.split()[0].isdigit()]
    # The commonest kind first, with what its offerings have in common; one line per kind.
    assert counted[0].split()[1] == "gpus-per-node"
    assert "8 GPUs per node; the job needs 1" in counted[0]
    kinds = [line.split()[1] for line in counted]
    assert len(kinds) == len(set(kinds)) and "gpu-model" in kinds
    every = CliRunner().invoke(app, [*args, "--excluded"], terminal_width=200)
    assert "EXCLUDED BECAUSE" in every.stdout and " KIND " in every.stdout
    rows = [line.split() for line in every.stdout.splitlines() if line.lstrip().startswith("sim-")]
    for line in counted:
        n, kind = line.split()[:2]
        assert sum(row[3] == kind for row in rows) == int(n)


def test_plan_counts_budget_exclusions_as_one_kind_with_the_cheapest(tmp_path: Path) -> None:
    job = tmp_path / "tight.toml"
    job.write_text((EXAMPLES / "job.toml").read_text().replace("max_usd = 5.0", "max_usd = 0.01"))
    view = json.loads(_plan(tmp_path, job, "--json"))
    assert view["choice"] is None
    over = [c for c in view["candidates"] if c["excluded_kind"] == "over-budget"]
    assert len({c["excluded"] for c in over}) > 1, "each exclusion carries its own figures"
    cheapest = min(c["expected_cost_usd"] for c in over)
    (group,) = [g for g in view["exclusions"] if g["kind"] == "over-budget"]
    assert group == {
        "kind": "over-budget", "count": len(over),
        "summary": f"over the 0.01 USD budget (cheapest {cheapest:,.2f} USD)",
    }  # fmt: skip
    assert sum(g["count"] for g in view["exclusions"]) == len(
        [c for c in view["candidates"] if c["excluded"] is not None]
    )
    lines = _plan(tmp_path, job).splitlines()
    (line,) = [x for x in lines if "over-budget" in x]
    assert line.split()[:2] == [str(len(over)), "over-budget"]
    assert line.endswith(f"over the 0.01 USD budget (cheapest {cheapest:,.2f} USD)")
    assert not any("more)" in x for x in lines), "no '(+N more)' of distinct messages"


def _plan(tmp_path: Path, job: Path, *extra: str) -> str:
    args = ["plan", str(job), "-c", str(_config(tmp_path)), *extra]
    result = CliRunner().invoke(app, args, terminal_width=120)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_plan_shows_the_fabric_environment_of_its_choice_after_the_table(tmp_path: Path) -> None:
    lines = _plan(tmp_path, EXAMPLES / "multinode-70b.toml", "--top", "3").splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith("OFFERING"))
    block = next(i for i, line in enumerate(lines) if line.startswith("environment for "))
    summary = next(i for i, line in enumerate(lines) if "candidates excluded" in line)
    assert table + 3 < block < summary, "after the table, before the exclusions"
    # The example's 4 nodes of H100/H200 on AWS or Azure: EFA or InfiniBand.
    fabric = lines[block].split()[2]
    assert fabric in {"efa", "infiniband"}
    variables = lines[block + 1 : summary - 1]
    assert variables and all(v.startswith("  ") and "=" in v for v in variables)
    assert ("  FI_PROVIDER=efa" if fabric == "efa" else "  NCCL_IB_TIMEOUT=22") in variables
    # The example holds its gangs to the figure the team measured, over the fabric's floor.
    assert lines[summary - 1] == (
        "preflight: all-reduce bus bandwidth must exceed 40 GB/s "
        "(the job's [preflight] min_busbw_gbps)"
    )


def test_plan_json_carries_the_environment_and_the_preflight_floor(tmp_path: Path) -> None:
    from spotd.core.fabric_env import default_min_busbw_gbps, fabric_environment
    from spotd.core.network import Fabric, Interconnect
    from spotd.core.spec_io import load_job_file

    job = EXAMPLES / "multinode-70b.toml"
    view = json.loads(_plan(tmp_path, job, "--json"))
    choice = view["choice"]
    link = Interconnect(Fabric(choice["interconnect"]["fabric"]),
                        choice["interconnect"]["gbps_per_gpu"])  # fmt: skip
    spec = load_job_file(job)
    assert view["environment"] == fabric_environment(
        link, spec.fabric_env, nodes=4, instance_type=choice["instance_type"]
    )
    assert view["environment"]
    assert view["preflight_min_busbw_gbps"] == spec.preflight.min_busbw_gbps == 40
    assert view["preflight_threshold_source"] == "spec"
    # Without the job's own figure, the fabric's floor.
    unset = tmp_path / "no-floor.toml"
    unset.write_text(job.read_text().replace("min_busbw_gbps = 40.0", ""))
    view = json.loads(_plan(tmp_path, unset, "--json"))
    assert view["preflight_min_busbw_gbps"] == default_min_busbw_gbps(link)
    assert view["preflight_threshold_source"] == "fabric"


def test_plan_applies_the_jobs_fabric_overrides_and_threshold(tmp_path: Path) -> None:
    job = tmp_path / "ib.toml"
    job.write_text(
        'name = "ib"\ncommand = ["true"]\n'
        '[resources]\ngpus = ["H100"]\ngpus_per_node = 8\nnodes = 2\nmin_gbps_per_gpu = 400\n'
        '[market]\nproviders = ["sim-azure"]\n'
        '[fabric_env.infiniband]\nNCCL_DEBUG = "WARN"\nNCCL_SOCKET_IFNAME = ""\n'
        "[preflight]\nmin_busbw_gbps = 300.0\n"
    )
    view = json.loads(_plan(tmp_path, job, "--json"))
    assert view["choice"]["interconnect"]["fabric"] == "infiniband"
    env = view["environment"]
    assert env["NCCL_DEBUG"] == "WARN" and env["NCCL_IB_RETRY_CNT"] == "7"
    assert "NCCL_SOCKET_IFNAME" not in env
    assert (view["preflight_min_busbw_gbps"], view["preflight_threshold_source"]) == (300.0, "spec")
    text = _plan(tmp_path, job)
    assert "  NCCL_DEBUG=WARN\n" in text and "NCCL_SOCKET_IFNAME" not in text
    assert "must exceed 300 GB/s (the job's [preflight] min_busbw_gbps)" in text


def test_plan_of_one_node_shows_no_fabric_environment(tmp_path: Path) -> None:
    view = json.loads(_plan(tmp_path, EXAMPLES / "job.toml", "--json"))
    assert view["choice"] is not None
    assert view["environment"] == {}
    assert view["preflight_min_busbw_gbps"] is None
    text = _plan(tmp_path, EXAMPLES / "job.toml")
    assert ": none, one node: nothing crosses the fabric" in text
    assert "preflight: no bus bandwidth floor (one node)" in text


def test_plan_of_a_submitted_job_shows_its_pool_cooling_down(tmp_path: Path) -> None:
    from spotd.core.spec_io import load_job_file
    from spotd.core.states import JobStatus, Transition, transition
    from spotd.core.values import AttemptClose, AttemptEnd, Market, NewAttempt, Pool
    from spotd.daemon.config import load_settings
    from spotd.daemon.process import Daemon

    config = tmp_path / "spotd.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "state"}"\n'
        "[daemon]\nport = 0\ntick_seconds = 0.1\n"
        # 1000 h of the simulated clock (60x) outlast the test; no capacity drops meanwhile.
        "[scheduling]\ncooldown_hours = 1000\n"
        "[providers.sim]\nspeed = 60\nmean_up_hours = 1e9\nepoch = 2031-01-01T00:00:00Z\n"
    )
    job_file = EXAMPLES / "job.toml"
    # As a new job (its file), it would go to the cheapest spot pool.
    fresh = json.loads(_plan_of(str(job_file), config))
    chosen = fresh["choice"]
    assert chosen["market"] == "spot"
    pool = Pool(chosen["provider"], chosen["region"], chosen["zone"], chosen["instance_type"])
    daemon = Daemon(load_settings(config))
    engine = daemon.engine
    # Submitted, it ran there and was preempted: the attempt ends as the engine ends one.
    job = engine.store.create_job(load_job_file(job_file), now=engine.clock.now())
    placed = NewAttempt(pool, Market.SPOT, 1, chosen["price_per_hour"], resume_from=None)
    transition(engine.store, Transition(job.id, JobStatus.PENDING, JobStatus.PROVISIONING,
                                        "placed", open_attempt=placed), now=engine.clock.now())
    (attempt,) = engine.store.attempts(job.id)
    transition(engine.store, Transition(
        job.id, JobStatus.PROVISIONING, JobStatus.RECOVERING, "preempted",
        close_attempt=AttemptClose(attempt.id, AttemptEnd.PREEMPTED),
    ), now=engine.clock.now())  # fmt: skip
    daemon.start()
    try:
        view = json.loads(_plan_of(job.id, config))
        spot = {
            c["zone"]: c for c in view["candidates"]
            if c["market"] == "spot" and c["instance_type"] == pool.instance_type
            and c["region"] == pool.region
        }  # fmt: skip
        assert spot[pool.zone]["excluded_kind"] == "cooling-down"
        assert spot[pool.zone]["excluded"].startswith(
            f"pool cooling down: preempted in {pool.zone} (1x in {pool.region}), until "
        )
        # The whole region cools for that type, and the plan goes elsewhere.
        assert all(c["excluded_kind"] == "cooling-down" for c in spot.values())
        assert view["choice"] is not None and view["choice"]["region"] != pool.region
        # The table groups the exclusions by kind: the cooldown is one of them.
        text = CliRunner().invoke(app, ["plan", job.name, "-c", str(config)],
                                  terminal_width=200)  # fmt: skip
        assert text.exit_code == 0, text.output
        (line,) = [x for x in text.stdout.splitlines() if "cooling-down" in x]
        assert f"{len(spot)} pools cooling down until " in line and "after preempted" in line
        assert int(line.split()[0]) == len(spot)
        # The file still plans as a new job: no cooldown there.
        again = json.loads(_plan_of(str(job_file), config))
        assert not any(c["excluded_kind"] == "cooling-down" for c in again["candidates"])
    finally:
        daemon.stop()


def _plan_of(job: str, config: Path) -> str:
    result = CliRunner().invoke(app, ["plan", job, "-c", str(config), "--json"])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_dash_h_is_help_and_version_is_an_option_too() -> None:
    from spotd import __version__

    assert CliRunner().invoke(app, ["--version"]).stdout.strip() == __version__
    for args in (["-h"], ["status", "-h"]):
        result = CliRunner().invoke(app, args, terminal_width=120)
        assert result.exit_code == 0 and "Usage:" in result.stdout, result.stdout


def test_report_takes_json_as_every_other_command_does(tmp_path: Path) -> None:
    config = _config(tmp_path)
    args = ["report", "--since", "1d", "-c", str(config)]
    as_json = CliRunner().invoke(app, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert {"period", "jobs"} <= set(json.loads(as_json.stdout))
    both = CliRunner().invoke(app, [*args, "--json", "--format", "csv"])
    assert both.exit_code == 2 and "choose one" in both.output
    shown = CliRunner().invoke(app, ["report", "-h"], terminal_width=200).stdout
    assert "Email it to the addresses of [email] to." in " ".join(shown.split())


def test_a_default_workdir_too_large_to_ship_says_it_was_the_job_files_folder(
    tmp_path: Path,
) -> None:
    """No workdir: the job file's folder is shipped; when that fails, the message says
    where the folder came from and what to write instead, before any daemon is asked."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dataset.bin").write_bytes(b"\0" * (2 * 2**20))
    job = home / "job.toml"
    job.write_text('name = "x"\ncommand = ["python3", "train.py"]\n'
                   '[resources]\ngpus = ["A100"]\ngpus_per_node = 1\n')  # fmt: skip
    config = tmp_path / "spotd.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n[storage]\nmax_workdir_mb = 1\n')
    result = CliRunner().invoke(app, ["submit", str(job), "--config", str(config)])
    assert result.exit_code == 1
    said = " ".join(result.stderr.split())  # as one line, however the console wrapped it
    assert f"workdir {home} holds 2.0 MiB, over the 1.0 MiB limit" in said
    assert said.endswith(
        "(the job file's folder, as the spec gives no workdir: set workdir to the folder "
        "of the job's code)"
    ), said


def test_dashboard_prints_the_running_daemons_address_and_opens_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "spotd.toml"
    config.write_text(f'data_dir = "{tmp_path}"\n')
    (tmp_path / "daemon.json").write_text(
        json.dumps({"host": "127.0.0.1", "port": 48123, "pid": os.getpid()})
    )
    shown = CliRunner().invoke(app, ["dashboard", "-c", str(config)])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == "http://127.0.0.1:48123/dashboard/\n"
    assert f"log in with the API token in {tmp_path / 'token'}" in shown.stderr
    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url) or True)
    assert CliRunner().invoke(app, ["dashboard", "--open", "-c", str(config)]).exit_code == 0
    assert opened == ["http://127.0.0.1:48123/dashboard/"]
    monkeypatch.setattr(webbrowser, "open", lambda url: False)
    none = CliRunner().invoke(app, ["dashboard", "--open", "-c", str(config)])
    assert none.exit_code == 1 and "no web browser could be opened" in none.stderr
