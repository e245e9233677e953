"""Several daemons on one database: the file locks, the owner and leader locks, the clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotd.core.errors import ConfigError
from spotd.core.spec import JobSpec
from spotd.store.base import make_engine
from spotd.store.coordination import Coordinator, FileLock
from spotd.store.sql import open_store


def _soon(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Whether ``check`` passes within ``seconds``: the server ends a released session,
    and frees its advisory locks, a moment after the client hangs up."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_file_lock_names_its_holder(tmp_path: Path) -> None:
    first = FileLock(tmp_path / "daemon.lock")
    first.acquire("busy")
    with pytest.raises(ConfigError, match=rf"busy \(pid {os.getpid()}, lock .*daemon.lock\)"):
        FileLock(tmp_path / "daemon.lock").acquire("busy")
    first.release()
    again = FileLock(tmp_path / "daemon.lock")
    again.acquire("busy")  # free once released
    again.release()


def test_sqlite_serves_one_daemon_and_says_to_use_postgresql(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'spotd.db'}"
    one, two = Coordinator(make_engine(url)), Coordinator(make_engine(url))
    one.claim_daemon(tmp_path / "a", "daemon-a")
    try:
        with pytest.raises(ConfigError, match="another spotd daemon is running on data_dir"):
            two.claim_daemon(tmp_path / "a", "daemon-b")
        with pytest.raises(ConfigError, match=r"SQLite serves one daemon.*PostgreSQL"):
            two.claim_daemon(tmp_path / "b", "daemon-b")
        assert one.try_lead() and not one.shared
    finally:
        one.release()
        two.release()
    two.claim_daemon(tmp_path / "b", "daemon-b")  # the first has gone
    two.release()


@pytest.mark.postgres
def test_one_daemon_per_owner_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    a, b, c = (Coordinator(make_engine(pg_url)) for _ in range(3))
    try:
        a.claim_daemon(tmp_path / "a", "gpu-sched-1")
        with pytest.raises(ConfigError, match=r"daemon\.owner 'gpu-sched-1' is already running"):
            b.claim_daemon(tmp_path / "b", "gpu-sched-1")
        c.claim_daemon(tmp_path / "c", "gpu-sched-2")  # another owner is welcome
        assert c.shared
    finally:
        for coordinator in (a, b, c):
            coordinator.release()


@pytest.mark.postgres
def test_live_daemons_are_counted_per_database(pg_url: str, tmp_path: Path) -> None:
    a, b = Coordinator(make_engine(pg_url)), Coordinator(make_engine(pg_url))
    try:
        assert a.live_daemons() == 1  # nobody holds an owner lock yet: still "just me"
        a.claim_daemon(tmp_path / "a", "sched-a")
        b.claim_daemon(tmp_path / "b", "sched-b")
        assert a.live_daemons() == b.live_daemons() == 2
        b.try_lead()  # the leader's lock is of another kind: not a daemon more
        assert a.live_daemons() == 2
        b.release()
        assert _soon(lambda: a.live_daemons() == 1)
    finally:
        a.release()
        b.release()


def test_sqlite_has_one_live_daemon(tmp_path: Path) -> None:
    coordinator = Coordinator(make_engine(f"sqlite:///{tmp_path / 'one.db'}"))
    assert coordinator.live_daemons() == 1


@pytest.mark.postgres
def test_one_leader_and_a_successor(pg_url: str, tmp_path: Path) -> None:
    a, b = Coordinator(make_engine(pg_url)), Coordinator(make_engine(pg_url))
    try:
        assert a.try_lead() is True
        assert b.try_lead() is False
        assert a.try_lead() is True, "a leader keeps leading"
        a.release()
        assert _soon(b.try_lead)
    finally:
        a.release()
        b.release()


LEADER = """
import sys, time
from spotd.store.coordination import Coordinator
from spotd.store.base import make_engine
c = Coordinator(make_engine(sys.argv[1]))
assert c.try_lead()
print("leading", flush=True)
time.sleep(600)
"""


@pytest.mark.postgres
def test_a_killed_leaders_lock_passes_on_within_a_second(pg_url: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", LEADER, pg_url], stdout=subprocess.PIPE,
                             text=True)  # fmt: skip
    follower = Coordinator(make_engine(pg_url))
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "leading"
        assert follower.try_lead() is False
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        killed = time.monotonic()
        while not follower.try_lead():
            assert time.monotonic() - killed < 5, "the lock never passed on"
            time.sleep(0.05)
        assert time.monotonic() - killed < 1.0
    finally:
        if child.poll() is None:
            child.kill()
        follower.release()


@pytest.mark.postgres
def test_database_time_is_the_servers(pg_url: str) -> None:
    db = Coordinator(make_engine(pg_url)).database_time()
    assert db.tzinfo is not None and abs(db - datetime.now(UTC)) < timedelta(seconds=5)


def _job() -> JobSpec:
    return JobSpec.model_validate({"name": "t", "command": ["true"],
                                   "resources": {"gpus": ["A100"], "gpus_per_node": 1}})


@pytest.mark.postgres
def test_leases_run_on_the_database_clock_whatever_the_daemons_say(pg_url: str) -> None:
    """Two daemons whose clocks differ by a day still see one lease."""
    store = open_store(pg_url)
    try:
        job = store.create_job(_job(), now=datetime.now(UTC))
        assert store.claim_jobs("d1", lease_seconds=3.0) == [job.id]
        lease = store.get_job(job.id).lease_until
        assert lease is not None
        assert abs(lease - (datetime.now(UTC) + timedelta(seconds=3))) < timedelta(seconds=5)
        assert store.claim_jobs("d2", lease_seconds=3.0) == [], "held, on the server's clock"
        time.sleep(3.2)
        assert store.claim_jobs("d2", lease_seconds=60.0) == [job.id]
        assert store.job_owners() == ["d2"]
    finally:
        store.close()
