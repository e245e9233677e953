"""The daemon as users run it: a real process, driven by the real CLI.

The recovery tests SIGKILL the daemon at several points of a job's life,
restart it, and check that the job still ends with the right weights, that no
attempt was launched twice, and that no instance is left running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from daemon_support import STEPS, TRAINER, Daemon, Setup, make_setup, wait_for

from spotd.core.states import FailureCause, JobStatus
from spotd.core.values import AttemptEnd, JobRecord
from spotd.daemon.config import load_settings
from spotd.daemon.wiring import build_providers
from spotd.exits import kept_exits
from spotd.store import SqlStore, open_store


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return make_setup(tmp_path, seed=5)


@pytest.fixture
def store(setup: Setup) -> Iterator[SqlStore]:
    s = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    yield s
    s.close()


def uninterrupted_digest() -> str:
    out = subprocess.run(
        [sys.executable, str(TRAINER), "--steps", str(STEPS)],
        capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]},
    ).stdout
    return out.split("digest: ")[1].split()[0]


def submit(setup: Setup) -> str:
    job: dict[str, str] = json.loads(setup.cli("submit", str(setup.job_file), "--json").stdout)
    return job["id"]


def assert_clean_finish(setup: Setup, store: SqlStore, job_id: str) -> None:
    job = store.get_job(job_id)
    assert job.status is JobStatus.SUCCEEDED, store.events(job_id)
    attempts = store.attempts(job_id)
    launches = (setup.root / "sim" / "launches.log").read_text().splitlines()
    tokens = [line.split()[0] for line in launches]
    for attempt in attempts:
        assert tokens.count(attempt.client_token) <= attempt.nodes, "launched twice"
    owned = {i for a in attempts for i in a.instance_ids}
    settings = load_settings(setup.config)
    _, providers = build_providers(settings)
    last = attempts[-1]
    logs = providers[last.pool.provider].logs(last.instance_ids[0])
    assert f"digest: {uninterrupted_digest()}" in logs
    instances = [i for p in providers.values() for i in p.list_instances({})]
    assert {i.id for i in instances} <= owned, "an instance no attempt owns"
    assert all(i.ended for i in instances), [i for i in instances if not i.ended]


KILL_POINTS: dict[str, Callable[[JobRecord, int], bool]] = {
    # Any launch: the first may fail at once (the simulated market runs on wall time)
    # and be followed by a second before the test first looks.
    "during launch": lambda j, n: j.status is JobStatus.PROVISIONING,
    "while running": lambda j, n: j.status is JobStatus.RUNNING,
    "during recovery": lambda j, n: j.status is JobStatus.RECOVERING
    or (j.status is JobStatus.PROVISIONING and n > 1),
}


BOOT_SECONDS = {"during launch": 600.0}
"""Simulated boot per kill point (default 120 s, 0.2 s of wall time at speed 600): killing
during a launch needs a boot long enough (1 s) for the test to see it on a busy machine."""


@pytest.mark.slow
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_sigkill_and_restart_finishes_the_job(setup: Setup, store: SqlStore, point: str) -> None:
    if point in BOOT_SECONDS:
        setup = make_setup(setup.root, seed=5, boot=BOOT_SECONDS[point])
    daemon = Daemon(setup)
    job_id = submit(setup)
    wait_for(store, job_id, KILL_POINTS[point])
    daemon.kill()
    time.sleep(0.5)  # the instances go on without their daemon
    daemon = Daemon(setup)
    wait_for(store, job_id, lambda j, _: j.status.terminal, timeout=90)
    assert daemon.stop() == 0, "SIGTERM should drain and exit cleanly"
    assert_clean_finish(setup, store, job_id)


FINISH_ON_CUE = """
import pathlib, sys, time
go = pathlib.Path(sys.argv[1])
while not go.exists():
    time.sleep(0.05)
