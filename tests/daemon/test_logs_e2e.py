"""End to end on the simulated market: a job's printed line reaches ``spotd logs`` the way
it does on a cloud, shipped by the node's agent into the daemon's store."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from daemon_support import Daemon, make_setup, wait_for

from spotd.cli.client import Client
from spotd.daemon.config import load_settings
from spotd.daemon.logview import LogSource
from spotd.store import open_store
from spotd.store.joblogs import JobLogRows

PRINTS = "import sys; print('the answer is', 6 * 7); print('to stderr', file=sys.stderr)"


def test_a_simulated_jobs_printed_line_is_shipped_and_shown(tmp_path: Path) -> None:
    setup = make_setup(tmp_path, seed=4, up=1e6, boot=60)
    job_file = tmp_path / "answer.toml"
    job_file.write_text(f'name = "answer"\ncommand = {json.dumps([sys.executable, "-c", PRINTS])}\n'
                        '[resources]\ngpus = ["A100"]\ngpus_per_node = 1\n')  # fmt: skip
    store = open_store(f"sqlite:///{tmp_path / 'spotd.db'}")
    daemon = Daemon(setup)
    try:
        job_id = json.loads(setup.cli("submit", str(job_file), "--json").stdout)["id"]
        ended = wait_for(store, job_id, lambda j, _: j.status.terminal, timeout=120)
        shown = setup.cli("logs", job_id).stdout
        one = setup.cli("logs", job_id, "--attempt", "1", "--node", "0").stdout
        page = Client.from_settings(load_settings(setup.config)).logs(job_id)
        rows = JobLogRows.of(store)
        assert rows is not None
        kept = rows.kept(job_id)
    finally:
        assert daemon.stop() == 0
        store.close()
    assert ended.status.value == "succeeded", shown
    assert "the answer is 42\n" in shown and "to stderr\n" in shown, shown
    assert one == shown, "the job's only node"
    (node,) = page.nodes
    assert node.source is LogSource.AGENT and node.start == 0 and node.skipped == 0
    (shipped,) = kept
    assert b"the answer is 42\n" in shipped.data
    assert node.end == shipped.end == len(shipped.data), "all of it, before the job ended"
    assert "job exited with 0" in shown, "the agent's own lines come with the job's"
