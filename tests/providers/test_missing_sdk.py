"""A cloud turned on without its SDK, and price polls that all fail.

The test venv has every SDK installed, so each test takes one away for real in a
child process: a ``sitecustomize`` put first on PYTHONPATH refuses to import the
modules named in ``SPOTD_TEST_ABSENT`` just as Python does a package that is not
there (ModuleNotFoundError). The real ``spotd`` commands then run against it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ABSENT = '''
import os
import sys
from importlib.abc import MetaPathFinder

_ABSENT = tuple(n for n in os.environ.get("SPOTD_TEST_ABSENT", "").split(",") if n)


class _NotInstalled(MetaPathFinder):
    """Answers for the modules of an uninstalled package as the import system does."""

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == n or fullname.startswith(n + ".") for n in _ABSENT):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''

# What `pip install -e .` without extras lacks, per cloud (the pyproject extras' packages).
# What `pip install -e .` without extras lacks, per cloud (the pyproject extras'
# packages), the module the message names, and what else its table needs.
CLOUDS = {
    "aws": ("boto3,botocore", "boto3", ""),
    "gcp": (
        "google.cloud.compute_v1,google.cloud.billing_v1,google.api_core",
        "google.cloud.compute_v1",
        'image = "projects/p/global/images/family/f"\n',
    ),
    "azure": ("azure.mgmt,azure.identity", "azure.mgmt.compute", ""),
}


def _env(tmp_path: Path, absent: str, site: Path | None = None) -> dict[str, str]:
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(ABSENT, encoding="utf-8")
    path = [str(hooks)] + ([str(site)] if site else []) + [os.environ.get("PYTHONPATH", "")]
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPOTD_")},
        "PYTHONPATH": os.pathsep.join(path),
        "SPOTD_TEST_ABSENT": absent,
    }


def _config(tmp_path: Path, cloud: str, extra: str = "", daemon_url: bool = True) -> Path:
    cfg = tmp_path / "spotd.toml"
    agent = '[agent]\ndaemon_url = "http://127.0.0.1:8470"\n' if daemon_url else ""
    cfg.write_text(
        f"data_dir = {json.dumps(str(tmp_path / 'data'))}\n"
        f"[daemon]\nport = 0\n{agent}"
        "[providers.sim]\nenabled = false\n"
        f"[providers.{cloud}]\nenabled = true\n{extra}",
        encoding="utf-8",
    )
    return cfg


def _spotd(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spotd", *args],
        capture_output=True, text=True, check=False, env=env, timeout=120,
    )


def _extras() -> dict[str, list[str]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        extras: dict[str, list[str]] = tomllib.load(f)["project"]["optional-dependencies"]
    return extras


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_a_cloud_without_its_sdk_is_one_line_naming_the_extra(tmp_path: Path, cloud: str) -> None:
    absent, named, table = CLOUDS[cloud]
    assert cloud in _extras()  # the extra the message names is the one pyproject declares
    env = _env(tmp_path, absent)
    result = _spotd(env, "prices", "-c", str(_config(tmp_path, cloud, table)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"error: [providers.{cloud}] is enabled but its SDK is not installed (no module "
        f"named {named!r}): pip install 'spotd[{cloud}]'"
    ]


def test_the_missing_sdk_is_told_before_what_else_the_table_lacks(tmp_path: Path) -> None:
    # Without [agent] daemon_url too: the SDK is what to fix first, so it is said first.
    env = _env(tmp_path, CLOUDS["azure"][0])
    cfg = _config(tmp_path, "azure", daemon_url=False)
    result = _spotd(env, "check-cloud", "-c", str(cfg))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: [providers.azure] is enabled but its SDK is not installed (no module "
        "named 'azure.mgmt.compute'): pip install 'spotd[azure]'"
    ]


def test_the_daemon_stops_at_start_with_the_line_and_no_traceback(tmp_path: Path) -> None:
    # botocore alone absent: boto3 is found, and fails only when the adapter imports it.
    env = _env(tmp_path, "botocore")
    result = _spotd(env, "daemon", "-c", str(_config(tmp_path, "aws")))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        "error: [providers.aws] is enabled but its SDK is not installed (no module "
        "named 'botocore'): pip install 'spotd[aws]'"
    )


# -- spotd prices when polls fail -------------------------------------------------

CLOUDS_PACKAGE = '''
from pydantic import BaseModel

from spotd.core.contracts import BuiltProviders
from spotd.core.errors import ProviderUnavailable
from spotd.core.kinds import ProviderKind, Sdk, instance_shape
from spotd.core.network import Fabric
from spotd.core.values import Offering, Pool

TYPES = {"tc.l4": instance_shape("L4", 1, 24, Fabric.ETHERNET, 10)}


class Settings(BaseModel):
    enabled: bool = False


class Provider:
    def __init__(self, name):
        self.name = name

    def offerings(self):
        if self.name == "downcloud":
            raise ProviderUnavailable("endpoint refused the connection", provider=self.name)
        shape = TYPES["tc.l4"]
        pool = Pool(self.name, "tc-1", "tc-1a", "tc.l4")
        return [Offering(pool, shape.gpu, 1, 24, shape.interconnect, 0.5, 1.5, 1.0)]

    def launch(self, request):
        raise NotImplementedError

    def describe(self, instance_ids):
        return []

    def list_instances(self, tags):
        return []

    def terminate(self, instance_ids):
        pass

    def logs(self, instance_id):
        return ""


def _kind(name):
    return ProviderKind(
        name=name, settings=Settings, instance_types=TYPES,
        build=lambda settings, context: BuiltProviders((Provider(name),)),
    )


UP, DOWN = _kind("upcloud"), _kind("downcloud")
# Its SDK is a package nobody installed, which the extra "fast" would bring.
SDK = ProviderKind(name="sdkcloud", settings=Settings, build=_kind("x").build,
                   sdk=Sdk("fast", ("spotd_absent_sdk",)))


def _build_buggy(settings, context):
    import spotd_testclouds.gone  # a module of the package itself: a bug, not an SDK
    return BuiltProviders(())


BUG = ProviderKind(name="bugcloud", settings=Settings, build=_build_buggy)
'''


def _install_clouds(site: Path) -> None:
    """``upcloud`` (answers) and ``downcloud`` (every poll fails), as pip would install."""
    site.mkdir()
    (site / "spotd_testclouds.py").write_text(CLOUDS_PACKAGE, encoding="utf-8")
    dist = site / "spotd_testclouds-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: spotd-testclouds\nVersion: 0.1\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        "[spotd.providers]\nupcloud = spotd_testclouds:UP\ndowncloud = spotd_testclouds:DOWN\n"
        "sdkcloud = spotd_testclouds:SDK\nbugcloud = spotd_testclouds:BUG\n",
        encoding="utf-8",
    )


def _clouds_config(tmp_path: Path, *enabled: str) -> Path:
    cfg = tmp_path / "spotd.toml"
    tables = "".join(f"[providers.{name}]\nenabled = true\n" for name in enabled)
    cfg.write_text(
        f"data_dir = {json.dumps(str(tmp_path / 'data'))}\n"
        f"[providers.sim]\nenabled = false\n{tables}",
        encoding="utf-8",
    )
    return cfg


def test_prices_exits_non_zero_when_every_provider_failed(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install_clouds(site)
    env = _env(tmp_path, "", site)
    cfg = str(_clouds_config(tmp_path, "downcloud"))
    result = _spotd(env, "prices", "-c", cfg)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "error: downcloud: no offerings, its price poll failed (1x): "
        "ProviderUnavailable: endpoint refused the connection"
    ]
    as_json = _spotd(env, "prices", "-c", cfg, "--json")
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["providers"][0]["error"].endswith("refused the connection")


def test_prices_shows_what_answered_and_a_line_for_what_failed(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install_clouds(site)
    env = _env(tmp_path, "", site)
    result = _spotd(env, "prices", "-c", str(_clouds_config(tmp_path, "upcloud", "downcloud")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "upcloud: 1 offerings" in result.stdout
    assert "tc-1a" in result.stdout
    assert result.stderr.splitlines() == [
        "error: downcloud: no offerings, its price poll failed (1x): "
        "ProviderUnavailable: endpoint refused the connection"
    ]


def test_a_third_party_kind_names_its_own_distribution_and_extra(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install_clouds(site)
    cfg = str(_clouds_config(tmp_path, "sdkcloud"))
    result = _spotd(_env(tmp_path, "", site), "prices", "-c", cfg)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: [providers.sdkcloud] is enabled but its SDK is not installed (no module "
        "named 'spotd_absent_sdk'): pip install 'spotd-testclouds[fast]'"
    ]


def test_a_module_of_the_kind_itself_missing_is_a_bug_shown_as_one(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _install_clouds(site)
    cfg = str(_clouds_config(tmp_path, "bugcloud"))
    result = _spotd(_env(tmp_path, "", site), "prices", "-c", cfg)
    assert result.returncode != 0
    assert "No module named 'spotd_testclouds.gone'" in result.stderr
    assert "pip install" not in result.stderr
