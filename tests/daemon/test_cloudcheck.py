"""``spotd check-cloud`` on the embedded default: the simulated market and its CLI output.

The clouds' own checks (dry runs, permissions, quotas) are tested against
their fakes with each adapter, in tests/providers/.
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from spotd.cli.app import app
from spotd.core.spec_io import load_job_file
from spotd.daemon.cloudcheck import CHECK_JOB_ID, check_clouds, launch_request_for
from spotd.daemon.config import load_settings
from spotd.daemon.wiring import build_providers

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "spotd.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "state"}"\n'
        "[providers.sim]\nspeed = 60\nepoch = 2031-01-01T00:00:00Z\n"
    )
    return config


def test_every_enabled_provider_is_checked(tmp_path: Path) -> None:
    checks = check_clouds(load_settings(_config(tmp_path)))
    assert [c.provider for c in checks] == ["sim-aws", "sim-azure", "sim-gcp"]
    assert all(c.ok and c.outcomes for c in checks)
    assert all(c.would_create == () for c in checks), "no job: nothing to create"


def test_the_checked_request_is_the_one_the_daemon_would_send(tmp_path: Path) -> None:
    settings = load_settings(_config(tmp_path))
    spec = load_job_file(EXAMPLES / "multinode-70b.toml")
    _, providers = build_providers(settings)
    request, problem = launch_request_for(providers["sim-aws"], spec, settings)
    assert problem is None and request is not None
    assert request.offering.pool.provider == "sim-aws"
    assert request.nodes == spec.resources.nodes
    assert request.tags["spotd-job"] == CHECK_JOB_ID
    assert request.tags["spotd-owner"] == settings.daemon.owner
    assert request.env["SPOTD_NUM_NODES"] == str(spec.resources.nodes)
    assert "NCCL_SOCKET_IFNAME" in request.env or "FI_PROVIDER" in request.env
    # As a real launch says it: the egress checks read which store the nodes must reach.
    assert request.env["SPOTD_CHECKPOINT_URI"] == (
        spec.checkpoint.uri or str(settings.checkpoints_dir / CHECK_JOB_ID))


def test_cli_prints_a_line_per_check_and_what_a_launch_would_create(tmp_path: Path) -> None:
    config = _config(tmp_path)
    result = CliRunner().invoke(
        app,
        ["check-cloud", str(EXAMPLES / "job.toml"), "-c", str(config), "--provider", "sim-gcp"],
        terminal_width=120,
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "sim-gcp: ready"
    assert any(line.startswith("  pass launch request: 1 x ") for line in lines)
    assert "  a launch would create (nothing was created):" in lines
    assert not any(line.startswith("sim-aws") for line in lines)


def test_a_job_no_offering_fits_fails_with_a_clear_line(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "x"\ncommand = ["true"]\n\n[resources]\n'
                   'gpus = ["H100"]\ngpus_per_node = 3\n')  # fmt: skip
    result = CliRunner().invoke(app, ["check-cloud", str(job), "-c", str(_config(tmp_path)),
                                      "--json"])  # fmt: skip
    assert result.exit_code == 1
    checks = json.loads(result.stdout)
    assert {c["provider"] for c in checks} == {"sim-aws", "sim-azure", "sim-gcp"}
    for check in checks:
        assert check["ok"] is False
        (failed,) = [o for o in check["checks"] if not o["ok"]]
        assert failed["name"] == "placement"
        assert f"no offering of {check['provider']} fits the job" in failed["detail"]


def test_an_unknown_provider_is_named_with_the_enabled_ones(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["check-cloud", "--provider", "aws",
                                      "-c", str(_config(tmp_path))])  # fmt: skip
    assert result.exit_code == 2  # a bad argument
    assert "no enabled provider matches 'aws' (enabled: sim-aws, sim-azure, sim-gcp)" in (
        result.stderr
    )
