"""Boot scripts: valid bash, hostile values round-trip, only the agent token inside.

The scripts are run for real under bash, in a temporary folder: the install line
is ``true``, the interpreter is a stub that records its argv, environment and
folder, and ``systemd-run`` is a stub too, so nothing is installed or started.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gang_support import FABRIC_MARKS, assert_gang_env, gang_request, script_env

from spotd.core.agent_wire import agent_token
from spotd.core.network import Fabric, Interconnect
from spotd.core.values import LaunchRequest, Market, Offering, Pool
from spotd.daemon.bootstrap import BootKind, bootstrap_for, render_bootstrap

KINDS: list[BootKind] = ["aws", "gcp", "azure"]
DAEMON_TOKEN = "the-daemon-token-never-on-a-vm"
CLIENT_TOKEN = "attempt-client-token-42"
HOSTILE = (
    "it's'; rm -rf / ; echo \"$(touch pwned)\" `touch pwned2` \\ $HOME ${PATH} !! * ~\n"
    "SPOTD_ENV_EOF\nEOF\n'\"'\"' %s %n \t end"
)
HOSTILE_ARG = "--name=$(touch pwned3); 'x' \"y\" *"


def request(env: dict[str, str] | None = None, workdir: str | None = None) -> LaunchRequest:
    pool = Pool("aws", "us-east-1", "us-east-1a", "g5.xlarge")
    offering = Offering(pool, "A10G", 1, 24, Interconnect(Fabric.ETHERNET, 25), 0.5, 1.0)
    return LaunchRequest(
        offering=offering,
        market=Market.SPOT,
        nodes=1,
        client_token=CLIENT_TOKEN,
        tags={"spotd-job": "job-7", "spotd-attempt": "3"},
        command=("python", "train.py", HOSTILE_ARG),
        env={"HOSTILE": HOSTILE, "PLAIN": "x", "EMPTY": "", **(env or {})},
        workdir=workdir,
    )


def section(script: str, name: str) -> str:
    match = re.search(rf"^# >>> spotd {name}\n(.*?)^# <<< spotd {name}$", script,
                      re.MULTILINE | re.DOTALL)
    assert match, f"no {name} section"
    return match.group(1)


def stub_python(folder: Path) -> Path:
    """An interpreter stand-in that writes argv, env and cwd to ``out.json`` beside it."""
    stub = folder / "python-stub"
    stub.write_text(
        f"#!{sys.executable}\n"
        "import json, os, pathlib, sys\n"
        f"out = pathlib.Path({str(folder / 'out.json')!r})\n"
        "out.write_text(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ),"
        " 'cwd': os.getcwd()}))\n"
    )
    stub.chmod(0o755)
    return stub


def run(argv: list[str], cwd: Path | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False,
                          env=env if env is not None else dict(os.environ), timeout=30)


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run(["bash", "-c", script], cwd=cwd)


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is left in process group ``pgid``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue  # ended meanwhile
        if state != "Z" and int(group) == pgid:
            return True
    return False


def run_to_the_end(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run ``argv`` in a process group of its own until it and every process it started
    in the background (a boot script's agent, under nohup) have ended; its exit code and
    stderr. The wait for the background ones is a poll, with a generous safety net."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    _, err = proc.communicate(timeout=30)
    limit = time.monotonic() + 60
    while group_alive(proc.pid):  # the session leader's pid is the group's id
        assert time.monotonic() < limit, "a process the script started is still running"
        time.sleep(0.02)
    return proc.returncode, err


@pytest.mark.parametrize("kind", KINDS)
def test_script_is_valid_bash(kind: BootKind, tmp_path: Path) -> None:
    script = bootstrap_for(kind, daemon_url="https://d:8443", daemon_token=DAEMON_TOKEN,
                           install="pip install 'spotd==0.1.0'")(request())
    path = tmp_path / "boot.sh"
    path.write_text(script)
    checked = run(["bash", "-n", str(path)])
    assert checked.returncode == 0, checked.stderr
    assert script.startswith("#!/bin/bash\n")
    assert "pip install 'spotd==0.1.0'" in script


@pytest.mark.parametrize("kind", KINDS)
def test_agent_token_in_daemon_token_never(kind: BootKind) -> None:
    script = bootstrap_for(kind, daemon_url="https://d:8443", daemon_token=DAEMON_TOKEN)(
        request()
    )
    assert agent_token(DAEMON_TOKEN, CLIENT_TOKEN) in script
    assert DAEMON_TOKEN not in script


def test_refuses_a_job_env_that_leaks_the_daemon_token() -> None:
    render = bootstrap_for("aws", daemon_url="https://d", daemon_token=DAEMON_TOKEN)
    with pytest.raises(ValueError, match="daemon's token"):
        render(request({"OOPS": f"x{DAEMON_TOKEN}"}))


@pytest.mark.parametrize("kind", KINDS)
def test_env_and_launcher_round_trip_hostile_values(kind: BootKind, tmp_path: Path) -> None:
    token = agent_token(DAEMON_TOKEN, CLIENT_TOKEN)
    workdir = tmp_path / "work dir; $(x)"
    workdir.mkdir()
    stub = stub_python(tmp_path)
    script = render_bootstrap(kind, request(workdir=str(workdir)), daemon_url="https://d:8443",
                              agent_token=token, python=str(stub))
    boot = tmp_path / "boot"
    prelude = (
        "set -euo pipefail\numask 077\n"
        f"SPOTD_BOOT_DIR={boot}\nmkdir -p \"$SPOTD_BOOT_DIR\"\n"
        'SPOTD_ENV_FILE="$SPOTD_BOOT_DIR/agent.env"\n'
        'SPOTD_LAUNCHER="$SPOTD_BOOT_DIR/launch.sh"\n'
    )
    done = bash(prelude + section(script, "env") + section(script, "launcher"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    env_file = boot / "agent.env"
    assert env_file.stat().st_mode & 0o777 == 0o600

    read_back = bash(f'set -a; . {env_file}; printf %s "$HOSTILE"', cwd=tmp_path)
    assert read_back.returncode == 0, read_back.stderr
    assert read_back.stdout == HOSTILE

    launched = run([str(boot / "launch.sh")], cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["argv"] == ["-m", "spotd.agent", "--", "python", "train.py", HOSTILE_ARG]
    assert out["cwd"] == str(workdir)
    env = out["env"]
    assert (env["HOSTILE"], env["PLAIN"], env["EMPTY"]) == (HOSTILE, "x", "")
    assert env["SPOTD_AGENT_TOKEN"] == token
    assert env["SPOTD_AGENT_PROVIDER"] == kind
    assert (env["SPOTD_AGENT_JOB_ID"], env["SPOTD_AGENT_ATTEMPT"]) == ("job-7", "3")
    assert env["SPOTD_AGENT_DAEMON_URL"] == "https://d:8443"
    assert env["SPOTD_AGENT_METADATA_URL"].startswith("http://")
    assert not list(tmp_path.glob("pwned*")) and not list(workdir.glob("pwned*"))


def test_whole_script_runs_once_with_stubs(tmp_path: Path) -> None:
    stub = stub_python(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("mkdir", "chmod", "touch", "nohup", "true"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    # Whichever way the script starts the agent, the launcher runs, synchronously here.
    (bin_dir / "systemd-run").write_text('#!/bin/bash\nexec "${@: -1}"\n')
    (bin_dir / "systemd-run").chmod(0o755)
    script = render_bootstrap("gcp", request(), daemon_url="https://d", agent_token="tok",
                              install="true", python=str(stub))
    (tmp_path / "boot.sh").write_text(script)
    env = {"PATH": str(bin_dir), "SPOTD_BOOT_DIR": str(tmp_path / "boot"),
           "SPOTD_LOG": str(tmp_path / "agent.log")}

    # Each run is waited for to its end, the agent it started in the background included.
    code, err = run_to_the_end(["/bin/bash", str(tmp_path / "boot.sh")], tmp_path, env)
    assert code == 0, err
    out = tmp_path / "out.json"
    assert json.loads(out.read_text())["env"]["HOSTILE"] == HOSTILE
    assert (tmp_path / "boot" / "started").exists()

    out.unlink()
    code, err = run_to_the_end(["/bin/bash", str(tmp_path / "boot.sh")], tmp_path, env)
    assert code == 0
    assert "earlier boot" in err
    assert not out.exists(), "the agent was started again"


def test_bad_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="shell identifier"):
        render_bootstrap("aws", request({"BAD-NAME": "x"}), daemon_url="d", agent_token="t")
    no_tags = request()
    object.__setattr__(no_tags, "tags", {})
    with pytest.raises(ValueError, match="spotd-job"):
        render_bootstrap("aws", no_tags, daemon_url="d", agent_token="t")
    with pytest.raises(ValueError, match="limit"):
        render_bootstrap("aws", request({"BIG": "x" * 20_000}), daemon_url="d", agent_token="t")
    with pytest.raises(ValueError, match="empty daemon token"):
        bootstrap_for("aws", daemon_url="d", daemon_token="")


def test_tag_names_match_the_engine() -> None:
    from spotd.agent import config as agent_config
    from spotd.engine import settings as engine

    assert (agent_config.TAG_JOB, agent_config.TAG_ATTEMPT) == (engine.TAG_JOB, engine.TAG_ATTEMPT)


# -- multi-node: what every node of a gang is told before it boots -------------


def catalog_offering(kind: BootKind, instance_type: str) -> Offering:
    from spotd.market.catalog import catalog

    facts = catalog()[kind][instance_type]
    return Offering(Pool(kind, "r", "r-a", instance_type), facts.gpu, facts.gpus_per_node,
                    facts.gpu_memory_gb, facts.interconnect, 10.0, 30.0)  # fmt: skip


def gang_types() -> list[tuple[BootKind, str]]:
    from spotd.market.catalog import catalog

    kinds: list[BootKind] = ["aws", "gcp", "azure"]
    return [(kind, t) for kind in kinds for t in catalog()[kind]]


@pytest.mark.parametrize(("kind", "instance_type"), gang_types())
def test_every_gang_boot_script_carries_rendezvous_and_fabric_variables(
    kind: BootKind, instance_type: str
) -> None:
    offering = catalog_offering(kind, instance_type)
    req = gang_request(offering)
    script = bootstrap_for(kind, daemon_url="https://d:8443", daemon_token=DAEMON_TOKEN)(req)
    env = script_env(script)
    # Rendezvous: the daemon to join, the gang's size and id; the rank and master come
    # from the daemon's roster once every node joined.
    assert env["SPOTD_AGENT_DAEMON_URL"] == "https://d:8443"
    assert env["PET_RDZV_ID"] == "j-gang-a3"
    assert env["SPOTD_EXPECT_GPUS"] == str(offering.gpus_per_node)
    assert_gang_env(env, offering.interconnect.fabric)
    if offering.interconnect.fabric is not Fabric.ETHERNET:
        assert float(env["SPOTD_PREFLIGHT_MIN_BUSBW_GBPS"]) > 0


def test_every_fabric_kind_appears_among_the_clouds_types() -> None:
    from spotd.market.catalog import catalog

    seen = {f.interconnect.fabric for kind in catalog().values() for f in kind.values()}
    assert seen == set(FABRIC_MARKS)


# -- a job in a container image ---------------------------------------------------------

IMAGE_FABRICS = {"aws": ("p5.48xlarge", Fabric.EFA), "gcp": ("a3-megagpu-8g", Fabric.TCPXO),
                 "azure": ("Standard_ND96isr_H100_v5", Fabric.INFINIBAND)}  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_an_image_jobs_boot_script_pulls_it_and_names_devices_and_mounts(
    kind: BootKind, tmp_path: Path
) -> None:
    """No container engine runs on these machines: the rendered scripts are checked, and
    the agent's container command is checked with a stand-in engine (test_agent_node.py)."""
    from spotd.core.spec import JobSpec
    from spotd.engine.shipping import shipping_environment

    itype, fabric = IMAGE_FABRICS[kind]
    offering = Offering(Pool(kind, "r1", "r1-a", itype), "H100", 8, 80,
                        Interconnect(fabric, 400), 30.0, 90.0)  # fmt: skip
    spec = JobSpec.model_validate({
        "name": "boxed", "command": ["torchrun", "train.py"],
        "image": "nvcr.io/nvidia/pytorch:24.05-py3", "setup": ["pip install -e ."],
        "resources": {"gpus": ["H100"], "gpus_per_node": 8},
    })  # fmt: skip
    env = shipping_environment(spec, offering, "/mnt/ckpt/boxed")
    req = LaunchRequest(offering=offering, market=Market.SPOT, nodes=1, client_token=CLIENT_TOKEN,
                        tags={"spotd-job": "job-7", "spotd-attempt": "3"},
                        command=spec.command, env=env)  # fmt: skip
    script = render_bootstrap(kind, req, daemon_url="https://d:8470", agent_token="a" * 64,
                              registry_login="true  # login stand-in")  # fmt: skip
    pulled = section(script, "image")
    assert "true  # login stand-in" in pulled
    assert '"$SPOTD_ENGINE" pull nvcr.io/nvidia/pytorch:24.05-py3' in pulled
    envs = section(script, "env")
    assert "SPOTD_IMAGE=nvcr.io/nvidia/pytorch:24.05-py3" in envs
    if fabric in (Fabric.EFA, Fabric.INFINIBAND):
        assert "export SPOTD_CONTAINER_DEVICES=/dev/infiniband" in envs
    else:  # GPUDirect-TCPXO needs the host's network, no verbs devices
        assert "SPOTD_CONTAINER_DEVICES" in envs and "/dev/infiniband" not in envs
    assert "export SPOTD_CONTAINER_MOUNTS=/mnt/ckpt/boxed" in envs
    assert "SPOTD_SETUP=" in envs and "pip install -e ." in envs
    assert bash(f"bash -n <<'EOS'\n{script}\nEOS", tmp_path).returncode == 0
