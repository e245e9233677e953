"""``spotd logs`` reads what the nodes' agents shipped, the same on every provider.

A job's attempt runs on AWS (the real adapter on moto, whose ``logs`` has nothing:
EC2 keeps no job output): two real agents, of the ``aws`` kind against the loopback
metadata fake, ship their nodes' output to the daemon's real app on a loopback
server, and the real CLI reads it back, whole, by attempt and node, and as it comes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from engine_support import spec
from fakes.aws_fake import FakeAws, aws_env, moto_placement_groups, new_session
from fakes.metadata_fake import MetadataFake
from loopback_support import serve
from moto import mock_aws
from pydantic import SecretStr
from typer.testing import CliRunner

from spotd.agent import AgentConfig, run_agent
from spotd.cli.app import app as cli
from spotd.cli.client import Client
from spotd.cli.follow import follow_logs
from spotd.core.agent_wire import MAX_LOG_CHUNK, LogChunk, agent_token
from spotd.core.states import EventCause, JobStatus, Transition
from spotd.core.values import AttemptClose, AttemptEnd, Market, NewAttempt, Pool
from spotd.daemon.api import create_app
from spotd.daemon.config import AgentSettings
from spotd.daemon.logview import LogSource, decode_cursor, encode_cursor
from spotd.daemon.wiring import build_reader
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd.store.joblogs import DEFAULT_KEEP_BYTES, MIN_KEEP_BYTES, JobLogRows
from spotd_aws import AwsProvider, AwsSettings
from spotd_policies.cheapest import CheapestPolicy
from spotd_sim import SimClock

TOKEN = "d" * 32
POOL = Pool("aws", "us-east-1", "us-east-1a", "g5.xlarge")
NODES = ("i-0aaaaaaaaaaaaaaa1", "i-0bbbbbbbbbbbbbbb2")
JOB = "import os; print('hello from rank', os.environ['RANK'], flush=True)"


@dataclass
class Daemon:
    engine: Engine
    provider: AwsProvider
    url: str
    config: Path


@pytest.fixture
def daemon(tmp_path: Path, sqlite_url: str) -> Iterator[Daemon]:
    """The daemon's app over a store and the AWS adapter (on moto), on a loopback port,
    and a config file the CLI finds it by."""
    with aws_env(tmp_path), mock_aws(), moto_placement_groups():
        session = new_session()
        FakeAws().install(session)
        provider = AwsProvider(
            AwsSettings(enabled=True, regions=["us-east-1"], instance_types=["g5.xlarge"],
                        image_id={"us-east-1": FakeAws.ami("us-east-1")}),
            user_data=lambda request: "#!/bin/sh\n", session=session,
        )  # fmt: skip
        store = open_store(sqlite_url)
        engine = Engine(store, {"aws": provider}, CheapestPolicy(),
                        SimClock(tmp_path / "clock", 1.0),
                        EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"))  # fmt: skip
        try:
            with serve(create_app(build_reader(engine), TOKEN)) as url:
                (tmp_path / "token").write_text(TOKEN)
                port = int(url.rsplit(":", 1)[1])
                (tmp_path / "daemon.json").write_text(
                    json.dumps({"host": "127.0.0.1", "port": port, "pid": os.getpid()})
                )
                config = tmp_path / "spotd.toml"
                config.write_text(f"data_dir = {json.dumps(str(tmp_path))}\n")
                yield Daemon(engine, provider, url, config)
        finally:
            store.close()


def launch_on_aws(engine: Engine) -> tuple[str, str]:
    """A job whose first attempt runs two nodes on AWS: its id and the attempt's token."""
    store, now = engine.store, engine.clock.now()
    job = store.create_job(spec(), now=now)
    placed = NewAttempt(pool=POOL, market=Market.SPOT, nodes=2, price_per_node_hour=1.0,
                        resume_from=None)  # fmt: skip
    placing = Transition(job.id, JobStatus.PENDING, JobStatus.PROVISIONING,
                         cause=EventCause.PLACED, open_attempt=placed)  # fmt: skip
    store.compare_and_set(placing, now=now)
    (attempt,) = store.attempts(job.id)
    store.set_attempt_instances(attempt.id, NODES)
    return job.id, agent_token(TOKEN, attempt.client_token)


def run_node(daemon: Daemon, metadata: MetadataFake, job_id: str, token: str, rank: int) -> int:
    """One node's agent, of the ``aws`` kind, to the job's end."""
    config = AgentConfig.model_validate({
        "provider": "aws", "metadata_url": metadata.url, "daemon_url": daemon.url,
        "token": SecretStr(token), "job_id": job_id, "attempt": 1,
        "instance_id": NODES[rank], "provider_name": "aws", "poll_seconds": 0.1,
        "heartbeat_seconds": 0.2, "log_seconds": 0.05,
        "command": (sys.executable, "-c", JOB),
        "job_env": {**os.environ, "RANK": str(rank)},
    })  # fmt: skip
    return run_agent(config)


def logs(daemon: Daemon, *args: str) -> tuple[int, str, str]:
    shown = CliRunner().invoke(cli, ["logs", *args, "-c", str(daemon.config)],
                               terminal_width=200)  # fmt: skip
    return shown.exit_code, shown.stdout, shown.stderr


