"""Benchmark: the HTTP API under load and bad input, on the simulated market.

Run: python benchmarks/api_load.py [--jobs 2000] [--clients 8] [--fill 10000]

Starts a real daemon (``python -m spotd daemon``, its own process, so its memory
is its own) on loopback with a temporary data_dir and the simulated market, and:

1. submits ``--jobs`` jobs through the API from ``--clients`` concurrent clients
   (the CLI's own :class:`~spotd.cli.client.Client`) and prints submit p50/p99;
2. fills the store directly (SQL inserts, as many submits would have) up to
   ``--fill`` jobs, and times ``spotd status`` (the command, a new process, as a
   user runs it) and the API page it reads;
3. sends a 50 MB submit, once with a Content-Length and once chunked, expects
   413 for both, and prints how far the daemon's peak memory grew.

The jobs ask for a price no offering meets, so they stay pending: what is
measured is the API, not 2,000 simulated trainers on a 2-core machine. It stops
by itself (every wait is bounded) and leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import insert

from spotd.cli.client import Client
from spotd.core.spec import JobSpec
from spotd.core.spec_io import spec_to_json
from spotd.daemon.config import load_settings
from spotd.store import open_store
from spotd.store.job_sql import new_job_id
from spotd.store.tables import ATTEMPTS, EVENTS, JOBS

CONFIG = """
data_dir = "{root}"

[daemon]
port = 0
tick_seconds = 2.0
owner = "bench"

