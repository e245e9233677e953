"""A real ``spotd daemon`` process on the simulated market, for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from spotd.core.values import JobRecord
from spotd.store import SqlStore

TRAINER = Path(str(resources.files("spotd.examples") / "train_tiny.py"))
STEPS = 100

CONFIG = """
data_dir = "{root}"

[daemon]
port = 0
tick_seconds = 0.1
owner = "test-daemon"
reap_every_ticks = 3

[scheduling]
cooldown_hours = 1.0

[providers.sim]
seed = {seed}
speed = 600
mean_up_hours = {up}
mean_down_hours = 1.0
boot_seconds = {boot}
epoch = 2026-02-02T00:00:00Z
"""

JOB = """
name = "tiny"
command = ["{python}", "{trainer}", "--steps", "{steps}", "--ckpt-every", "5",
           "--step-seconds", "0.1"]

[resources]
gpus = ["A100"]
gpus_per_node = 1

[checkpoint]
uri = "ckpt"
"""


@dataclass
class Setup:
    root: Path
    config: Path
    job_file: Path

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "spotd", *args, "--config", str(self.config)],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "COLUMNS": "200"},
        )
        if check:
            assert result.returncode == 0, result.stdout + result.stderr
        return result


def make_setup(root: Path, *, seed: int, up: float = 0.5, boot: float = 120) -> Setup:
    config = root / "spotd.toml"
    config.write_text(CONFIG.format(root=root, seed=seed, up=up, boot=boot))
    job_file = root / "job.toml"
    job_file.write_text(JOB.format(python=sys.executable, trainer=TRAINER, steps=STEPS))
    return Setup(root, config, job_file)


class Daemon:
    """A ``spotd daemon`` process."""

    def __init__(self, setup: Setup, env: dict[str, str] | None = None) -> None:
        self.setup = setup
        address = setup.root / "daemon.json"
        address.unlink(missing_ok=True)
        self.log = (setup.root / "daemon.log").open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spotd", "daemon", "--config", str(setup.config)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if json.loads(address.read_text())["pid"] == self.proc.pid:
                    return
            except (OSError, ValueError, KeyError):
                pass
            assert self.proc.poll() is None, (setup.root / "daemon.log").read_text()
            time.sleep(0.05)
        raise AssertionError("daemon did not start")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def wait_for(
    store: SqlStore, job_id: str, cond: Callable[[JobRecord, int], bool], timeout: float = 60
) -> JobRecord:
    limit = time.monotonic() + timeout
    while time.monotonic() < limit:
        job = store.get_job(job_id)
        if cond(job, len(store.attempts(job_id))):
            return job
        time.sleep(0.02)
    raise AssertionError(f"{job_id} never got there; it is {store.get_job(job_id).status}")
