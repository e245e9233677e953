"""The node before the gang: code fetched, secrets asked for, setup run; and containers."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from spotd.agent.config import AgentConfig
from spotd.agent.container import job_argv, passed_names
from spotd.agent.node import EXIT_SETUP_FAILED, NodeFailed, NodeReady, prepare_node
from spotd.agent.reporter import ReportRejected
from spotd.agent.runner import run_agent
from spotd.core.agent_wire import ExitReport, Secrets, SecretsAsk
from spotd.ship.pack import pack_folder
from spotd.ship.store import upload


def shipped_env(tmp_path: Path, files: dict[str, str]) -> dict[str, str]:
    root = tmp_path / "laptop"
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    ref, _ = upload(pack_folder(root), f"file://{tmp_path / 'storage'}")
    return {"SPOTD_CODE_URI": ref.uri, "SPOTD_CODE_SHA256": ref.sha256, "PATH": os.environ["PATH"]}


def test_code_secrets_and_setup_in_that_order(tmp_path: Path) -> None:
    env = shipped_env(tmp_path, {"req.txt": "numpy\n"})
    env["SPOTD_SECRETS"] = "HF_TOKEN"
    env["SPOTD_SETUP"] = json.dumps(["cat req.txt > staged.txt", 'echo "$HF_TOKEN" > token.txt'])
    asked: list[str] = []

    def ask() -> Secrets:
        asked.append("once")
        return Secrets(values={"HF_TOKEN": "hf_secret_value"})

    ready = prepare_node(env, tmp_path / "run", ask)
    assert isinstance(ready, NodeReady) and ready.cwd == tmp_path / "run" / "code"
    assert (ready.cwd / "staged.txt").read_text() == "numpy\n", "setup ran in the code"
    assert (ready.cwd / "token.txt").read_text() == "hf_secret_value\n"
    assert ready.env["HF_TOKEN"] == "hf_secret_value" and asked == ["once"]
    assert "HF_TOKEN" not in env, "the caller's mapping is left as it was"


def test_a_failing_setup_says_which_line_with_its_output(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"],
           "SPOTD_SETUP": json.dumps(["echo first ok", "echo staging data; echo oops >&2; exit 3",
                                      "echo never runs > never.txt"])}  # fmt: skip
    failed = prepare_node(env, tmp_path / "run", None)
    assert isinstance(failed, NodeFailed) and failed.exit_code == 3
    assert "`echo staging data; echo oops >&2; exit 3` exited with 3" in failed.detail
    assert "staging data\noops" in failed.detail
    assert not (tmp_path / "never.txt").exists()


def test_missing_secrets_and_unreadable_code_fail_the_setup(tmp_path: Path) -> None:
    env = {"SPOTD_SECRETS": "A,B"}
    lacking = prepare_node(env, tmp_path, lambda: Secrets(values={"A": "1"}, missing=("B",)))
    assert isinstance(lacking, NodeFailed) and "holds no value for B" in lacking.detail
    assert lacking.exit_code == EXIT_SETUP_FAILED

    def refused() -> Secrets:
        raise ReportRejected("HTTP 401")

    assert "did not give them" in prepare_node(env, tmp_path, refused).detail  # type: ignore[union-attr]
    assert "no daemon to ask" in prepare_node(env, tmp_path, None).detail  # type: ignore[union-attr]
    gone = {"SPOTD_CODE_URI": str(tmp_path / "nope.tar.gz"), "SPOTD_CODE_SHA256": "a" * 64}
    failed = prepare_node(gone, tmp_path, None)
    assert isinstance(failed, NodeFailed) and failed.detail.startswith("code: cannot read")


def test_secrets_never_show_in_their_repr() -> None:
    got = Secrets(values={"HF_TOKEN": "hf_secret_value"})
    assert "hf_secret_value" not in repr(got) and "hf_secret_value" not in str(got)


def test_the_agent_reports_a_failed_setup_with_its_output(tmp_path: Path) -> None:
    sent: list[object] = []
    config = AgentConfig(job_id="j-1", attempt=1, command=(sys.executable, "-c", "print(1)"),
                         run_dir=str(tmp_path / "run"),
                         job_env={"PATH": os.environ["PATH"],
                                  "SPOTD_SETUP": json.dumps(["echo no wheel; exit 9"])},
                         )  # fmt: skip
    code = run_agent(config, send=sent.append, join=None)
    (exit_report,) = [r for r in sent if isinstance(r, ExitReport)]
    assert code == 9 and exit_report.exit_code == 9 and exit_report.phase == "setup"
    assert "no wheel" in exit_report.detail


def test_the_agent_asks_for_the_secrets_with_its_own_identity(tmp_path: Path) -> None:
    from spotd.agent.runner import _Agent
    from spotd.agent.watchers import NullWatcher

    asks: list[SecretsAsk] = []
    out = tmp_path / "env.json"
    script = f"import json, os; open({str(out)!r}, 'w').write(json.dumps(dict(os.environ)))"
    config = AgentConfig(job_id="j-1", attempt=2, instance_id="i-7", provider="aws",
                         command=(sys.executable, "-c", script), run_dir=str(tmp_path / "run"),
                         job_env={"PATH": os.environ["PATH"], "SPOTD_SECRETS": "API_KEY"},
                         )  # fmt: skip

    def ask(a: SecretsAsk) -> Secrets:
        asks.append(a)
        return Secrets(values={"API_KEY": "k-123"})

    assert _Agent(config, NullWatcher(), None, secrets=ask).run() == 0
    assert [(a.job_id, a.attempt, a.instance_id) for a in asks] == [("j-1", 2, "i-7")]
    assert json.loads(out.read_text())["API_KEY"] == "k-123"


# -- containers ------------------------------------------------------------------------


def test_a_job_with_an_image_runs_through_the_engine_with_its_variables(tmp_path: Path) -> None:
    """No container engine runs on these machines; a stand-in for one records what it was
    asked and runs the command as the container would, with only the -e variables."""
    record = tmp_path / "engine-args.json"
    engine = tmp_path / "fake-docker"
    engine.write_text(f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
json.dump(args, open({str(record)!r}, "w"))
image = next(a for a in args if not a.startswith("--") and a != "run")
cmd = args[args.index(image) + 1:]
passed = {{a.split("=", 1)[1] for a in args if a.startswith("--env=")}}
env = {{k: v for k, v in os.environ.items() if k in passed}}
env["PATH"] = "/usr/bin:/bin"
os.execve(cmd[0], cmd, env)
""")
    engine.chmod(engine.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "env.json"
    script = f"import json, os; open({str(out)!r}, 'w').write(json.dumps(dict(os.environ)))"
    job_env = {"PATH": os.environ["PATH"], "HOME": "/root", "SPOTD_IMAGE": "ghcr.io/org/train:1",
               "SPOTD_CONTAINER_ENGINE": str(engine), "SPOTD_CONTAINER_DEVICES": "/dev/null",
               "SPOTD_CONTAINER_MOUNTS": str(tmp_path / "ckpt"), "NCCL_DEBUG": "INFO",
               "SPOTD_JOB_ID": "j-1"}  # fmt: skip
    config = AgentConfig(job_id="j-1", attempt=1, command=(sys.executable, "-c", script),
                         run_dir=str(tmp_path / "run"), job_env=job_env)  # fmt: skip
    assert run_agent(config, send=lambda _r: None, join=None) == 0
    args = json.loads(record.read_text())
    assert args[:5] == ["run", "--rm", "--init", "--network=host", "--ipc=host"]
    assert "--device=/dev/null" in args and "--ulimit=memlock=-1:-1" in args
    assert f"--volume={tmp_path / 'ckpt'}:{tmp_path / 'ckpt'}" in args
    assert f"--volume={tmp_path / 'run'}:{tmp_path / 'run'}" in args
    assert "ghcr.io/org/train:1" in args and "--env=PATH" not in args
    assert not any("INFO" in a for a in args), "values never on the command line"
    seen = json.loads(out.read_text())
    assert seen["NCCL_DEBUG"] == "INFO" and seen["SPOTD_JOB_ID"] == "j-1"
    assert seen["PATH"] == "/usr/bin:/bin" and "HOME" not in seen


def test_only_present_devices_go_in_and_the_code_is_the_workdir(tmp_path: Path) -> None:
    env = {"SPOTD_IMAGE": "train:1", "SPOTD_CONTAINER_ENGINE": "podman",
           "SPOTD_CONTAINER_DEVICES": "/dev/infiniband-not-here,/dev/null"}  # fmt: skip
    argv = job_argv(["python", "train.py"], env, cwd=tmp_path / "code", run_dir=tmp_path,
                    name="spotd-j-1-1")  # fmt: skip
    assert argv[0] == "podman" and "--device=/dev/null" in argv
    assert not any("infiniband" in a for a in argv)
    assert f"--volume={tmp_path / 'code'}:/workdir" in argv and "--workdir=/workdir" in argv
    assert argv[-3:] == ["train:1", "python", "train.py"]
    assert job_argv(["python", "x.py"], {}, cwd=None, run_dir=tmp_path, name="n") == [
        "python",
        "x.py",
    ]


@pytest.mark.parametrize("name", ["PATH", "HOME", "SPOTD_AGENT_TOKEN", "LC_ALL"])
def test_the_hosts_own_variables_stay_out(name: str) -> None:
    assert name not in passed_names({name: "x", "NCCL_DEBUG": "INFO"})
