"""spotd.daemon.process: a real ``spotd daemon`` stopped by Ctrl-C (SIGINT) drains, ends its
log with a ``stopped:`` line, exits 0 and leaves no process and no address file behind."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from daemon_support import Daemon, make_setup


def children_of(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found |= {int(c) for c in task.read_text().split()}
        except OSError:
            continue
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_daemon_stops_cleanly_and_says_so(tmp_path: Path, sig: signal.Signals) -> None:
    setup = make_setup(tmp_path, seed=1)
    daemon = Daemon(setup)
    try:
        assert setup.cli("status").returncode == 0  # up and answering
        started = children_of(daemon.proc.pid)
        daemon.proc.send_signal(sig)
        code = daemon.proc.wait(timeout=60)
    finally:
        if daemon.proc.poll() is None:
            daemon.kill()
    daemon.log.close()
    log = (tmp_path / "daemon.log").read_text()
    assert code == 0, log
    lines = log.splitlines()
    assert f"INFO spotd.daemon.process: received {sig.name}, draining" in lines[-2], log
    assert lines[-1].endswith(
        "INFO spotd.daemon.process: stopped: the API is closed and no pass runs; instances "
        "keep running, and the next start picks them up"
    ), log
    assert "Traceback" not in log
    assert not (tmp_path / "daemon.json").exists()
    assert not [pid for pid in started if Path(f"/proc/{pid}").exists()]
