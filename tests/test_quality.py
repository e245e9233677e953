"""The package code passes mypy --strict, and it, the tests and the benchmarks pass ruff."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The top-level folders that install as subpackages of spotd.
MAPPED = {"providers": "providers", "policies": "policies", "examples": "examples"}


def _link_tree(dest: Path) -> Path:
    """A ``spotd`` package as installed: ``spotd/`` with the mapped folders inside it."""
    pkg = dest / "spotd"
    shutil.copytree(ROOT / "spotd", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for sub, folder in MAPPED.items():
        shutil.copytree(ROOT / folder, pkg / sub, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_mypy_strict(tmp_path: Path) -> None:
    tree = _link_tree(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / ".mypy_cache"), "-p", "spotd"],
        cwd=tree, capture_output=True, text=True, check=False,
        env={**os.environ, "MYPYPATH": str(tree)},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_clean() -> None:
    if shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists():
        pytest.skip("ruff is not installed")
    ruff = str(Path(sys.executable).parent / "ruff")
    result = subprocess.run(
        [ruff, "check", "spotd", "providers", "policies", "examples", "tests", "benchmarks"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
