"""Provider kinds: descriptors found through the ``spotd.providers`` entry point group.

The core names no cloud: every per-kind figure and hook comes from a
descriptor its provider package registers, and a package spotd has never
heard of adds a kind by declaring one (tested here with a package made in a
temporary folder and run through the real ``spotd prices``).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

from spotd import registry
from spotd.agent.config import AgentConfig
from spotd.agent.watchers import NullWatcher, make_watcher
from spotd.billing import ledger
from spotd.core.errors import ConfigError, ProviderKindError, SpotdError, UnknownProviderKind
from spotd.core.kinds import ProviderKind
from spotd.daemon.bootstrap import render_bootstrap
from spotd.daemon.config import ProvidersSettings, Settings, load_settings
from spotd.daemon.wiring import build_providers
from spotd.market import catalog
from spotd_sim import SimSettings

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = {"sim", "aws", "gcp", "azure"}


# -- the shipped kinds ----------------------------------------------------------


def test_every_shipped_kind_is_declared_and_loads_its_descriptor() -> None:
    declared = {ep.name: ep.value for ep in entry_points(group=registry.PROVIDER_GROUP)}
    for name in SHIPPED:
        assert declared[name] == f"spotd_{name}:KIND"
        kind = registry.load_kind(name)
        assert isinstance(kind, ProviderKind) and kind.name == name
        assert "enabled" in kind.settings.model_fields
    assert set(registry.kind_names()) >= SHIPPED
    assert {k.name for k in registry.provider_kinds()} >= SHIPPED


def test_provider_names_answer_to_their_kind_and_the_sims_to_the_cloud_they_mirror() -> None:
    for cloud in ("aws", "gcp", "azure"):
        assert registry.kind_of(cloud).name == cloud
        assert registry.kind_of(f"sim-{cloud}").name == "sim"
        assert registry.find_market_kind(f"sim-{cloud}") is registry.load_kind(cloud)
    assert registry.find_kind_of("nowhere") is None
    assert registry.find_market_kind("nowhere") is None


def test_an_unknown_name_is_a_config_error_naming_the_installed_kinds() -> None:
    with pytest.raises(UnknownProviderKind, match=r"'nowhere'.*aws.*sim") as caught:
        registry.kind_of("nowhere")
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, SpotdError)
    with pytest.raises(UnknownProviderKind, match="no provider kind named 'sim-aws'"):
        registry.load_kind("sim-aws")  # a provider's name, not a kind's


def test_an_entry_point_that_loads_no_descriptor_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bad = EntryPoint(name="bad", value="os.path:join", group=registry.PROVIDER_GROUP)
    monkeypatch.setattr(registry, "_kind_entry_points", lambda: {"bad": bad})
    with pytest.raises(ProviderKindError, match=r"'bad' \(os.path:join\).*not a spotd.core.kinds"):
        registry.load_kind("bad")
    gone = EntryPoint(name="gone", value="spotd_no_such_module:KIND", group=registry.PROVIDER_GROUP)
    monkeypatch.setattr(registry, "_kind_entry_points", lambda: {"gone": gone})
    with pytest.raises(ProviderKindError, match="failed to load"):
        registry.load_kind("gone")


def test_the_cloud_kinds_load_without_their_sdks() -> None:
    # A finder that refuses every SDK module, installed before spotd is imported.
    code = textwrap.dedent("""
        import json, sys
        class NoSdk:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("boto3", "botocore", "google", "azure"):
                    raise ImportError(f"SDK {name} refused")
                return None
        sys.meta_path.insert(0, NoSdk())
        from spotd import registry
        from spotd.daemon.config import Settings
        kinds = registry.provider_kinds()
        Settings(providers={"aws": {"enabled": True}})
        print(json.dumps(sorted(k.name for k in kinds)))
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)) >= SHIPPED


def test_the_figures_of_the_core_come_from_the_descriptors() -> None:
    aws, azure = registry.load_kind("aws"), registry.load_kind("azure")
    # Billing: Azure per minute, AWS per second; a sim provider bills as its cloud.
    assert catalog.billed_seconds("azure", 61) == 120 == catalog.billed_seconds("sim-azure", 61)
    assert catalog.billed_seconds("sim-aws", 61) == 61
    assert catalog.billed_seconds("nowhere", 1) == 60  # no kind: the common minimum
    # Egress leaves the source kind; within one kind it is inter-region.
    assert catalog.transfer_usd_per_gb("aws", "sim-azure") == aws.egress_usd_per_gb
    assert catalog.transfer_usd_per_gb("sim-aws", "aws") == aws.inter_region_usd_per_gb
    assert ledger.egress_rate("azure", "gcp") == azure.egress_usd_per_gb
    assert catalog.notice_seconds("sim-aws") == aws.notice_seconds == 120
    assert catalog.notice_seconds("nowhere") == 0
    # Instance types: the sims use their cloud's table.
    assert catalog.facts("sim-aws", "p5.48xlarge") is aws.instance_types["p5.48xlarge"]
    assert set(catalog.catalog()) >= {"aws", "gcp", "azure"}