def test_spotd_logs_shows_what_the_agents_on_aws_nodes_shipped(daemon: Daemon) -> None:
    job_id, token = launch_on_aws(daemon.engine)
    assert daemon.provider.logs(NODES[0]) == "", "EC2 itself keeps no output"
    with MetadataFake() as metadata:
        codes: list[int] = []
        nodes = [threading.Thread(target=lambda r=rank: codes.append(
            run_node(daemon, metadata, job_id, token, r))) for rank in (0, 1)]  # fmt: skip
        for node in nodes:
            node.start()
        for node in nodes:
            node.join(timeout=60)
    assert codes == [0, 0]
    code, out, _ = logs(daemon, job_id)
    assert code == 0, out
    header = f"attempt 1 {POOL} "
    assert f"{header}{NODES[0]}" in out and f"{header}{NODES[1]}" in out
    assert out.index(NODES[0]) < out.index("hello from rank 0") < out.index(NODES[1])
    assert out.index(NODES[1]) < out.index("hello from rank 1")
    code, out, _ = logs(daemon, job_id, "--attempt", "1", "--node", "1")
    assert code == 0 and "hello from rank 1" in out and "rank 0" not in out
    code, out, err = logs(daemon, job_id, "--attempt", "2")
    assert code == 0 and out == ""
    assert "no node matches --attempt 2" in err


def test_follow_prints_each_nodes_new_output_once_until_the_job_ends(daemon: Daemon) -> None:
    job_id, token = launch_on_aws(daemon.engine)
    client = Client(daemon.url, TOKEN)
    shipped = {"i": 0}
    rows = daemon.engine.store

    def ship_more(seconds: float) -> None:
        """Between two polls: a node ships a line; after the third, the job ends."""
        del seconds
        shipped["i"] += 1
        body = LogChunk(job_id=job_id, attempt=1, instance_id=NODES[0], provider="aws",
                        at=daemon.engine.clock.now(), offset=7 * (shipped["i"] - 1),
                        data=f"line {shipped['i']}\n".encode())  # fmt: skip
        answer = httpx.post(f"{daemon.url}/v1/agent/log", content=body.model_dump_json(),
                            headers={"Authorization": f"Bearer {token}",
                                     "Content-Type": "application/json"})  # fmt: skip
        assert answer.status_code == 200, answer.text
        if shipped["i"] == 3:
            close = AttemptClose(rows.attempts(job_id)[0].id, AttemptEnd.SUCCEEDED)
            rows.compare_and_set(Transition(job_id, JobStatus.PROVISIONING, JobStatus.SUCCEEDED,
                                            cause=AttemptEnd.SUCCEEDED, close_attempt=close),
                                 now=daemon.engine.clock.now())  # fmt: skip

    written: list[tuple[str | None, str]] = []
    ended = follow_logs(client, job_id, lambda h, t: written.append((h, t)),
                        lambda h, n: written.append((h, f"gone {n}")), sleep=ship_more)  # fmt: skip
    assert ended.status == "succeeded"
    header = f"attempt 1 {POOL} {NODES[0]}"
    assert written == [(header, "line 1\n"), (None, "line 2\n"), (None, "line 3\n")]


def test_spotd_logs_says_how_much_of_a_nodes_output_is_no_longer_kept(daemon: Daemon) -> None:
    job_id, _ = launch_on_aws(daemon.engine)
    rows = JobLogRows(daemon.engine.store.engine, keep_bytes=MIN_KEEP_BYTES)
    block = MAX_LOG_CHUNK
    for n in range(3):
        rows.append(LogChunk(job_id=job_id, attempt=1, instance_id=NODES[0], provider="aws",
                             at=daemon.engine.clock.now(), offset=n * block,
                             data=(b"%d" % n) * (block - 1) + b"\n"))  # fmt: skip
    code, out, err = logs(daemon, job_id, "--node", "0")
    assert code == 0
    assert out.count("2" * 100) > 0 and "0" * 100 not in out and "1" * 100 not in out
    assert f"{2 * block:,} bytes of its output before this are no longer kept" in err


def test_the_daemon_keeps_what_its_config_says_by_default() -> None:
    assert AgentSettings().log_keep_bytes == DEFAULT_KEEP_BYTES


def test_a_cursor_is_opaque_and_one_the_daemon_did_not_make_is_a_422(daemon: Daemon) -> None:
    job_id, _ = launch_on_aws(daemon.engine)
    offsets = {(1, NODES[0], LogSource.AGENT): 12, (2, "i-x", LogSource.PROVIDER): 0}
    assert decode_cursor(encode_cursor(offsets)) == offsets
    for bad in ("!!", "e30", encode_cursor({})[:-1] + "x"):
        with pytest.raises(ValueError, match="not a log cursor"):
            decode_cursor(bad)
    answer = httpx.get(f"{daemon.url}/v1/jobs/{job_id}/logs", params={"after": "e30"},
                       headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert answer.status_code == 422 and answer.json()["field"] == "after"
