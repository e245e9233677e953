"""Benchmark: how fast the web dashboard's pages answer with 10,000 jobs in the store.

Run: python benchmarks/dashboard_load.py [--jobs 10000] [--repeat 30]

Starts a real daemon (``python -m spotd daemon``, its own process) on loopback
with a temporary data_dir and the simulated market, fills its store directly
(SQL inserts, as the daemon would have kept them) with ``--jobs`` jobs over the
30 simulated days before now: ended jobs with two attempts each (one
preempted, one succeeded) and their ledger lines, and 200 pending jobs no
offering is cheap enough for (the engine looks at them on every pass, as it
would). Then it logs in as a browser does and asks for every page, fragment
and chart ``--repeat`` times, one request at a time, and prints p50 and p99
per route, wall time as the client sees it.

Each route is asked once untimed first. The cost page builds a window's
report behind the answer and keeps it (rebuilt behind the answer once 30 s
old): "kept" asks for the last week again and again; "a new window" moves
the window by a minute each time, so that each answer starts a build and
says so (one build runs at a time, four wait at most). First, it times how
long a new window's figures take to show: the page, then its fragment asked
for until the report is in it.
It stops by itself and leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from sqlalchemy import insert

from spotd.core.spec import JobSpec
from spotd.core.spec_io import spec_to_json
from spotd.daemon.config import load_settings
from spotd.store import open_store
from spotd.store.job_sql import new_job_id
from spotd.store.tables import ATTEMPTS, EVENTS, JOBS, LEDGER

CONFIG = """
data_dir = "{root}"

[daemon]
port = 0
tick_seconds = 2.0
owner = "bench"

