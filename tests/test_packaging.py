"""A built wheel installs each package under its folder's name (spotd, spotd_sim, ...).

examples/ installs as the data package spotd.examples.
"""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(ROOT)],
        check=True, capture_output=True,
    )
    (found,) = out.glob("spotd-*.whl")
    return found


def test_wheel_layout(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "spotd/cli/app.py",
        "spotd/py.typed",
        "spotd_sim/__init__.py",
        "spotd_aws/adapter.py",
        "spotd_gcp/adapter.py",
        "spotd_azure/adapter.py",
        "spotd_policies/cheapest.py",
        "spotd/examples/train_tiny.py",
        "spotd/examples/job.toml",
        "spotd/store/migrations/env.py",
        "spotd/store/alembic.ini",
        "spotd/billing/templates/report.html.j2",
        "spotd/daemon/templates/bootstrap.sh.j2",
        "spotd/mail/templates/job_end.html.j2",
        "spotd/daemon/dashboard/templates/jobs.html.j2",
        "spotd/daemon/dashboard/static/dashboard.js",
        "spotd/daemon/dashboard/static/dashboard.css",
    ):
        assert expected in names, f"{expected} missing from the wheel"
    migrations = ROOT / "spotd" / "store" / "migrations" / "versions"
    for revision in migrations.glob("*.py"):
        shipped = f"spotd/store/migrations/versions/{revision.name}"
        assert shipped in names, f"{shipped} missing from the wheel"
    assert not any(n.startswith(("providers/", "policies/", "tests/")) for n in names)
    assert not any(n.startswith(("spotd/providers/", "spotd/policies/")) for n in names)


def test_wheel_imports(wheel: Path, tmp_path: Path) -> None:
    """Install the wheel in a fresh venv that sees this one's packages, import from it."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    site = next((env_dir / "lib").glob("python*/site-packages"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    # Dependencies come from the running interpreter's site-packages, behind the wheel.
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "deps.pth").write_text("\n".join(deps) + "\n")
    code = (
        "import spotd, spotd_sim, spotd_policies.cheapest, spotd.examples, spotd.cli.app;"
        "import jinja2;"
        "t = jinja2.Environment(loader=jinja2.PackageLoader('spotd.billing', 'templates'));"
        "print(spotd.__file__); print(spotd_sim.__file__);"
        "print(t.loader.get_source(t, 'report.txt.j2')[1]);"
        # The shipped migrations take an empty database to the newest revision.
        "from spotd.store import open_store, schema_revision;"
        "s = open_store('sqlite:///' + __import__('os').path.abspath('w.db'));"
        "print('revision', schema_revision(s.engine), spotd.__file__)"
    )
    result = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", code],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )
    assert result.returncode == 0, result.stderr
    newest = max(p.name[:4] for p in (ROOT / "spotd/store/migrations/versions").glob("0*.py"))
    assert f"revision {newest} " in result.stdout
    for line in result.stdout.splitlines():
        assert str(site) in line, f"imported from outside the wheel: {line}"
