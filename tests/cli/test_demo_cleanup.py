"""``spotd demo`` interrupted by Ctrl-C says so and leaves nothing behind: no folder, no
node, no process (the tiny example's and the ddp example's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from spotd.core.values import InstanceState
from spotd_sim.records import VmStatus

STOPPED = "stopped: interrupted; the demo's daemon and nodes are stopped, its folder removed"


def running_vms(tmp: Path) -> list[int]:
    """The VM processes of the demo's simulated nodes that run their job."""
    found = []
    for path in tmp.glob("spotd-demo-*/sim/*.state.json"):
        try:
            status = VmStatus.load(path)
        except (OSError, ValueError):
            continue  # being written
        if status is not None and status.state is InstanceState.RUNNING and status.pid:
            found.append(status.pid)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def descendants(pid: int) -> set[int]:
    """Every process started under ``pid``, its children's children too (the simulated
    nodes start sessions of their own, and stay its descendants)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue  # gone meanwhile
        parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        children = {child for child, ppid in parents.items() if ppid == parent}
        todo.extend(children - found)
        found |= children
    return found


def start_demo(tmp: Path, *args: str) -> subprocess.Popen[bytes]:
    """``spotd demo ARGS`` with ``tmp`` as its temporary directory."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    # As from a terminal, Ctrl-C raises KeyboardInterrupt. A test run started in the
    # background of a shell without job control ignores SIGINT, its children inherit
    # that, and Python then installs no handler: the demo puts it back first.
    demo = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"sys.argv = ['spotd', 'demo', '--json', *{list(args)!r}]; "
        "runpy.run_module('spotd', run_name='__main__')"
    )
    return subprocess.Popen([sys.executable, "-c", demo], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def interrupt(demo: subprocess.Popen[bytes]) -> str:
    """Ctrl-C, and what the demo said until it ended."""
    try:
        demo.send_signal(signal.SIGINT)
        _, err = demo.communicate(timeout=90)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    said = err.decode(errors="replace")
    assert demo.returncode == 130, said
    assert said.rstrip().splitlines()[-1] == STOPPED, said
    assert "Traceback" not in said, said
    return said


def wait_for(demo: subprocess.Popen[bytes], found: Callable[[], object], what: str) -> None:
    limit = time.monotonic() + 90
    while not found():
        if demo.poll() is not None or time.monotonic() > limit:
            demo.kill()
            pytest.fail(f"the demo never got to {what} (exit {demo.wait()})")
        time.sleep(0.02)


@pytest.mark.slow
def test_ctrl_c_as_the_demo_starts_removes_its_folder(tmp_path: Path) -> None:
    demo = start_demo(tmp_path)
    wait_for(demo, lambda: list(tmp_path.glob("spotd-demo-*")), "making its folder")
    started = descendants(demo.pid)  # the uninterrupted reference run, at least
    err = interrupt(demo)  # while its daemon starts
    assert list(tmp_path.iterdir()) == [], err
    assert not [pid for pid in started if alive(pid)]


@pytest.mark.slow
def test_ctrl_c_while_the_job_runs_removes_the_folder_and_stops_the_nodes(
    tmp_path: Path,
) -> None:
    demo = start_demo(tmp_path)
    wait_for(demo, lambda: running_vms(tmp_path), "running its job")
    vms = running_vms(tmp_path)
    started = descendants(demo.pid)
    assert set(vms) <= started
    err = interrupt(demo)
    assert list(tmp_path.iterdir()) == [], err
    # The nodes were stopped, not left to run on in a folder that is gone; and the job's
    # own processes under them, and the reference run, with them.
    assert not [pid for pid in started if alive(pid)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_while_the_ddp_job_runs_leaves_no_folder_and_no_rank(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    demo = start_demo(tmp_path, "--example", "ddp")
    wait_for(demo, lambda: len(running_vms(tmp_path)) == 2, "running its two nodes")
    started = descendants(demo.pid)
    err = interrupt(demo)
    assert list(tmp_path.iterdir()) == [], err
    assert not [pid for pid in started if alive(pid)]