[providers.sim]
seed = 3
speed = 60
epoch = {epoch}
"""
EPOCH = datetime(2026, 2, 2, tzinfo=UTC)
PENDING = 200
POOL = {"provider": "sim-aws", "region": "us-east-1", "zone": "us-east-1a",
        "instance_type": "p4d.24xlarge"}  # fmt: skip
GOAL_MS = 300.0


def job_spec(name: str, max_price: float | None = None) -> JobSpec:
    market = {} if max_price is None else {"max_price_per_gpu_hour": max_price}
    return JobSpec.model_validate({
        "name": name, "command": ["true"],
        "resources": {"gpus": ["A100"], "gpus_per_node": 8}, "market": market,
    })  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--jobs", type=int, default=10_000)
    args.add_argument("--repeat", type=int, default=30)
    opts = args.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotd-dash-") as tmp:
        run(opts, Path(tmp))


def run(opts: argparse.Namespace, root: Path) -> None:
    """Fill the store, start the daemon, time the pages, stop it whatever happens."""
    config = root / "spotd.toml"
    config.write_text(CONFIG.format(root=root, epoch=EPOCH.strftime("%Y-%m-%dT%H:%M:%SZ")))
    settings = load_settings(config)
    # The store is filled before the daemon starts: the simulated clock starts at the
    # epoch then, and the jobs lie in the 30 days before it.
    open_store(settings.db_url).close()
    sample = fill(settings.db_url, opts.jobs)
    log = (root / "daemon.log").open("w")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "spotd", "daemon", "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        base = wait_healthy(settings.address_file, daemon)
        token = settings.token_file.read_text().strip()
        with httpx.Client(base_url=base, timeout=60) as client:
            client.headers["Cookie"] = f"spotd_session={login(client, token)}"
            time.sleep(5)  # the first price polls and passes
            figures_after(client, max(3, opts.repeat // 6))
            measure(client, opts.repeat, sample)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=10)
        log.close()


def fill(store_url: str, count: int) -> str:
    """``count`` jobs straight into the store; returns the id of one ended job."""
    store = open_store(store_url)
    ended = spec_to_json(job_spec("train"))
    waiting = spec_to_json(job_spec("waiting", max_price=0.0001))
    start = EPOCH - timedelta(days=30)
    step = timedelta(days=30) / count
    sample = ""
    try:
        for chunk in _chunks(range(count), 2000):
            rows: dict[str, list[dict[str, object]]] = {"jobs": [], "events": [],
                                                        "attempts": [], "ledger": []}
            for i in chunk:
                job_id = new_job_id()
                at = start + step * i
                pending = i >= count - PENDING
                rows["jobs"].append({
                    "id": job_id, "name": f"{'waiting' if pending else 'train'}-{i}",
                    "spec_json": waiting if pending else ended,
                    "status": "pending" if pending else "succeeded", "failure": None,
                    "submitted_at": at, "updated_at": at + timedelta(hours=3), "version": 5,
                })  # fmt: skip
                rows["events"].append({
                    "job_id": job_id, "at": at, "from_status": None, "to_status": "pending",
                    "cause": "submitted", "detail": "",
                })  # fmt: skip
                if not pending:
                    _attempts(rows, job_id, at)
                    sample = sample or job_id
            with store.engine.begin() as conn:
                for table, name in ((JOBS, "jobs"), (EVENTS, "events"), (ATTEMPTS, "attempts"),
                                    (LEDGER, "ledger")):  # fmt: skip
                    if rows[name]:
                        conn.execute(insert(table), rows[name])
    finally:
        store.close()
    return sample


def _attempts(rows: dict[str, list[dict[str, object]]], job_id: str, at: datetime) -> None:
    """A preempted attempt then one that succeeded, each with its ledger line."""
    for seq, (hours, end) in enumerate(((1.0, "preempted"), (2.0, "succeeded")), start=1):
        began = at + timedelta(hours=1.2 * (seq - 1))
        ended = began + timedelta(hours=hours)
        rows["attempts"].append({
            **POOL, "job_id": job_id, "seq": seq, "market": "spot", "nodes": 1,
            "price_per_node_hour": 12.0, "client_token": f"{job_id}-a{seq}",
            "instance_ids": f'["i-{job_id}-{seq}"]', "started_at": began,
            "running_at": began + timedelta(minutes=5), "ended_at": ended, "end_reason": end,
        })  # fmt: skip
        rows["ledger"].append({
            **POOL, "job_id": job_id, "attempt": seq, "gpu": "A100", "gpus": 8, "nodes": 1,
            "fabric": "efa", "market": "spot", "kind": "compute", "start": began, "end": ended,
            "billed_seconds": hours * 3600, "usd": 12.0 * hours, "on_demand_usd": 32.8 * hours,
            "job_status": "succeeded",
        })  # fmt: skip


def _chunks(items: range, size: int) -> Iterator[range]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def wait_healthy(address: Path, daemon: subprocess.Popen[bytes], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited ({daemon.returncode}); see its log")
        try:
            info = json.loads(address.read_text())
            base = f"http://{info['host']}:{info['port']}"
            if httpx.get(f"{base}/v1/health", timeout=2).status_code == 200:
                return base
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"the daemon did not answer within {timeout:.0f} s")


def login(client: httpx.Client, token: str) -> str:
    """The session cookie, from the login form as a browser posts it."""
    form = client.get("/dashboard/login")
    field = re.search(r'name="form_token" value="([^"]+)"', form.text)
    assert field is not None
    done = client.post(
        "/dashboard/login", data={"token": token, "form_token": field.group(1)},
        headers={"Origin": str(client.base_url).rstrip("/"),
                 "Cookie": f"spotd_login={field.group(1)}"},
    )  # fmt: skip
    found = re.search(r"spotd_session=([^;]+)", done.headers.get("set-cookie", ""))
    if done.status_code != 303 or found is None:
        raise SystemExit(f"login failed: {done.status_code} {done.text[:200]}")
    return found.group(1)


def measure(client: httpx.Client, repeat: int, job: str) -> None:
    """Every route ``repeat`` times; one line each: p50, p99, the slowest, the goal."""
    deep = _cursor_of_page(client, 100)
    pool = "&".join(f"{k}={v}" for k, v in POOL.items())
    routes: list[tuple[str, Callable[[int], str]]] = [
        ("jobs, first page", lambda _: "/dashboard/jobs"),
        ("jobs, page 100 (keyset)", lambda _: f"/dashboard/jobs?cursor={deep}"),
        ("jobs, status active", lambda _: "/dashboard/jobs?status=active"),
        ("jobs, name filter", lambda _: "/dashboard/jobs?name=train-9999"),
        ("jobs, name matching none", lambda _: "/dashboard/jobs?name=no-such-name"),
        ("jobs fragment (polled)", lambda _: "/dashboard/fragments/jobs"),
        ("a job", lambda _: f"/dashboard/jobs/{job}"),
        ("a job's fragment (polled)", lambda _: f"/dashboard/fragments/jobs/{job}"),
        ("a job's timeline (SVG)", lambda _: f"/dashboard/jobs/{job}/timeline.svg"),
        ("cost, last 7 days (kept)", lambda _: "/dashboard/cost"),
        ("cost chart, last 7 days (kept)", lambda _: "/dashboard/cost/daily.png"),
        ("market", lambda _: "/dashboard/market"),
        ("market fragment (polled)", lambda _: "/dashboard/fragments/market"),
        ("a pool's price history (SVG)", lambda _: f"/dashboard/market/history.svg?{pool}"),
        # Last: each starts a build behind the answer, which the routes after would share
        # the two cores with.
        ("cost, a new 7-day window", lambda n: f"/dashboard/cost?{_window(7, n)}"),
        ("cost, a new 30-day window", lambda n: f"/dashboard/cost?{_window(30, n)}"),
    ]
    print(f"{'route':<32} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  under {GOAL_MS:.0f} ms")
    for label, path in routes:
        client.get(path(-1))  # once untimed: a kept report is built, matplotlib loaded
        times = []
        for n in range(repeat):
            start = time.perf_counter()
            reply = client.get(path(n))
            times.append((time.perf_counter() - start) * 1000)
            if reply.status_code != 200:
                raise SystemExit(f"{path(n)}: {reply.status_code} {reply.text[:200]}")
        p99 = percentile(times, 0.99)
        verdict = "yes" if p99 < GOAL_MS else "NO"
        p50 = statistics.median(times)
        print(f"{label:<32} {p50:8.0f} {p99:8.0f} {max(times):8.0f}  {verdict}")


def figures_after(client: httpx.Client, repeat: int) -> None:
    """How long a new window's figures take to show: the page, then its fragment asked
    for every 0.1 s (the page's script asks every 2 s) until the report is in it."""
    for days in (7, 30):
        waits = []
        for n in range(repeat):
            query = _window(days, 1000 + n)
            start = time.perf_counter()
            client.get(f"/dashboard/cost?{query}")
            while 'id="spend"' not in client.get(f"/dashboard/fragments/cost?{query}").text:
                time.sleep(0.1)
            waits.append(time.perf_counter() - start)
        print(f"cost, a new {days}-day window: figures shown after "
              f"{statistics.median(waits):.2f} s (p50 of {repeat}), {max(waits):.2f} s at most")


def _window(days: int, n: int) -> str:
    """A window of ``days`` ending at the epoch, moved by ``n`` minutes: a new cache key."""
    until = EPOCH - timedelta(minutes=n)
    since = until - timedelta(days=days)
    return f"since={since:%Y-%m-%dT%H:%M}&until={until:%Y-%m-%dT%H:%M}"


def _cursor_of_page(client: httpx.Client, page: int) -> str:
    """The cursor of jobs page ``page``, followed from the first as a reader would."""
    cursor = ""
    for _ in range(page - 1):
        html = client.get(f"/dashboard/fragments/jobs?cursor={cursor}").text
        found = re.search(r'cursor=([^"&]+)" id="next-page"', html)
        if found is None:
            break
        cursor = found.group(1)
    return cursor


if __name__ == "__main__":
    main()
