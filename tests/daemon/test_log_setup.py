"""spotd.daemon.log_setup: the daemon's log keeps spotd's lines and the libraries' warnings,
not their INFO chatter (matplotlib's under the reports' charts, one line per HTTP request)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = """
import logging, sys
from spotd.daemon.log_setup import configure_daemon_log
configure_daemon_log(verbose=sys.argv[1] == "verbose")
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
# Strings that read as numbers: matplotlib says so at INFO (matplotlib.category).
plt.bar(["1", "2"], [3, 4])
plt.savefig(sys.argv[2])
logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1/v1/health")
logging.getLogger("botocore.credentials").info("Found credentials in environment")
logging.getLogger("matplotlib.font_manager").warning("a font warning")
logging.getLogger("spotd.daemon.process").info("spotd daemon listening")
logging.getLogger("spotd.engine").debug("a pass")
"""


@pytest.mark.parametrize("mode", ["quiet", "verbose"])
def test_library_chatter_stays_out_of_the_daemon_log(tmp_path: Path, mode: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode, str(tmp_path / "chart.png")],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    log = done.stderr
    assert "INFO spotd.daemon.process: spotd daemon listening" in log, log
    assert "WARNING matplotlib.font_manager: a font warning" in log, log
    for chatter in ("categorical units", "HTTP Request", "Found credentials"):
        assert chatter not in log, log
    # --verbose: spotd's DEBUG lines, still none of the libraries'.
    assert ("DEBUG spotd.engine: a pass" in log) is (mode == "verbose"), log
    assert not [line for line in log.splitlines()
                if " DEBUG " in line and " spotd" not in line], log  # fmt: skip


def test_the_chatter_is_there_without_the_setup(tmp_path: Path) -> None:
    """The check above is live: unquieted, matplotlib does say it at INFO."""
    program = PROGRAM.replace(
        'configure_daemon_log(verbose=sys.argv[1] == "verbose")', "logging.basicConfig(level=20)"
    )
    done = subprocess.run([sys.executable, "-c", program, "quiet", str(tmp_path / "c.png")],
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    assert "categorical units" in done.stderr and "HTTP Request" in done.stderr
