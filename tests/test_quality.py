"""The shipped code passes mypy --strict from the repo root, ruff, and the import layers.

mypy runs on the checkout exactly as a developer runs it (``mypy`` in the root,
configured in pyproject.toml): no copy of the tree, no install-time remapping.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists() and shutil.which(name) is None:
        pytest.skip(f"{name} is not installed")
    return str(path) if path.exists() else name


def test_mypy_strict_from_the_repo_root(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / ".mypy_cache")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The configured files are the whole shipped code, not a part of it.
    checked = int(result.stdout.split(" in ")[1].split()[0])
    shipped = sum(1 for d in ("spotd", "providers", "policies") for _ in (ROOT / d).rglob("*.py"))
    assert checked == shipped, result.stdout


def test_ruff_clean() -> None:
    result = subprocess.run(
        [_tool("ruff"), "check", "spotd", "providers", "policies", "examples", "tests",
         "benchmarks"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_layers() -> None:
    """lint-imports keeps every contract of pyproject's [tool.importlinter]."""
    result = subprocess.run(
        [_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


def test_the_test_command_lists_each_skip_with_its_reason(tmp_path: Path) -> None:
    (tmp_path / "test_skipping.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.skip(reason='needs a unicorn')\n"
        "def test_unicorn():\n    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIPPED [1]" in done.stdout and "needs a unicorn" in done.stdout, done.stdout
