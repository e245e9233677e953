"""A job's working directory shipped from outside the checkout, through a preemption.

The engine and the simulated market in this process; the nodes are real
processes. The folder changes after the submit: the resumed attempt must still
run what was submitted, unpacked from the one archive uploaded (over fsspec
``file://`` and ``memory://``; the simulated nodes' "boot" unpacks it in the
daemon's process, where a memory filesystem is visible).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import fsspec
import pytest
from engine_support import fast_settings, run_until

from spotd.core.spec import JobSpec
from spotd.core.states import JobStatus
from spotd.core.values import AttemptEnd
from spotd.daemon.wiring import build_engine
from spotd.ship.store import storage_for
from spotd.ship.workdir import ship_workdir, with_default_workdir
from spotd_sim import SimProvider

TRAIN = """\
import hashlib, json, os, pathlib, time
here = pathlib.Path.cwd()
seen = {"cwd": str(here), "data": (here / "data.txt").read_text(),
        "digest": hashlib.sha256((here / "train.py").read_bytes()).hexdigest()}
out = pathlib.Path(os.environ["OUT"]) / ("attempt-" + os.environ["SPOTD_ATTEMPT"] + ".json")
out.write_text(json.dumps(seen))
if os.environ["SPOTD_ATTEMPT"] == "1":
    time.sleep(600)  # the first attempt is preempted while it runs
"""


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_both_attempts_run_the_content_that_was_submitted(tmp_path: Path, scheme: str) -> None:
    folder = Path(tmp_path / "laptop" / "project")  # outside the checkout
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(TRAIN)
    (folder / "data.txt").write_text("the submitted data\n")
    (folder / ".spotdignore").write_text("scratch/\n")
    (folder / "scratch").mkdir()
    (folder / "scratch" / "big.bin").write_bytes(b"x" * 1000)
    out = tmp_path / "out"
    out.mkdir()
    storage = (f"file://{tmp_path / 'storage'}" if scheme == "file"
               else f"memory://ship-{uuid.uuid4().hex}")  # fmt: skip
    spec = JobSpec.model_validate({
        "name": "shipped", "command": [sys.executable, "train.py"], "workdir": str(folder),
        "env": {"OUT": str(out)}, "resources": {"gpus": ["A100"], "gpus_per_node": 1},
    })  # fmt: skip
    settings = fast_settings(tmp_path / "daemon", up=1000.0)
    assert storage_for(spec, storage, settings.data_dir) == storage
    shipped = ship_workdir(spec, storage)
    assert shipped.uploaded and shipped.spec.code is not None
    engine = build_engine(settings)
    try:
        job = engine.submit(shipped.spec)
        run_until(engine, job.id, lambda _: (out / "attempt-1.json").exists(), timeout=60)
        # The folder changes on the laptop after the submit.
        (folder / "data.txt").write_text("edited later\n")
        (folder / "train.py").write_text(TRAIN + "# edited\n")
        assert not ship_workdir(shipped.spec, storage).uploaded, "same job: nothing uploaded"
        (first,) = engine.store.attempts(job.id)
        provider = engine.providers[first.pool.provider]
        assert isinstance(provider, SimProvider)
        provider.reclaim(first.instance_ids[0])
        done = run_until(engine, job.id, lambda j: j.status.terminal, timeout=90)
        assert done.status is JobStatus.SUCCEEDED
    finally:
        engine.store.close()
    attempts = engine.store.attempts(job.id)
    assert attempts[0].end_reason is AttemptEnd.PREEMPTED and len(attempts) == 2
    one, two = (json.loads((out / f"attempt-{n}.json").read_text()) for n in (1, 2))
    assert one["data"] == two["data"] == "the submitted data\n"
    assert one["digest"] == two["digest"]
    assert one["cwd"] != two["cwd"], "each node unpacks its own copy"
    assert not (Path(two["cwd"]) / "scratch").exists(), ".spotdignore left it out"
    fs, path = fsspec.core.url_to_fs(storage)
    stored = [p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]
    assert stored == [f"{shipped.spec.code.sha256}.tar.gz"], "uploaded once"


def test_a_spec_without_workdir_gets_its_job_files_folder_but_never_the_daemons(
    tmp_path: Path,
) -> None:
    bare = JobSpec.model_validate({
        "name": "bare", "command": ["python3", "train.py"],
        "resources": {"gpus": ["A100"], "gpus_per_node": 1},
    })  # fmt: skip
    daemon_dir = tmp_path / "spotd-data"
    project = tmp_path / "project"
    assert with_default_workdir(bare, project, daemon_dir=daemon_dir).workdir == str(project)
    # The daemon's own folder (the test harnesses keep their job files there) is state.
    inside = daemon_dir / "jobs"
    assert with_default_workdir(bare, inside, daemon_dir=daemon_dir) is bare
    named = bare.model_copy(update={"workdir": "/opt/train"})
    assert with_default_workdir(named, project, daemon_dir=daemon_dir) is named
