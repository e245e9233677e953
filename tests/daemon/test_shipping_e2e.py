"""Setup steps and secrets through a real daemon, its agents and the simulated market."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from daemon_support import Daemon, Setup, make_setup, wait_for

from spotd.core.states import FailureCause, JobStatus
from spotd.core.values import AttemptEnd
from spotd.daemon.bootstrap import render_bootstrap
from spotd.daemon.config import load_settings
from spotd.daemon.wiring import build_engine
from spotd.engine.launching import job_environment
from spotd.engine.settings import TAG_ATTEMPT, TAG_JOB
from spotd.store import open_store

SECRET = "sk-test-9f1c2e7b44d0"  # made up; must show in the job's environment only


def _daemon_setup(tmp_path: Path) -> Setup:
    setup = make_setup(tmp_path, seed=5, up=500.0, boot=30)  # a calm market
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(f'API_KEY = "{SECRET}"\n')
    secrets.chmod(0o600)
    with setup.config.open("a") as config:
        config.write(f'\n[secrets]\nfile = "{secrets}"\n')
    return setup


def _job(setup: Setup, name: str, body: str) -> Path:
    path = setup.root / f"{name}.toml"
    path.write_text(f'name = "{name}"\n{body}\n[resources]\ngpus = ["A100"]\ngpus_per_node = 1\n')
    return path


def test_a_failed_setup_is_retried_within_bounds_and_shows_its_output(tmp_path: Path) -> None:
    setup = _daemon_setup(tmp_path)
    job_file = _job(setup, "setup-fails", 'command = ["true"]\n'
                    'setup = ["echo staging the data set", "echo no space left >&2; exit 3"]\n'
                    "[retry]\nsetup_failures = 1\n")  # fmt: skip
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    daemon = Daemon(setup)
    try:
        job_id = json.loads(setup.cli("submit", str(job_file), "--json").stdout)["id"]
        job = wait_for(store, job_id, lambda j, _: j.status.terminal, timeout=120)
        assert job.status is JobStatus.FAILED and job.failure is FailureCause.SETUP_FAILED
        attempts = store.attempts(job_id)
        assert [a.end_reason for a in attempts] == [AttemptEnd.SETUP_FAILED] * 2
        details = [e.detail for e in store.events(job_id) if e.cause == "setup-failed"]
        assert len(details) == 2
        assert "exited with 3" in details[0] and "no space left" in details[0]
        assert "placed again: 0 more setup failure(s) allowed" in details[0]
        logs = setup.cli("logs", job_id).stdout
        assert "staging the data set" in logs and "no space left" in logs
    finally:
        assert daemon.stop() == 0
        store.close()


def test_a_named_secret_reaches_the_job_and_nothing_else(tmp_path: Path) -> None:
    setup = _daemon_setup(tmp_path)
    out = tmp_path / "job-env.json"
    script = f"import json, os; open({str(out)!r}, 'w').write(json.dumps(dict(os.environ)))"
    command = json.dumps([sys.executable, "-c", script])
    job_file = _job(setup, "uses-secret", f'command = {command}\nsecrets = ["API_KEY"]\n')
    lacking = _job(setup, "lacks-secret", 'command = ["true"]\nsecrets = ["NOT_HELD"]\n')
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    daemon = Daemon(setup)
    try:
        refused = setup.cli("submit", str(lacking), check=False)
        assert refused.returncode != 0 and "holds no value for NOT_HELD" in refused.stderr
        job_id = json.loads(setup.cli("submit", str(job_file), "--json").stdout)["id"]
        job = wait_for(store, job_id, lambda j, _: j.status.terminal, timeout=120)
        assert job.status is JobStatus.SUCCEEDED, [e.detail for e in store.events(job_id)]
        status = setup.cli("status", job_id, "--json").stdout
        events = setup.cli("events", job_id, "--json").stdout
        logs = setup.cli("logs", job_id).stdout
    finally:
        assert daemon.stop() == 0
        store.close()
    assert json.loads(out.read_text())["API_KEY"] == SECRET, "the job's environment has it"
    for shown in (status, events, logs, (setup.root / "daemon.log").read_text()):
        assert SECRET not in shown
    for path in setup.root.rglob("*"):  # the database, the simulator's node files, ...
        if path.is_file() and path.name != "secrets.toml" and path != out:
            assert SECRET.encode() not in path.read_bytes(), path
    _assert_no_boot_script_holds(setup, job_id)


def _assert_no_boot_script_holds(setup: Setup, job_id: str) -> None:
    """The boot scripts the clouds' nodes would get name the secret, never its value."""
    from dataclasses import replace

    from spotd.core.values import LaunchRequest

    engine = build_engine(load_settings(setup.config))
    try:
        job = engine.store.get_job(job_id)
        attempt = engine.store.attempts(job_id)[0]
        offering = next(o for o in engine.market.offerings() if o.pool == attempt.pool)
        env = job_environment(job, attempt, offering, checkpoint_uri="s3://b/run",
                              interval_hours=1.0)  # fmt: skip
        request = LaunchRequest(offering=offering, market=attempt.market, nodes=1,
                                client_token=attempt.client_token, command=job.spec.command,
                                tags={TAG_JOB: job_id, TAG_ATTEMPT: "1"}, env=env)  # fmt: skip
        for kind in ("aws", "gcp", "azure"):
            script = render_bootstrap(kind, replace(request), daemon_url="https://d:8470",
                                      agent_token="t" * 64)  # fmt: skip
            assert "SPOTD_SECRETS=API_KEY" in script and SECRET not in script
    finally:
        engine.store.close()


