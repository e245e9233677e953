"""A job in a locally built image, through a real container engine (podman).

The image is built here from nothing but a shell and a few coreutils copied
from this machine (no registry is reachable). The test runs the real agent
as a process: it unpacks the job's shipped code, starts the job in the image
through podman, and relays a SIGTERM to the job inside the container, as a
preemption notice does. Skipped, with the reason, where podman cannot run
containers (the test command installs it where it can: see the Makefile).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotd.ship.pack import pack_folder
from spotd.ship.store import upload

TOOLS = ("/bin/sh", "/bin/cat", "/usr/bin/env", "/bin/sleep")
# This sandbox may neither raise rlimits nor run crun on hybrid cgroups; runc and
# ulimits at the current values work. A real node needs none of this.
CONF = """[containers]
default_ulimits = ["nofile=1024:{nofile}", "nproc={nproc}:{nproc}"]
[engine]
{runtime}
"""


def _engine_env(tmp: Path) -> dict[str, str]:
    import resource

    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(4096, resource.getrlimit(resource.RLIMIT_NPROC)[0])
    runtime = 'runtime = "runc"' if shutil.which("runc") else ""
    conf = tmp / "containers.conf"
    conf.write_text(CONF.format(nofile=nofile, nproc=nproc, runtime=runtime))
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def _rootfs(root: Path) -> None:
    """A shell, cat, env and sleep with the libraries they link: the whole image."""
    for tool in TOOLS:
        real = Path(os.path.realpath(tool))
        libs = subprocess.run(["ldd", str(real)], capture_output=True, text=True, check=True).stdout
        for path in [str(real), *(w for w in libs.split() if w.startswith("/"))]:
            dest = root / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        link = root / tool.lstrip("/")
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(real)
    for folder in ("tmp", "proc", "dev", "sys", "etc", "workdir"):
        (root / folder).mkdir(exist_ok=True)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    if shutil.which("podman") is None:
        pytest.skip("no podman on this machine (the Makefile's test target installs it)")
    tmp = tmp_path_factory.mktemp("image")
    env = _engine_env(tmp)
    context = tmp / "context"
    _rootfs(context / "rootfs")
    (context / "Containerfile").write_text('FROM scratch\nCOPY rootfs/ /\nCMD ["/bin/sh"]\n')
    tag = f"localhost/spotd-test-job:{uuid.uuid4().hex[:8]}"
    built = subprocess.run(["podman", "build", "-q", "-t", tag, str(context)], env=env,
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    if built.returncode != 0:
        pytest.skip(f"podman cannot build here: {built.stderr.strip()[-300:]}")
    probe = subprocess.run(
        ["podman", "run", "--rm", "--network=host", tag, "/bin/sh", "-c", "echo ok"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if probe.stdout.strip() != "ok":
        pytest.skip(f"podman cannot run containers here: {probe.stderr.strip()[-300:]}")
    yield tag, env
    removing = ["podman", "rmi", "-f", tag]
    subprocess.run(removing, env=env, capture_output=True, timeout=60, check=False)


JOB = (
    "cat /workdir/data.txt > $OUT/seen.txt; env > $OUT/env.txt; "
    "trap 'echo checkpointed > $OUT/term.txt; exit 0' TERM; "
    "echo up > $OUT/started.txt; while :; do sleep 0.1; done"
)


def test_a_job_runs_in_its_image_and_hears_the_notice(
    image: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    tag, engine_env = image
    laptop = tmp_path / "laptop"
    laptop.mkdir()
    (laptop / "data.txt").write_text("shipped data\n")
    ref, _ = upload(pack_folder(laptop), f"file://{tmp_path / 'storage'}")
    out = tmp_path / "ckpt"
    out.mkdir()
    env = {
        **engine_env,
        "SPOTD_AGENT_PROVIDER": "none", "SPOTD_AGENT_JOB_ID": "j-box",
        "SPOTD_AGENT_ATTEMPT": "1", "SPOTD_AGENT_RUN_DIR": str(tmp_path / "run"),
        "SPOTD_IMAGE": tag, "SPOTD_CONTAINER_ENGINE": "podman",
        "SPOTD_CONTAINER_MOUNTS": str(out), "SPOTD_CONTAINER_DEVICES": "",
        "SPOTD_CODE_URI": ref.uri, "SPOTD_CODE_SHA256": ref.sha256,
        "OUT": str(out), "NCCL_DEBUG": "WARN", "SPOTD_JOB_ID": "j-box",
    }  # fmt: skip
    agent = subprocess.Popen([sys.executable, "-m", "spotd.agent", "--", "/bin/sh", "-c", JOB],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        limit = time.monotonic() + 90
        while not (out / "started.txt").exists():
            assert agent.poll() is None, agent.communicate()[0].decode()[-2000:]
            assert time.monotonic() < limit, "the job never started in its container"
            time.sleep(0.1)
        agent.send_signal(signal.SIGTERM)  # what a preemption notice makes the agent send
        code = agent.wait(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    log = agent.communicate()[0].decode()
    assert code == 0, log[-2000:]
    # SIGTERM reached the job (its trap wrote the file); else the agent's log says why.
    assert (out / "term.txt").exists(), log[-2000:]
    assert (out / "term.txt").read_text() == "checkpointed\n"
    assert (out / "seen.txt").read_text() == "shipped data\n", "the shipped code at /workdir"
    seen = dict(line.split("=", 1) for line in (out / "env.txt").read_text().splitlines()
                if "=" in line)  # fmt: skip
    assert seen["NCCL_DEBUG"] == "WARN" and seen["SPOTD_JOB_ID"] == "j-box"
    assert seen.get("PATH") != os.environ["PATH"], "the host's PATH stays out"
    assert "SPOTD_AGENT_RUN_DIR" not in seen