print("finished")
sys.exit(int(go.read_text()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("code", [0, 3])
def test_a_job_that_ends_while_the_daemon_is_down_ends_once(tmp_path: Path, code: int) -> None:
    """The job ends while no daemon listens, then the market takes its node back before
    the daemon returns: the job ends as it did, with its own exit code, and is not run
    again as if preempted."""
    setup = make_setup(tmp_path, seed=5, up=500.0)
    script, go = tmp_path / "finish.py", tmp_path / "go"
    script.write_text(FINISH_ON_CUE)
    job_file = tmp_path / "finish.toml"
    job_file.write_text(f'name = "finish"\ncommand = ["{sys.executable}", "{script}", "{go}"]\n'
                        '[resources]\ngpus = ["A100"]\ngpus_per_node = 1\n'
                        '[checkpoint]\nuri = "ckpt"\n'
                        '[retry]\nmax_restarts_on_errors = 0\n')  # fmt: skip
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    try:
        daemon = Daemon(setup)
        job_id = json.loads(setup.cli("submit", str(job_file), "--json").stdout)["id"]
        wait_for(store, job_id, lambda j, _: j.status is JobStatus.RUNNING)
        daemon.kill()
        go.write_text(str(code))
        # The agent keeps the exit, then goes on trying to report it...
        deadline = time.monotonic() + 30
        while not kept_exits(str(tmp_path / "ckpt"), job_id, 1):
            assert time.monotonic() < deadline, "the node never kept its exit"
            time.sleep(0.05)
        # ...when the market takes the node back.
        (attempt,) = store.attempts(job_id)
        _, providers = build_providers(load_settings(setup.config))
        provider, iid = providers[attempt.pool.provider], attempt.instance_ids[0]
        provider.reclaim(iid)
        while not provider.describe([iid])[0].ended:
            assert time.monotonic() < deadline + 30, "the node was never taken back"
            time.sleep(0.05)
        daemon = Daemon(setup)
        job = wait_for(store, job_id, lambda j, _: j.status.terminal)
        assert daemon.stop() == 0
        attempts, events = store.attempts(job_id), store.events(job_id)
    finally:
        store.close()
    assert len(attempts) == 1, "\n".join(f"{e.cause}: {e.detail}" for e in events)
    if code == 0:
        assert job.status is JobStatus.SUCCEEDED, events
        assert attempts[0].end_reason is AttemptEnd.SUCCEEDED
    else:
        assert job.status is JobStatus.FAILED, events
        assert job.failure is FailureCause.USER_COMMAND_FAILED
        assert f"exited with {code}" in events[-1].detail


def test_submit_refuses_what_would_fail_later_naming_file_field_and_why(tmp_path: Path) -> None:
    setup = make_setup(tmp_path, seed=5, up=500.0)
    top = f"/nonexistent-spotd-{os.getpid()}"
    job = setup.job_file.read_text()
    files = {
        "proc.toml": job.replace('uri = "ckpt"', 'uri = "/proc/spotd-ckpt"'),
        "top.toml": job.replace('uri = "ckpt"', f'uri = "file://{top}/ckpt"'),
        # Before the simulated market's epoch (2026-02-02): past on the daemon's clock.
        "late.toml": job + "[deadline]\nfinish_by = 2026-01-01T00:00:00Z\n",
    }
    for name, text in files.items():
        (setup.root / name).write_text(text)
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    daemon = Daemon(setup)
    try:
        said = {}
        for name in files:
            result = setup.cli("submit", str(setup.root / name), check=False)
            assert result.returncode == 1, result.stdout + result.stderr
            (said[name],) = result.stderr.splitlines()  # one line, no traceback
        where = setup.root
        assert said["proc.toml"] == (
            f"error: {where / 'proc.toml'}: checkpoint.uri: /proc/spotd-ckpt: /proc is on "
            "proc, a pseudo filesystem of the kernel, not storage"
        )
        assert said["top.toml"] == (
            f"error: {where / 'top.toml'}: checkpoint.uri: file://{top}/ckpt: {top} does "
            "not exist, and spotd creates no folder at the top of the filesystem: create it "
            "first, or correct the path"
        )
        assert said["late.toml"].startswith(
            f"error: {where / 'late.toml'}: deadline.finish_by: 2026-01-01T00:00:00Z has "
            "passed (32 d "
        )
        assert "before now, 2026-02-" in said["late.toml"]
        assert said["late.toml"].endswith(
            "on the daemon's clock): give a time ahead, or leave finish_by out"
        )
        assert store.list_jobs() == [] and not Path(top).exists()
    finally:
        assert daemon.stop() == 0
        store.close()


def test_cli_against_a_running_daemon(tmp_path: Path) -> None:
    setup = make_setup(tmp_path, seed=5, up=500.0)  # a calm market: no preemption
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    daemon = Daemon(setup)
    try:
        bad = setup.root / "bad.toml"
        bad.write_text(
            'name = "x"\ncommand = ["true"]\n[resources]\ngpus = ["A100"]\ngpus_per_node = -2\n'
        )
        result = setup.cli("submit", str(bad), check=False)
        assert result.returncode == 2
        assert "bad.toml" in result.stderr and "resources.gpus_per_node" in result.stderr
        assert "line 5" in result.stderr

        job_id = submit(setup)
        wait_for(store, job_id, lambda j, _: j.status is JobStatus.RUNNING)
        status = json.loads(setup.cli("status", job_id, "--json").stdout)
        assert status["id"] == job_id and status["status"] == "running"
        assert status["attempts"][0]["provider"].startswith("sim-")
        assert status["progress"]["done_hours"] >= 0
        assert "progress: " in setup.cli("status", job_id).stdout
        table = setup.cli("status").stdout
        assert job_id in table and "running" in table
        events = json.loads(setup.cli("events", job_id, "--json").stdout)
        assert [e["to_status"] for e in events][:3] == ["pending", "provisioning", "running"]
        asked = setup.cli("priority", job_id, "5").stdout
        assert f"{job_id} priority 5 asked" in asked
        wait_for(store, job_id, lambda j, _: j.spec.priority == 5)  # its daemon's next pass
        # The cancel waits for the daemon's pass to stop the job's node.
        assert "cancelled" in setup.cli("cancel", job_id).stdout
        assert store.get_job(job_id).status is JobStatus.CANCELLED
        missing = setup.cli("status", "j-nope", check=False)
        assert missing.returncode == 1 and "j-nope" in missing.stderr
    finally:
        assert daemon.stop() == 0
        store.close()


def test_status_and_events_say_why_a_job_waits(tmp_path: Path) -> None:
    setup = make_setup(tmp_path, seed=5, up=500.0)
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    daemon = Daemon(setup)
    try:
        # A job that runs: once placed, the daemon's market has answered its polls.
        ok = submit(setup)
        wait_for(store, ok, lambda j, _: j.status is not JobStatus.PENDING)
        three = setup.root / "three.toml"
        three.write_text(setup.job_file.read_text().replace("gpus_per_node = 1",
                                                            "gpus_per_node = 3"))  # fmt: skip
        # Stored all the same, with a warning: no offering has three A100s a node.
        shown = json.loads(setup.cli("submit", str(three), "--json").stdout)
        (given,) = shown["warnings"]
        assert given["kind"] == "market"
        warning = given["detail"]
        assert warning.startswith("no offering has 3 A100 GPUs per node (offered: ")
        job_id = shown["id"]
        said = setup.cli("submit", str(three))
        assert f"warning: {warning}; the job is stored" in said.stderr
        waiting = wait_for(store, job_id, lambda j, _: j.waiting is not None).waiting
        assert waiting == warning
        assert f"waiting: {warning}" in setup.cli("status", job_id).stdout
        assert f"{job_id} waiting: {warning}" in setup.cli("status").stdout
        assert json.loads(setup.cli("status", job_id, "--json").stdout)["waiting"] == warning
        events = json.loads(setup.cli("events", job_id, "--json").stdout)
        assert [(e["cause"], e["detail"]) for e in events] == [
            ("submitted", ""), ("waiting", warning),
        ]  # fmt: skip
        time.sleep(1.0)  # some ten more passes: the reason is not written again
        assert len(store.events(job_id)) == 2
        # The running job waits for nothing.
        assert json.loads(setup.cli("status", ok, "--json").stdout)["waiting"] is None
    finally:
        assert daemon.stop() == 0
        store.close()


def test_token_file_is_private_and_required(setup: Setup) -> None:
    daemon = Daemon(setup)
    try:
        token = setup.root / "token"
        assert token.stat().st_mode & 0o777 == 0o600
        import httpx

        port = json.loads((setup.root / "daemon.json").read_text())["port"]
        assert httpx.get(f"http://127.0.0.1:{port}/v1/health").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/v1/jobs").status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert httpx.get(f"http://127.0.0.1:{port}/v1/jobs", headers=bad).status_code == 401
    finally:
        daemon.stop()


def test_cli_without_daemon_says_how_to_start_it(setup: Setup) -> None:
    result = setup.cli("status", check=False)
    assert result.returncode == 1
    assert "spotd daemon" in result.stderr


def test_a_second_daemon_on_the_same_data_dir_is_refused(setup: Setup) -> None:
    daemon = Daemon(setup)
    try:
        second = subprocess.run(
            [sys.executable, "-m", "spotd", "daemon", "--config", str(setup.config)],
            capture_output=True, text=True, timeout=60, check=False,
        )
        said = " ".join(second.stderr.split())  # rich folds long lines
        assert second.returncode == 2  # its configuration names a data_dir in use
        assert f"another spotd daemon is running on data_dir {setup.root}" in said
        assert f"(pid {daemon.proc.pid}, lock {setup.root / 'daemon.lock'})" in said
    finally:
        assert daemon.stop() == 0


def test_jobs_do_not_inherit_the_daemons_secrets(setup: Setup) -> None:
    """The daemon's cloud keys and SMTP password never reach a job (sim, like a cloud)."""
    secrets = {
        "AWS_SECRET_ACCESS_KEY": "aws-dummy-8d1f", "SPOTD_EMAIL__PASSWORD": "smtp-dummy-77",
        "AZURE_CLIENT_SECRET": "az-dummy-41", "SPOTD_SECRET_HF_TOKEN": "hf-dummy-0c",
    }  # fmt: skip
    job = setup.root / "env.toml"
    job.write_text('name = "env"\ncommand = ["/usr/bin/env"]\n'
                   '[resources]\ngpus = ["A100"]\ngpus_per_node = 1\n')  # fmt: skip
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    daemon = Daemon(setup, env={**os.environ, **secrets})
    try:
        job_id = json.loads(setup.cli("submit", str(job), "--json").stdout)["id"]
        wait_for(store, job_id, lambda j, _: j.status.terminal, timeout=120)
        output = setup.cli("logs", job_id).stdout
    finally:
        assert daemon.stop() == 0
        store.close()
    assert "PATH=" in output, "the job's environment was printed"
    for value in secrets.values():
        assert value not in output


SCAN_ENVIRONS = """
import pathlib, sys
wanted = sys.argv[1:]
for proc in pathlib.Path("/proc").iterdir():
    try:
        environ = (proc / "environ").read_bytes()
    except OSError:
        continue  # gone, or not ours to read
    for value in wanted:
        if value.encode() in environ:
            print("found", value, "in", proc.name)
print("scanned")
"""


def test_no_process_a_job_can_read_shows_the_daemons_secrets(setup: Setup) -> None:
    """A job on the simulated market runs on the daemon's host: it reads every process's
    ``/proc/PID/environ`` that it may (its own elders, the VM process, the daemon). None
    shows a secret the daemon was started with, though the daemon still holds them."""
    secrets = {
        "AWS_SECRET_ACCESS_KEY": "aws-dummy-5e2a", "SPOTD_EMAIL__PASSWORD": "smtp-dummy-90",
        "AZURE_CLIENT_SECRET": "az-dummy-c7", "SPOTD_SECRET_HF_TOKEN": "hf-dummy-3b",
    }  # fmt: skip
    script = setup.root / "scan.py"
    script.write_text(SCAN_ENVIRONS)
    job = setup.root / "scan.toml"
    argv = ", ".join(f'"{v}"' for v in [sys.executable, str(script), *secrets.values()])
    job.write_text(f'name = "scan"\ncommand = [{argv}]\n'
                   '[resources]\ngpus = ["A100"]\ngpus_per_node = 1\n')  # fmt: skip
    named = setup.root / "named.toml"
    named.write_text(f'name = "named"\nsecrets = ["HF_TOKEN"]\ncommand = ["{sys.executable}", '
                     '"-c", "import os; print(os.environ[\'HF_TOKEN\'][::-1])"]\n'
                     '[resources]\ngpus = ["A100"]\ngpus_per_node = 1\n')  # fmt: skip
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    daemon = Daemon(setup, env={**os.environ, **secrets})
    try:
        outputs = []
        for spec in (job, named):
            job_id = json.loads(setup.cli("submit", str(spec), "--json").stdout)["id"]
            wait_for(store, job_id, lambda j, _: j.status.terminal, timeout=120)
            outputs.append(setup.cli("logs", job_id).stdout)
        daemon_environ = Path(f"/proc/{daemon.proc.pid}/environ").read_bytes()
    finally:
        assert daemon.stop() == 0
        store.close()
    output, named_output = outputs
    assert "scanned" in output, output
    assert "found" not in output, output
    assert secrets["SPOTD_SECRET_HF_TOKEN"][::-1] in named_output, "the daemon kept the value"
    for value in secrets.values():
        assert value.encode() not in daemon_environ
    # Where the secret was, an empty value of the same length: the daemon read it first.
    assert b"SPOTD_SECRET_HF_TOKEN=\0" in daemon_environ


def test_the_daemon_says_at_start_what_it_read(setup: Setup) -> None:
    daemon = Daemon(setup)
    try:
        # The address file is written after the start line; the daemon is up.
        said = (setup.root / "daemon.log").read_text()
    finally:
        assert daemon.stop() == 0
    assert f"config: {setup.config}; database: sqlite:///" in said, said
    assert "email: off; webhooks: none" in said
    assert "maximum number of running instances" not in said


def test_a_jobs_python3_is_the_one_with_spotd(setup: Setup) -> None:
    """A simulated node's PATH starts with its image's Python, as a cloud image's does:
    a job's ``python3`` imports spotd though the daemon's shell had no venv active."""
    job = setup.root / "py.toml"
    which = "import spotd, sys; print('python:', sys.executable)"
    job.write_text(f'name = "py"\ncommand = ["python3", "-c", "{which}"]\n'
                   '[resources]\ngpus = ["A100"]\ngpus_per_node = 1\n')  # fmt: skip
    store = open_store(f"sqlite:///{setup.root / 'spotd.db'}")
    daemon = Daemon(setup, env={**os.environ, "PATH": "/usr/bin:/bin"})
    try:
        job_id = json.loads(setup.cli("submit", str(job), "--json").stdout)["id"]
        ended = wait_for(store, job_id, lambda j, _: j.status.terminal, timeout=120)
        output = setup.cli("logs", job_id).stdout
    finally:
        assert daemon.stop() == 0
        store.close()
    assert ended.status is JobStatus.SUCCEEDED, output
    assert f"python: {Path(sys.executable).parent}" in output, output
