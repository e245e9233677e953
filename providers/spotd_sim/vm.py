"""The simulated hypervisor of one node: ``python -m spotd_sim.vm STATE_DIR ID``.

It lives independently of the daemon, like a real cloud VM: it boots for the
spec's boot time, runs the job in its own process group, and ends it when the
job exits, when a terminate request file appears, when it gets SIGTERM or
SIGINT itself, or (spot only) when the market takes the pool's capacity back,
after SIGTERM and the provider's notice time. It reports every step in its
status file, and it never ends with the job's processes still running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from types import FrameType

from spotd.core.clock import WALL
from spotd.core.contracts import Clock
from spotd.core.values import InstanceState, Market

from .clock import SimClock
from .market import SimMarket
from .nodeenv import node_environment
from .procs import (
    become_subreaper,
    die_with_parent,
    kill_descendants,
    signal_group,
    start_ticks,
)
from .records import InstanceSpec, VmStatus
from .statedir import LOCK_FD_ENV, StateDir, open_lock, try_lock

POLL_SECONDS = 0.05
"""Real seconds between two looks at the job, the market and the request files."""

TERMINATE_GRACE_SECONDS = 2.0
"""Real seconds a terminated job gets between SIGTERM and SIGKILL."""


class _Vm:
    """One node's life: boot, run, watch, end; on the market's ``clock``, and on the
    host's ``wall`` for the real moment the job's notice runs out."""

    def __init__(self, spec: InstanceSpec, paths: StateDir, clock: SimClock, wall: Clock) -> None:
        self.spec = spec
        self.paths = paths
        self.clock = clock
        self.wall = wall
        self.market = SimMarket(spec.market_config, epoch=clock.sim_epoch)
        self.status = VmStatus(InstanceState.PENDING, os.getpid(), spec.launched_at)
        self.child: subprocess.Popen[bytes] | None = None
        self.stop_reason = ""

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        self._save()
        try:
            if self._boot() and self._start_job():
                self._watch()
        except BaseException as exc:
            self._end(InstanceState.TERMINATED, reason=f"VM failed: {exc!r}")
            raise
        return 0

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.stop_reason = f"VM process got {signal.Signals(signum).name}"

    def _stop_requested(self) -> bool:
        if not self.stop_reason and self.paths.terminate_request(self.spec.id).exists():
            self.stop_reason = "terminate requested"
        return bool(self.stop_reason)

    def _capacity_lost(self) -> bool:
        if self.spec.market is not Market.SPOT:
            return False
        if self.paths.reclaim_request(self.spec.id).exists():
            return True  # the market took this one node back (SimProvider.reclaim)
        if self.spec.taken_back_at is not None:
            return self.clock.now() >= self.spec.taken_back_at  # its lifetime is over
        return not self.market.available(self.spec.pool, self.clock.now(), self.spec.nodes)

    def _boot(self) -> bool:
        """Wait out the boot time; False when the node ended before the job started."""
        ready_at = self.spec.launched_at.timestamp() + self.spec.boot_seconds
        while (left := ready_at - self.clock.now().timestamp()) > 0 or self._stalled():
            if self._stop_requested():
                self._end(InstanceState.TERMINATED, reason=self.stop_reason)
                return False
            if self._capacity_lost():
                self._end(InstanceState.PREEMPTED, reason="spot capacity reclaimed while booting")
                return False
            time.sleep(min(POLL_SECONDS, max(0.0, self.clock.seconds_to_real(left))))
        return True

    def _stalled(self) -> bool:
        """A node told to hang in boot (SimProvider.stall) never starts its job."""
        return self.paths.stall_request(self.spec.id).exists()

    def _start_job(self) -> bool:
        """Start the job in its own session; False when it could not start."""
        spec = self.spec
        env = node_environment(os.environ, spec.env, image_bin=str(Path(sys.executable).parent))
        env.pop(LOCK_FD_ENV, None)
        log_path = self.paths.job_log(spec.id)
        with log_path.open("ab") as log:
            try:
                Path(spec.workdir).mkdir(parents=True, exist_ok=True)
                # preexec_fn is safe here: the VM process has one thread.
                self.child = subprocess.Popen(
                    spec.command,
                    cwd=spec.workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent(),  # noqa: PLW1509
                )
            except OSError as exc:
                log.write(f"spotd-sim: cannot start {list(spec.command)}: {exc}\n".encode())
                # Written out before the node says it ended: whoever reads the end
                # reads the log next, and must find why.
                log.flush()
                # The shell's codes: 127 command not found, 126 cannot run it.
                code = 127 if isinstance(exc, FileNotFoundError) else 126
                self._end(InstanceState.EXITED, exit_code=code, reason=str(exc))
                return False
        pid = self.child.pid
        self.status = replace(
            self.status, state=InstanceState.RUNNING, running_at=self.clock.now(),
            child_pid=pid, child_start=start_ticks(pid),
        )  # fmt: skip
        self._save()
        return True

    def _watch(self) -> None:
        """Follow the running job until the node ends."""
        assert self.child is not None
        notice_deadline: float | None = None
        while True:
            code = self.child.poll()
            if code is not None:
                # Ending by itself with 0 during the notice is a finished job.
                done = notice_deadline is None or code == 0
                state = InstanceState.EXITED if done else InstanceState.PREEMPTED
                self._end(state, exit_code=code, reason="job exited")
                return
            if self._stop_requested():
                code = self._stop_job()
                self._end(InstanceState.TERMINATED, exit_code=code, reason=self.stop_reason)
                return
            if notice_deadline is None and self._capacity_lost():
                notice_deadline = self._give_notice()
            elif notice_deadline is not None and self.clock.monotonic() >= notice_deadline:
                code = self._kill_job()
                self._end(InstanceState.PREEMPTED, exit_code=code, reason="spot capacity reclaimed")
                return
            time.sleep(POLL_SECONDS)

    def _give_notice(self) -> float:
        """Record the notice and SIGTERM the job; return the real deadline."""
        real_left = self.clock.seconds_to_real(self.spec.notice_seconds)
        self.status = replace(
            self.status, state=InstanceState.NOTICE, notice_at=self.clock.now(),
            kill_at=self.wall.now() + timedelta(seconds=real_left),
        )  # fmt: skip
        self._save()
        self._signal_job(signal.SIGTERM)
        return self.clock.monotonic() + real_left

    def _stop_job(self) -> int:
        """SIGTERM, a short grace, then SIGKILL; return the job's exit code."""
        assert self.child is not None
        self._signal_job(signal.SIGTERM)
        try:
            return self.child.wait(TERMINATE_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            return self._kill_job()

    def _kill_job(self) -> int:
        assert self.child is not None
        self._signal_job(signal.SIGKILL)
        return self.child.wait()

    def _power_off(self) -> None:
        """Kill whatever the job left behind: an agent runs the job's command in a
        process group of its own, and a launcher may put its workers in sessions of
        their own, which a signal to the job's group misses. As this VM's orphans
        come to it (a child subreaper), all of them are its descendants."""
        kill_descendants(os.getpid())

    def _signal_job(self, sig: signal.Signals) -> None:
        if self.status.child_pid is not None:
            signal_group(self.status.child_pid, sig, self.status.child_start)

    def _end(self, state: InstanceState, *, exit_code: int | None = None, reason: str) -> None:
        # Helpers the job left in its group go too, before the final word,
        # so whoever reads the final state finds no process of the job.
        if self.child is not None:
            self._signal_job(signal.SIGKILL)
            if self.child.poll() is None:
                self.child.wait()
            self._power_off()
        self.status = replace(
            self.status, state=state, exit_code=exit_code, ended_at=self.clock.now(),
            reason=reason,
        )  # fmt: skip
        self._save()
        _say(f"{self.spec.id} {state.value} exit_code={exit_code} ({reason})", self.wall)

    def _save(self) -> None:
        self.status.save(self.paths.state(self.spec.id))


def _say(message: str, wall: Clock = WALL) -> None:
    """A line of the VM's log, stamped with the local time of day by ``wall``."""
    print(f"{wall.now().astimezone().isoformat()} spotd-sim-vm: {message}", flush=True)


def _take_lock(paths: StateDir, instance_id: str) -> int | None:
    """The fd holding this instance's lock, None when another VM holds it."""
    inherited = os.environ.get(LOCK_FD_ENV)
    if inherited is not None:
        return int(inherited)
    fd = open_lock(paths.lock(instance_id))
    if try_lock(fd):
        return fd
    os.close(fd)
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one simulated node until it ends; the exit status is the VM's, not the job's."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m spotd_sim.vm STATE_DIR INSTANCE_ID", file=sys.stderr)
        return 2
    paths, instance_id = StateDir(Path(args[0])), args[1]
    if _take_lock(paths, instance_id) is None:
        _say(f"{instance_id}: another VM process runs this instance")
        return 0
    spec = InstanceSpec.load(paths.spec(instance_id))
    if spec is None:
        _say(f"{instance_id}: no spec file in {paths.root}")
        return 2
    if paths.state(instance_id).exists():
        # A VM already ran this node; a node never boots twice.
        _say(f"{instance_id}: already started once")
        return 0
    # Like a VM's init: whatever the job leaves behind ends with the node.
    become_subreaper()
    # The launching daemon's time reference, not this host's clock, if they differ.
    offset = spec.clock_offset
    clock = SimClock.open(paths.root, wall=lambda: WALL.now().timestamp() + offset)
    return _Vm(spec, paths, clock, WALL).run()


if __name__ == "__main__":
    sys.exit(main())
