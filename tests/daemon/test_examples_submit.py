"""Every shipped example, submitted to a real daemon on the embedded default.

The default is what `pip install -e .` and `spotd daemon` give: SQLite and the
simulated market, no cloud SDK and no fsspec backend for a bucket. An example
either goes in as it is, or is refused with one line that says what it needs,
and its own comments say the same (issue 21: a newcomer's first hour).
"""

from __future__ import annotations

import importlib.util
import json
from importlib import resources
from pathlib import Path

from daemon_support import Daemon, make_setup

from spotd.core.spec_io import load_job_file

EXAMPLES = Path(str(resources.files("spotd.examples")))
NEEDS: dict[str, str | None] = {
    "job.toml": None,
    "deadline.toml": None,
    "multinode-70b.toml": "s3fs",  # a cloud template: s3:// checkpoints
}
"""Each example, and the package the default install lacks for it (None: runs as is)."""


def test_each_shipped_example_is_accepted_or_says_what_it_needs(tmp_path: Path) -> None:
    assert {p.name for p in EXAMPLES.glob("*.toml")} == set(NEEDS), "a new example: add it"
    # Nodes that boot for a simulated day (over two real minutes): each accepted job
    # is still booting when it is cancelled, so the submit is all that is tested.
    setup = make_setup(tmp_path, seed=5, up=500.0, boot=86_400)
    daemon = Daemon(setup)
    try:
        for name, package in NEEDS.items():
            path = EXAMPLES / name
            result = setup.cli("submit", str(path), "--json", check=False)
            if package is None or importlib.util.find_spec(package) is not None:
                assert result.returncode == 0, f"{name}: {result.stderr}"
                job = json.loads(result.stdout)
                assert job["status"] == "pending" and job["name"] == load_job_file(path).name
                setup.cli("cancel", job["id"])  # submit only: nothing trains here
                continue
            uri = load_job_file(path).checkpoint.uri
            message = (f"checkpoint.uri: {uri}: needs {package}, which this daemon lacks; "
                       f"pip install {package} beside the daemon")  # fmt: skip
            assert result.returncode == 1, f"{name}: {result.stdout}"
            said = result.stderr.strip()
            assert said == f"error: {path}: {message}", f"{name}: one line, no traceback"
            assert f"pip install {package}" in path.read_text(), f"{name} says what it needs"
    finally:
        assert daemon.stop() == 0
