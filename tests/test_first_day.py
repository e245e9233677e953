"""docs/first-day.md, done for real: every ```sh block of the page, in order.

The page is a newcomer's first day: the demo, a daemon of their own with a local
SMTP server, a job of their own, the dashboard, the report by email, and stopping.
This test reads the page, cuts each ```sh block into commands (a line, or a
``cat > FILE <<EOF`` with its body) and runs them one after the other with real
processes, from the clone's folder first, as the page says, with ``HOME`` and
``TMPDIR`` in a temporary folder of its own (removed at the end, with every
process it started). Every ```sh block is run: what a reader only looks at is in
```text blocks, which are not.

Where the test cannot type what the reader types, it does the same thing another
way; each case is in one of the tables below, and each table's entries are checked
to be on the page, so none goes stale:

- ``ports()``: the page's fixed ports become free ones (the daemon's ``0``: it takes
  any, and the CLI finds it in ``data/daemon.json``), so that tests running beside
  this one do not collide.
- ``STANDS_FOR``: ``make demo`` would reinstall ``.venv``, which ``make test`` has
  just made, and then run ``spotd demo`` (checked against the Makefile), which
  tests/cli/test_demo.py runs and holds to the words the page shows
  (``demo_support.DEMO_SAYS``, checked here to be on the page): this test does
  not run the demo a second time.
  ``. .venv/bin/activate`` puts that venv's ``bin`` first on ``PATH``.
  ``pip install aiosmtpd`` would download; the test extras have it, and the test
  checks that the venv's ``python`` imports it.
- ``cd DIR`` moves the folder the following commands run in.
- ``COMMAND &``: started in a process group of its own, then waited for
  (``READY``): the SMTP server until it takes connections, the daemon until its
  address file names it. ``kill %1 %2`` sends SIGTERM to those background
  commands by their job numbers, as the shell would, and each must exit.

After a command, ``CHECKS`` asserts what the page says the reader sees; after
``spotd dashboard`` the test also logs in to the dashboard over HTTP with the
token, as the reader does in a browser, and after the look at ``mail.log`` it
reads the message the SMTP server wrote there: subject, recipient, and the job's
row with its cost as ``spotd status`` gives it. Waits poll with generous safety
nets; the job itself takes seconds on the simulated market's real-time clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.parser import Parser
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import httpx
import pytest
from dashboard_support import login
from demo_support import DEMO_SAYS
from smtp_support import free_port

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "first-day.md"
MAKEFILE = ROOT / "Makefile"
VENV_BIN = Path(sys.executable).parent
"""The venv running the tests: `make test` made it as `make demo` would (.venv)."""

DEMO_RECIPE = re.compile(r"^demo: \$\(VENV\)/\.core\n\t\$\(BIN\)/spotd demo\n", re.MULTILINE)
JOB_NAME = "first-job"
FIFTEEN_MINUTES = 15 * 60
COMMAND_TIMEOUT = 180.0
"""Safety net of one command; `logs --follow` gets more (LONG)."""
LONG = {f"spotd logs {JOB_NAME} --follow": 600.0}
READY_TIMEOUT = 120.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
HEREDOC = re.compile(r"<<'?(\w+)'?\s*$")
JOB_NUMBER = re.compile(r"%(\d+)")


# --- reading the page ------------------------------------------------------------------


def sh_blocks(text: str) -> list[str]:
    """The bodies of the page's ```sh blocks, in order."""
    return [body for lang, body in BLOCK.findall(text) if lang == "sh"]


def commands(block: str) -> list[str]:
    """The block's commands: each line, a heredoc with its body; no blanks or comments."""
    lines, found = block.splitlines(), []
    while lines:
        line = lines.pop(0)
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        assert not line.endswith("\\"), f"continued lines are not run by this test: {line!r}"
        heredoc = HEREDOC.search(line)
        if heredoc:
            end = lines.index(heredoc.group(1))
            line = "\n".join([line, *lines[: end + 1]])
            del lines[: end + 1]
        found.append(line)
    return found


