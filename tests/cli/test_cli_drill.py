"""``spotd drill`` as a command, against the real API on loopback: what it asks, what it
prints, and the exit codes of a refusal (1) and of a node the job lacks (2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from engine_support import FakeProvider, spec
from loopback_support import serve
from typer.testing import CliRunner

from spotd.cli.app import app
from spotd.core.exit_codes import ExitCode
from spotd.core.states import JobStatus
from spotd.daemon.api import create_app
from spotd.daemon.wiring import build_reader
from spotd.engine.reconcile import Engine
from spotd.engine.settings import EngineSettings
from spotd.store import open_store
from spotd_policies.cheapest import CheapestPolicy
from spotd_sim import SimClock

TOKEN = "c" * 32


@dataclass
class DrillTaker(FakeProvider):
    """A scripted provider that takes drills and records them."""

    drilled: list[str] = field(default_factory=list)

    def drill(self, instance_id: str) -> None:
        self.drilled.append(instance_id)


@dataclass
class Served:
    engine: Engine
    provider: DrillTaker
    config: Path

    def run(self, *args: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, [*args, "--config", str(self.config)],
                                    env={"COLUMNS": "300"})  # fmt: skip
        return result.exit_code, result.output


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    store = open_store(f"sqlite:///{tmp_path / 'cli.db'}")
    provider = DrillTaker()
    engine = Engine(store, {"fake": provider}, CheapestPolicy(), SimClock(tmp_path / "c", 3600.0),
                    EngineSettings(owner="test", checkpoints_dir=tmp_path / "ck"))  # fmt: skip
    data = tmp_path / "data"
    data.mkdir()
    (data / "token").write_text(TOKEN)
    with serve(create_app(build_reader(engine), TOKEN)) as url:
        port = url.rsplit(":", 1)[1]
        config = tmp_path / "spotd.toml"
        config.write_text(f'data_dir = "{data}"\n[daemon]\nhost = "127.0.0.1"\nport = {port}\n')
        yield Served(engine, provider, config)
    store.close()


def _running(engine: Engine) -> str:
    job = engine.submit(spec())
    for _ in range(5):
        engine.tick()
    assert engine.store.get_job(job.id).status is JobStatus.RUNNING
    return job.id


def test_drill_asks_the_daemon_and_says_what_follows(served: Served) -> None:
    job_id = _running(served.engine)
    code, said = served.run("drill", job_id, "--node", "0")
    assert code == ExitCode.OK, said
    assert said.startswith(f"{job_id}: drill of node 0 asked")
    assert f"spotd events {job_id} --config" in said
    (intent,) = served.engine.store.open_intents([job_id])[job_id]
    assert intent.node == 0
    served.engine.tick()
    assert served.provider.drilled == list(served.engine.store.attempts(job_id)[-1].instance_ids)
    code, out = served.run("events", job_id, "--json")
    (drill,) = [e for e in json.loads(out) if e["cause"] == "drill"]
    assert drill["facts"]["rank"] == 0  # the rank it was asked by, even of one node
    assert drill["facts"]["node"] == served.provider.drilled[0]


def test_a_refused_drill_exits_1_and_a_node_it_lacks_exits_2(served: Served) -> None:
    pending = served.engine.submit(spec())
    code, said = served.run("drill", pending.id)
    assert code == ExitCode.FAILED, said
    assert "only a running job can be drilled" in said
    job_id = _running(served.engine)
    code, said = served.run("drill", job_id, "--node", "3")
    assert code == ExitCode.BAD_INPUT, said
    assert "there is no node 3" in said


def test_drill_is_registered_with_its_help() -> None:
    result = CliRunner().invoke(app, ["drill", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "checkpoint and resume" in result.stdout and "--node" in result.stdout