def test_boot_scripts_and_agents_take_their_carrier_and_metadata_from_the_kind() -> None:
    from spotd.core.values import LaunchRequest, Market, Offering, Pool

    kind = registry.load_kind("gcp")
    assert kind.boot is not None
    facts_ = kind.instance_types["a3-highgpu-8g"]
    offering = Offering(Pool("gcp", "r", "r-a", "a3-highgpu-8g"), facts_.gpu,
                        facts_.gpus_per_node, facts_.gpu_memory_gb, facts_.interconnect,
                        1.0, 2.0)  # fmt: skip
    request = LaunchRequest(
        offering=offering, market=Market.SPOT, nodes=1, command=("true",),
        client_token="t", tags={"spotd-job": "j", "spotd-attempt": "1"}, env={},
    )
    script = render_bootstrap("gcp", request, daemon_url="http://d", agent_token="a")
    assert kind.boot.description in script
    assert f"SPOTD_AGENT_METADATA_URL={kind.metadata_url}" in script
    with pytest.raises(ValueError, match="no bootstrap for provider kind 'sim'"):
        render_bootstrap("sim", request, daemon_url="http://d", agent_token="a")
    agent = AgentConfig(provider="gcp", job_id="j", attempt=1, command=("true",))
    assert agent.metadata_base == kind.metadata_url
    assert agent.poll_interval == kind.agent_poll_seconds
    assert type(make_watcher(agent)).__module__ == "spotd_gcp.notice"
    none = AgentConfig(job_id="j", attempt=1, command=("true",))
    assert isinstance(make_watcher(none), NullWatcher)
    with pytest.raises(ConfigError, match=r"SPOTD_AGENT_PROVIDER: .*'nowhere'"):
        AgentConfig.from_env({"SPOTD_AGENT_PROVIDER": "nowhere", "SPOTD_AGENT_JOB_ID": "j",
                              "SPOTD_AGENT_ATTEMPT": "1", "SPOTD_AGENT_COMMAND": "true"})


# -- configuration ----------------------------------------------------------------


def test_each_kind_has_its_table_and_env_overrides_reach_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "spotd.toml"
    cfg.write_text("[providers.sim]\nseed = 3\n[providers.aws]\nregions = ['us-east-1']\n")
    monkeypatch.setenv("SPOTD_PROVIDERS__SIM__SPEED", "120")
    monkeypatch.setenv("SPOTD_PROVIDERS__GCP__ZONES", '["europe-west4-a"]')
    settings = load_settings(cfg)
    assert set(type(settings.providers).model_fields) >= SHIPPED
    assert (settings.providers.sim.seed, settings.providers.sim.speed) == (3, 120)
    assert settings.providers.aws.regions == ["us-east-1"]
    assert settings.providers.gcp.zones == ["europe-west4-a"]
    assert settings.providers.table("sim") is settings.providers.sim
    assert [k.name for k, _ in settings.providers.enabled_kinds()] == ["sim"]