[providers.sim]
seed = 3
speed = 60
epoch = 2026-02-02T00:00:00Z
"""

BIG = 50 * 1024 * 1024
"""The oversized submit: 50 MiB of job name."""


def job_spec(i: int) -> JobSpec:
    """A one-GPU job no offering is cheap enough for: it stays pending."""
    return JobSpec.model_validate({
        "name": f"load-{i}", "command": ["true"],
        "resources": {"gpus": ["A100"], "gpus_per_node": 1},
        "market": {"max_price_per_gpu_hour": 0.0001},
    })  # fmt: skip


def proc_mib(pid: int, field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (resident at its peak) of ``pid``, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--jobs", type=int, default=2000)
    args.add_argument("--clients", type=int, default=8)
    args.add_argument("--fill", type=int, default=10_000)
    opts = args.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotd-api-") as tmp:
        run(opts, Path(tmp))


def run(opts: argparse.Namespace, root: Path) -> None:
    """Start the daemon, run the three parts, stop it whatever happens."""
    config = root / "spotd.toml"
    config.write_text(CONFIG.format(root=root))
    settings = load_settings(config)
    log = (root / "daemon.log").open("w")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "spotd", "daemon", "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_healthy(settings.address_file, daemon)
        print(f"daemon pid {daemon.pid}: {proc_mib(daemon.pid, 'VmRSS'):.0f} MiB resident at start")
        submits(opts, config)
        print(f"daemon resident after the submits: {proc_mib(daemon.pid, 'VmRSS'):.0f} MiB")
        fill(settings.db_url, opts.fill - opts.jobs)
        status_time(config, opts.fill)
        oversized(config, daemon.pid)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=10)
        log.close()


def wait_healthy(address: Path, daemon: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited ({daemon.returncode}); see its log")
        try:
            info = json.loads(address.read_text())
            url = f"http://{info['host']}:{info['port']}/v1/health"
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"the daemon did not answer within {timeout:.0f} s")


def submits(opts: argparse.Namespace, config: Path) -> None:
    """``opts.jobs`` submits from ``opts.clients`` threads, each with its own client."""
    settings = load_settings(config)
    times: list[float] = []
    lock = threading.Lock()
    numbers = iter(range(opts.jobs))

    def worker() -> None:
        client = Client.from_settings(settings)
        try:
            while True:
                with lock:
                    i = next(numbers, None)
                if i is None:
                    return
                start = time.perf_counter()
                client.submit(job_spec(i))
                took = time.perf_counter() - start
                with lock:
                    times.append(took)
        finally:
            client.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(opts.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    print(
        f"{len(times):,} submits from {opts.clients} clients in {wall:.1f} s "
        f"({len(times) / wall:.0f}/s): p50 {statistics.median(times) * 1000:.0f} ms, "
        f"p99 {percentile(times, 0.99) * 1000:.0f} ms"
    )


def fill(store_url: str, count: int) -> None:
    """``count`` ended jobs, each with its creation event and one closed attempt,
    inserted straight into the store (as the daemon would have kept them)."""
    if count <= 0:
        return
    store = open_store(store_url)
    text = spec_to_json(job_spec(0))
    start = datetime.now(UTC) - timedelta(days=30)
    try:
        for chunk in _chunks(range(count), 2000):
            jobs, events, attempts = [], [], []
            for i in chunk:
                job_id = new_job_id()
                at = start + timedelta(minutes=i)
                jobs.append({
                    "id": job_id, "name": f"old-{i}", "spec_json": text,
                    "status": "succeeded", "failure": None, "submitted_at": at,
                    "updated_at": at + timedelta(hours=1), "version": 3,
                })  # fmt: skip
                events.append({
                    "job_id": job_id, "at": at, "from_status": None, "to_status": "pending",
                    "cause": "submitted", "detail": "",
                })  # fmt: skip
                attempts.append({
                    "job_id": job_id, "seq": 1, "provider": "sim", "region": "r",
                    "zone": "r-a", "instance_type": "t", "market": "spot", "nodes": 1,
                    "price_per_node_hour": 1.0, "client_token": f"{job_id}-a1",
                    "instance_ids": '["i-1"]', "started_at": at, "running_at": at,
                    "ended_at": at + timedelta(hours=1), "end_reason": "succeeded",
                })  # fmt: skip
            with store.engine.begin() as conn:
                conn.execute(insert(JOBS), jobs)
                conn.execute(insert(EVENTS), events)
                conn.execute(insert(ATTEMPTS), attempts)
    finally:
        store.close()


def _chunks(items: range, size: int) -> Iterator[range]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def status_time(config: Path, total: int) -> None:
    """``spotd status`` as a user runs it, and the pages it and ``--all`` read."""
    env = {**os.environ, "COLUMNS": "200"}
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "spotd", "status", "--config", str(config)],
            capture_output=True, text=True, timeout=120, check=True, env=env,
        )  # fmt: skip
        runs.append(time.perf_counter() - start)
    rows = len(done.stdout.splitlines()) - 1
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import spotd.cli.app"], check=True, timeout=60)
    startup = time.perf_counter() - start
    print(
        f"`spotd status` with {total:,} jobs in the store: {statistics.median(runs):.2f} s "
        f"(median of 3, {rows} active jobs shown; the CLI's own start is {startup:.2f} s)"
    )
    client = Client.from_settings(load_settings(config))
    try:
        start = time.perf_counter()
        client.jobs(statuses=["active"], limit=100)
        active_page = time.perf_counter() - start
        start = time.perf_counter()
        every = sum(1 for _ in client.all_jobs())
        through = time.perf_counter() - start
    finally:
        client.close()
    print(
        f"API: the first page of 100 active jobs in {active_page * 1000:.0f} ms; "
        f"all {every:,} jobs, page by page (500 each), in {through:.1f} s"
    )


def oversized(config: Path, pid: int) -> None:
    """A 50 MB submit, with and without Content-Length: 413, and the daemon's peak."""
    settings = load_settings(config)
    token = settings.token_file.read_text().strip()
    info = json.loads(settings.address_file.read_text())
    url = f"http://{info['host']}:{info['port']}/v1/jobs"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = b'{"spec": {"name": "' + b"x" * BIG + b'"}}'
    peak_before = proc_mib(pid, "VmHWM")
    rss_before = proc_mib(pid, "VmRSS")

    def chunked() -> Iterator[bytes]:
        for i in range(0, len(body), 1 << 16):
            yield body[i : i + (1 << 16)]

    codes = []
    with httpx.Client(timeout=60) as http:
        codes.append(http.post(url, content=body, headers=headers).status_code)
        codes.append(http.post(url, content=chunked(), headers=headers).status_code)
    peak_after = proc_mib(pid, "VmHWM")
    verdict = "ok" if codes == [413, 413] and peak_after - peak_before < 50 else "FAILED"
    print(
        f"50 MB submit: {codes[0]} with Content-Length, {codes[1]} chunked; daemon peak "
        f"resident {peak_before:.0f} -> {peak_after:.0f} MiB (+{peak_after - peak_before:.1f}), "
        f"resident {rss_before:.0f} -> {proc_mib(pid, 'VmRSS'):.0f} MiB: {verdict}"
    )


if __name__ == "__main__":
    main()
