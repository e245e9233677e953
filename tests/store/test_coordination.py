"""Several daemons on one database: the file locks, the owner and leader locks, the clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from spotd.core.clock import WALL
from spotd.core.errors import ConfigError
from spotd.core.spec import JobSpec
from spotd.store.base import make_engine
from spotd.store.coordination import Coordinator, FileLock
from spotd.store.sql import open_store

SAFETY_SECONDS = 60.0
"""How long a wait for the server goes on before the test gives up: a safety net, far
beyond the moment the server needs on any machine."""


def _soon(check: Callable[[], bool], seconds: float = SAFETY_SECONDS) -> bool:
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
sys.stdin.read()  # leads until killed (or until the test's end closes its stdin)
"""


@pytest.mark.postgres
def test_a_killed_leaders_lock_passes_on(pg_url: str) -> None:
    """The server frees a dead session's advisory lock: the follower leads next. How soon
    is the server's speed (about a second), a benchmark's matter, not this test's."""
    child = subprocess.Popen([sys.executable, "-c", LEADER, pg_url], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    follower = Coordinator(make_engine(pg_url))
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "leading"
        assert follower.try_lead() is False
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=SAFETY_SECONDS)
        assert _soon(follower.try_lead), "the lock never passed on"
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()
        follower.release()


@pytest.mark.postgres
def test_database_time_is_the_servers(pg_url: str) -> None:
    coordinator = Coordinator(make_engine(pg_url))
    before = WALL.now()
    db = coordinator.database_time()
    after = WALL.now()
    # Read between the two readings of this host's clock, however long that took; the
    # slack is for a server whose clock is a little off this host's.
    skew = timedelta(seconds=5)
    assert db.tzinfo is not None and before - skew <= db <= after + skew


def _job() -> JobSpec:
    return JobSpec.model_validate({"name": "t", "command": ["true"],
                                   "resources": {"gpus": ["A100"], "gpus_per_node": 1}})


@pytest.mark.postgres
def test_leases_run_on_the_database_clock_whatever_the_daemons_say(pg_url: str) -> None:
    """Two daemons whose clocks differ by a day still see one lease."""
    store = open_store(pg_url)
    try:
        held = store.create_job(_job(), now=WALL.now())
        # An hour's lease: held, on the server's clock, for far longer than this test.
        before = WALL.now()
        assert store.claim_jobs("d1", lease_seconds=3600.0) == [held.id]
        after = WALL.now()
        lease = store.get_job(held.id).lease_until
        skew = timedelta(seconds=5)  # the server's clock may be a little off this host's
        hour = timedelta(hours=1)
        assert lease is not None and before + hour - skew <= lease <= after + hour + skew
        assert store.claim_jobs("d2", lease_seconds=60.0) == [], "held, on the server's clock"
        # A lease of a second: free once the server's clock has passed it, whenever
        # that is; d2 asks until then.
        short = store.create_job(_job(), now=WALL.now())
        both = sorted([held.id, short.id])
        assert store.claim_jobs("d1", lease_seconds=1.0) == both
        assert _soon(lambda: store.claim_jobs("d2", lease_seconds=3600.0) != [])
        assert store.claim_jobs("d2", lease_seconds=3600.0) == both
        assert store.job_owners() == ["d2"]
    finally:
        store.close()