def test_a_table_of_no_installed_kind_is_a_config_error_naming_the_known_ones(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "spotd.toml"
    cfg.write_text("[providers.lambdalabs]\nenabled = true\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(cfg)
    message = str(caught.value)
    assert f"{cfg}: providers.lambdalabs: no provider kind named 'lambdalabs'" in message
    assert all(name in message for name in SHIPPED)


def test_a_fast_clock_cannot_share_a_daemon_and_nothing_is_built_first(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        providers=ProvidersSettings(sim=SimSettings(speed=60), aws={"enabled": True}),
    )
    with pytest.raises(ConfigError, match=r"\[providers\.sim\] speed 60 cannot share .*\(aws\)"):
        build_providers(settings)
    assert not settings.sim_state_dir.exists()
    off = Settings(data_dir=tmp_path, providers=ProvidersSettings(sim=SimSettings(enabled=False)))
    with pytest.raises(ConfigError, match=r"no provider is enabled: .*\[providers\.aws\]"):
        build_providers(off)


# -- a provider from a package spotd does not know ---------------------------------

THIRD_PARTY = '''
"""A provider kind shipped by a package of its own: fixed offerings, no SDK."""

from pydantic import BaseModel, ConfigDict

from spotd.core.values import Offering, Pool
from spotd.core.network import Fabric
from spotd.core.kinds import ProviderKind, instance_shape
from spotd.core.contracts import BuiltProviders

TYPES = {"tc.h100x8": instance_shape("H100", 8, 80, Fabric.INFINIBAND, 3200)}


class TestCloudSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    zones: list[str] = ["tc-east-1a"]


class TestCloudProvider:
    name = "testcloud"

    def __init__(self, zones):
        self.zones = zones

    def offerings(self):
        t = TYPES["tc.h100x8"]
        return [
            Offering(Pool("testcloud", z[:-1], z, "tc.h100x8"), t.gpu, t.gpus_per_node,
                     t.gpu_memory_gb, t.interconnect, 7.25, 21.5, notice_seconds=45)
            for z in self.zones
        ]

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


def build(settings, context):
    return BuiltProviders((TestCloudProvider(settings.zones),))


KIND = ProviderKind(
    name="testcloud", settings=TestCloudSettings, build=build,
    billing_step_seconds=10, notice_seconds=45, instance_types=TYPES,
)
'''


def install_test_package(root: Path) -> None:
    """``spotd_testcloud`` with its dist-info, as pip would leave it in site-packages."""
    (root / "spotd_testcloud.py").write_text(THIRD_PARTY, encoding="utf-8")
    dist = root / "spotd_testcloud-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: spotd-testcloud\nVersion: 0.1\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        "[spotd.providers]\ntestcloud = spotd_testcloud:KIND\n", encoding="utf-8"
    )


def test_a_provider_from_a_test_only_package_appears_in_spotd_prices(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    install_test_package(site)
    cfg = tmp_path / "spotd.toml"
    cfg.write_text(
        f"data_dir = {json.dumps(str(tmp_path / 'data'))}\n"
        "[providers.sim]\nenabled = false\n"
        "[providers.testcloud]\nenabled = true\nzones = ['tc-east-1a', 'tc-west-2b']\n",
        encoding="utf-8",
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SPOTD_")},
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-m", "spotd", "prices", "--config", str(cfg), "--json"],
        capture_output=True, text=True, check=False, env=env, cwd=tmp_path, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    view = json.loads(result.stdout)
    offered = {(o["provider"], o["zone"], o["instance_type"]) for o in view["offerings"]}
    assert offered == {
        ("testcloud", "tc-east-1a", "tc.h100x8"),
        ("testcloud", "tc-west-2b", "tc.h100x8"),
    }
    assert {o["spot_price"] for o in view["offerings"]} == {7.25}
    assert [p["provider"] for p in view["providers"]] == ["testcloud"]
    # The table and the figures of the kind answer in the core too, through the registry.
    probe = (
        "from spotd import registry; from spotd.market import catalog; "
        "print(registry.kind_of('testcloud').name, catalog.billed_seconds('testcloud', 61), "
        "catalog.facts('testcloud', 'tc.h100x8').gpu)"
    )
    probed = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True, text=True, check=False, env=env, timeout=120,
    )
    assert probed.stdout.split() == ["testcloud", "70.0", "H100"], probed.stderr


# -- no cloud names in the core ---------------------------------------------------

CLOUD_NAME = re.compile(
    r"(?<![A-Za-z0-9_])(aws|gcp|azure)(?![A-Za-z0-9_])|sim-|169\.254\.|metadata\.google",
    re.IGNORECASE,
)
SPOTD = ROOT / "spotd"
# `spotd simulate` names its simulated jobs "sim-<job>" (job names, not providers).
SIM_JOB_NAMES = {SPOTD / "simulate" / "world.py", SPOTD / "simulate" / "adapter.py"}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes (module, class, function), and of attribute docs."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                found.add(id(stmt.value))  # a docstring or an attribute's doc: prose
    return found


def cloud_literals(path: Path) -> list[str]:
    """``name:line: text`` of each string literal in ``path`` that names a cloud.

    A lookup by provider name uses a bare token: a name, a prefix, a key, a URL.
    Prose is left alone: docstrings, comments, and literals with a space in them
    (messages, and the documentation titles fabric_env.py cites as its sources,
    "AWS EC2 User Guide, ..."), which no lookup can use as a key.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = _docstrings(tree)
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in prose):  # fmt: skip
            match = None if re.search(r"\s", node.value) else CLOUD_NAME.search(node.value)
            if match and not (path in SIM_JOB_NAMES and match.group(0).lower() == "sim-"):
                hits.append((node.lineno, f"{path.name}:{node.lineno}: {node.value!r}"))
    return [hit for _, hit in sorted(hits)]


def test_no_cloud_names_in_the_core_code() -> None:
    # Code literals only: docstrings and comments may name clouds in prose, as examples
    # of kinds, and the templates are checked below. The provider packages live in
    # providers/, outside spotd/.
    hits = [hit for path in sorted(SPOTD.rglob("*.py")) for hit in cloud_literals(path)]
    assert not hits, "cloud names in spotd/ code:\n" + "\n".join(hits)


def test_no_cloud_names_in_the_boot_script_template() -> None:
    text = (SPOTD / "daemon" / "templates" / "bootstrap.sh.j2").read_text(encoding="utf-8")
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not CLOUD_NAME.search(code)


def test_the_cloud_name_check_sees_a_literal_and_skips_prose(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Docs may say aws."""\n# so may comments: gcp\n'
        'KIND = "aws"\nX = f"sim-{KIND}"\nY = "SPOTD_AGENT_AZURE_ACK"\n'
        'Z = "see the AWS guide"\nURL = "http://169.254.169.254"\n'
    )
    found = [h.split(": ", 1)[1] for h in cloud_literals(sample)]
    assert found == ["'aws'", "'sim-'", "'http://169.254.169.254'"]