def page_commands() -> list[str]:
    return [c for block in sh_blocks(PAGE.read_text(encoding="utf-8")) for c in commands(block)]


# --- the run ---------------------------------------------------------------------------


@dataclass
class Day:
    """The reader's terminal: its folder, its environment and its background jobs."""

    cwd: Path
    env: dict[str, str]
    smtp_port: int
    background: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def settings_dir(self) -> Path:
        """``data_dir`` of the spotd.toml in the current folder."""
        config = tomllib.loads((self.cwd / "spotd.toml").read_text(encoding="utf-8"))
        return Path(config["data_dir"])

    def spotd(self, *args: str) -> str:
        """A command of the test's own (not the page's), in the reader's folder."""
        done = subprocess.run(
            [str(VENV_BIN / "spotd"), *args], cwd=self.cwd, env=self.env,
            capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


def substitute(command: str, day: Day) -> str:
    for on_page, in_test in ports(day).items():
        command = command.replace(on_page, in_test)
    return command


def ports(day: Day) -> dict[str, str]:
    return {
        "port = 8470": "port = 0",
        "127.0.0.1:8025": f"127.0.0.1:{day.smtp_port}",
        "port = 8025": f"port = {day.smtp_port}",
    }


def demo_run_elsewhere(day: Day) -> str:
    del day
    assert DEMO_RECIPE.search(MAKEFILE.read_text(encoding="utf-8")), (
        "the Makefile's demo target no longer runs `$(BIN)/spotd demo` after its install"
    )
    page = PAGE.read_text(encoding="utf-8")
    assert all(part in page for part in DEMO_SAYS), "the page no longer shows the demo's words"
    return ""


def activate(day: Day) -> str:
    day.env["PATH"] = f"{VENV_BIN}{os.pathsep}{day.env['PATH']}"
    day.env["VIRTUAL_ENV"] = str(VENV_BIN.parent)
    return ""


def has_aiosmtpd(day: Day) -> str:
    return run(["python", "-c", "import aiosmtpd; print(aiosmtpd.__version__)"], day,
               COMMAND_TIMEOUT)  # fmt: skip


STANDS_FOR: dict[str, Callable[[Day], str]] = {
    "make demo": demo_run_elsewhere,
    ". .venv/bin/activate": activate,
    "pip install aiosmtpd": has_aiosmtpd,
}


def run(argv: list[str], day: Day, timeout: float) -> str:
    done = subprocess.run(
        argv, cwd=day.cwd, env=day.env, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{output}"
    return output


def change_folder(command: str, day: Day) -> str:
    where = run(["bash", "-c", f"{command} && pwd"], day, COMMAND_TIMEOUT).strip()
    day.cwd = Path(where)
    return ""


def start_background(command: str, day: Day) -> str:
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {command.removesuffix('&').strip()}"],
        cwd=day.cwd, env=day.env, start_new_session=True,
    )  # fmt: skip
    day.background.append(proc)
    ready = next(check for key, check in READY.items() if key in command)
    ready(proc, day)
    return ""


def smtp_ready(proc: subprocess.Popen[bytes], day: Day) -> None:
    def accepts() -> bool:
        with socket.socket() as sock:
            sock.settimeout(1.0)
            return sock.connect_ex(("127.0.0.1", day.smtp_port)) == 0

    poll(accepts, proc, "the SMTP server to take connections")


def daemon_ready(proc: subprocess.Popen[bytes], day: Day) -> None:
    address = day.settings_dir() / "daemon.json"

    def named() -> bool:
        with contextlib.suppress(OSError, ValueError, KeyError):
            return bool(json.loads(address.read_text())["pid"] == proc.pid)
        return False

    poll(named, proc, f"the daemon to write {address}")


READY: dict[str, Callable[[subprocess.Popen[bytes], Day], None]] = {
    "aiosmtpd": smtp_ready,
    "spotd daemon": daemon_ready,
}


def poll(cond: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> None:
    limit = time.monotonic() + READY_TIMEOUT
    while not cond():
        assert proc.poll() is None, f"waiting for {what}, it exited {proc.returncode}"
        assert time.monotonic() < limit, f"waited {READY_TIMEOUT:.0f} s for {what}"
        time.sleep(0.05)


def stop_background(command: str, day: Day) -> str:
    """``kill %1 %2``: SIGTERM to those background commands; each exits, 0 or by the signal."""
    for number in JOB_NUMBER.findall(command):
        proc = day.background[int(number) - 1]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=COMMAND_TIMEOUT)
        assert code in (0, -signal.SIGTERM), f"job %{number} exited {code}"
    return ""


def do(command: str, day: Day) -> str:
    """Run one command of the page as the reader would; its output."""
    if command in STANDS_FOR:
        return STANDS_FOR[command](day)
    command = substitute(command, day)
    if command.startswith("cd "):
        return change_folder(command, day)
    if command.endswith("&"):
        return start_background(command, day)
    if command.startswith("kill %"):
        return stop_background(command, day)
    return run(["bash", "-c", command], day, LONG.get(command, COMMAND_TIMEOUT))


# --- what the reader sees ----------------------------------------------------------------


def expect(*parts: str) -> Callable[[str, Day], None]:
    def check(output: str, day: Day) -> None:
        del day
        missing = [p for p in parts if p not in output]
        assert not missing, f"{missing} not in:\n{output}"

    return check


def dashboard_login(output: str, day: Day) -> None:
    """The page's browser step: log in with the token, see the job on the Jobs page."""
    url = output.split(maxsplit=1)[0]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/dashboard/"), output
    token = (day.settings_dir() / "token").read_text().strip()
    with httpx.Client(base_url=url.removesuffix("/dashboard/"), timeout=60) as client:
        session = login(client, token)
        page = client.get("/dashboard/jobs", headers={"Cookie": f"spotd_session={session}"})
    assert page.status_code == 200, page.text
    job_id = job_record(day)["id"]
    assert f'<tr data-job="{job_id}" data-status="succeeded">' in page.text, page.text
    assert JOB_NAME in page.text, page.text


def received_report(output: str, day: Day) -> None:
    """The report the SMTP server wrote into mail.log: to whom, and the job at its cost."""
    assert "Subject: spotd report" in output, output
    reports = [m for m in messages(day.cwd / "mail.log") if m["subject"].startswith("spotd report")]
    assert reports, (day.cwd / "mail.log").read_text()
    message = reports[-1]
    assert message["to"] == "you@example.com"
    body = message.get_body(preferencelist=("plain",))
    assert isinstance(body, EmailMessage)
    text = body.get_content()
    job = job_record(day)
    rows = [line for line in text.splitlines() if job["id"] in line and JOB_NAME in line]
    assert any(f"{job['cost_usd']:.2f}" in row and "succeeded" in row for row in rows), text


def job_record(day: Day) -> dict[str, Any]:
    """The job as ``spotd status JOB --json`` gives it (a command of the test's own)."""
    record: dict[str, Any] = json.loads(day.spotd("status", JOB_NAME, "--json"))
    return record


def messages(mail_log: Path) -> Iterator[EmailMessage]:
    """The messages ``python -m aiosmtpd`` printed: headers (its X-Peer line among
    them), a blank line, the body, between its two marker lines."""
    text = mail_log.read_text(encoding="utf-8")
    for chunk in text.split("---------- MESSAGE FOLLOWS ----------\n")[1:]:
        raw = chunk.split("------------ END MESSAGE ------------")[0]
        parsed = Parser(policy=default_policy).parsestr(raw)
        assert isinstance(parsed, EmailMessage)
        yield parsed


CHECKS: dict[str, Callable[[str, Day], None]] = {
    "grep -e clock: -e listening daemon.log": expect(
        "clock: real time", "spotd daemon listening on 127.0.0.1:"
    ),
    "spotd plan job.toml": expect("balanced chooses"),
    "spotd submit job.toml": expect("submitted j-", f"({JOB_NAME})"),
    "spotd status": expect(JOB_NAME),
    f"spotd logs {JOB_NAME} --follow": expect(
        "starting at step 0", "step 20/20", "finished", ": succeeded"
    ),
    f"spotd events {JOB_NAME}": expect("submitted", "placed", "all nodes running", "exit 0"),
    f"spotd status {JOB_NAME}": expect("succeeded", "attempts"),
    "spotd dashboard": dashboard_login,
    "spotd report": expect("spotd report", JOB_NAME),
    "spotd report --email": expect("report emailed to you@example.com"),
    "head -n 40 mail.log": received_report,
}


# --- cleaning up -----------------------------------------------------------------------


def processes_under(root: Path) -> list[int]:
    """Processes whose command line or folder is inside ``root``: the simulated
    market's instances and their jobs, which outlive a daemon as a cloud's VMs do."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
            if str(root) in cmdline or cwd.startswith(str(root)):
                found.append(int(proc.name))
    return [pid for pid in found if pid != os.getpid()]


def nothing_runs_on(root: Path) -> None:
    """After the page's stop, no process of the day is left (polled: a simulated
    instance whose job has ended exits on its own)."""
    limit = time.monotonic() + READY_TIMEOUT
    while left := processes_under(root):
        assert time.monotonic() < limit, f"still running after the stop: {left}"
        time.sleep(0.1)


def tails(day: Day, lines: int = 60) -> str:
    """The last lines of the daemon's and the SMTP server's output, where they are."""
    found = []
    for name in ("daemon.log", "mail.log"):
        with contextlib.suppress(OSError):
            text = (day.cwd / name).read_text(errors="replace").splitlines()[-lines:]
            found.append(f"--- {name} ---\n" + "\n".join(text))
    return "\n".join(found)


def clean_up(day: Day, root: Path) -> None:
    for proc in day.background:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    for pid in processes_under(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


# --- the tests -------------------------------------------------------------------------


def test_every_table_entry_is_on_the_page() -> None:
    on_page = page_commands()
    assert set(STANDS_FOR) | set(CHECKS) <= set(on_page)
    text = "\n".join(on_page)
    day = Day(cwd=ROOT, env={}, smtp_port=1)
    assert all(port in text for port in ports(day))
    backgrounded = [c for c in on_page if c.endswith("&")]
    assert [next(k for k in READY if k in c) for c in backgrounded] == list(READY)


def test_commands_are_cut_as_typed() -> None:
    block = "a\n\n# note\ncat > f <<'EOF'\nx\n# kept\nEOF\nb &\n"
    assert commands(block) == ["a", "cat > f <<'EOF'\nx\n# kept\nEOF", "b &"]


def test_the_first_day_runs_as_written() -> None:
    root = Path(tempfile.mkdtemp(prefix="spotd-first-day-"))
    (root / "home").mkdir()
    (root / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTD_")}
    env.update(HOME=str(root / "home"), TMPDIR=str(root / "tmp"), COLUMNS="200")
    env.pop("VIRTUAL_ENV", None)
    day = Day(cwd=ROOT, env=env, smtp_port=free_port())
    began = time.monotonic()
    try:
        for command in page_commands():
            output = do(command, day)
            if command in CHECKS:
                CHECKS[command](output, day)
        assert all(p.poll() is not None for p in day.background)
        nothing_runs_on(root)
    except BaseException:
        print(tails(day))  # pytest shows it with the failure
        raise
    finally:
        clean_up(day, root)
    took = time.monotonic() - began
    print(f"first day, as written: {took:.0f} s")
    assert took < FIFTEEN_MINUTES
    assert not root.exists()