def test_spotd_submit_ships_the_workdir_once(tmp_path: Path) -> None:
    setup = make_setup(tmp_path, seed=5, up=500.0, boot=30)
    project = tmp_path / "laptop" / "project"
    project.mkdir(parents=True)
    (project / "train.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['OUT']).write_text(pathlib.Path('data.txt').read_text())\n"
    )
    (project / "data.txt").write_text("shipped\n")
    out = tmp_path / "out.txt"
    command = json.dumps([sys.executable, "train.py"])
    job_file = project / "job.toml"
    job_file.write_text(f'name = "shipped"\ncommand = {command}\nworkdir = "."\n'
                        f'[env]\nOUT = "{out}"\n'
                        '[resources]\ngpus = ["A100"]\ngpus_per_node = 1\n')  # fmt: skip
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    daemon = Daemon(setup)
    try:
        first = setup.cli("submit", str(job_file))
        assert "workdir: 3 files" in first.stderr and "uploaded as" in first.stderr
        job_id = first.stdout.split()[1]
        job = wait_for(store, job_id, lambda j, _: j.status.terminal, timeout=120)
        assert job.status is JobStatus.SUCCEEDED
        assert out.read_text() == "shipped\n"
        again = setup.cli("submit", str(job_file))
        assert "already stored" in again.stderr
    finally:
        assert daemon.stop() == 0
        store.close()
    stored = list((setup.root / "code").iterdir())
    assert len(stored) == 1 and stored[0].name.endswith(".tar.gz")


def test_a_job_without_workdir_runs_in_a_copy_of_its_job_files_folder(tmp_path: Path) -> None:
    """No ``workdir``: ``spotd submit`` ships the job file's folder, as ``workdir = "."``
    would, so a relative script runs (docs/job-spec.md), without the daemon's data_dir
    or the job's own checkpoint folder when those are inside it."""
    project = tmp_path / "project"
    setup = make_setup(_folder(project / ".spotd"), seed=5, up=500.0, boot=30)
    (project / "train.py").write_text(
        "import os, pathlib\n"
        "pathlib.Path(os.environ['OUT']).write_text(pathlib.Path('data.txt').read_text())\n"
    )
    (project / "data.txt").write_text("found beside the job file\n")
    _folder(project / "ckpt" / "step-00000001").joinpath("weights.npy").write_bytes(b"0" * 64)
    out = tmp_path / "out.txt"
    command = json.dumps([sys.executable, "train.py"])
    job_file = project / "job.toml"
    job_file.write_text(f'name = "no-workdir"\ncommand = {command}\n[env]\nOUT = "{out}"\n'
                        '[resources]\ngpus = ["A100"]\ngpus_per_node = 1\n'
                        '[checkpoint]\nuri = "ckpt"\n')  # fmt: skip
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    daemon = Daemon(setup)
    try:
        submitted = setup.cli("submit", str(job_file))
        # train.py, data.txt and job.toml: not .spotd/ (the daemon's), not ckpt/ (the job's)
        assert "workdir: 3 files" in submitted.stderr, submitted.stderr
        said = " ".join(submitted.stderr.split())  # the line wraps at the pipe's width
        assert "the job file's folder, as the spec gives no workdir" in said, said
        job_id = submitted.stdout.split()[1]
        job = wait_for(store, job_id, lambda j, _: j.status.terminal, timeout=120)
        assert job.status is JobStatus.SUCCEEDED, [e.detail for e in store.events(job_id)]
        assert job.spec.workdir == str(project) and job.spec.code is not None
    finally:
        assert daemon.stop() == 0
        store.close()
    assert out.read_text() == "found beside the job file\n"


def _folder(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
