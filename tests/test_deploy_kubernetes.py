"""The chart with ``deploy/helm/spotd-kubernetes-values.yaml``: the daemons run jobs as pods
on their own cluster, with a service account limited to the jobs' namespaces.

Rendered by Helm's own SDK (PyPI ``helm-python-sdk``) and checked against the Kubernetes
schemas (``kubernetes-validate``); each test skips with its reason without them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotd.daemon.config import load_settings
from spotd_kubernetes import KubernetesSettings

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "spotd"
VALUES = ROOT / "deploy" / "helm" / "spotd-kubernetes-values.yaml"
KUBE_VERSION = "1.30.0"


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    helm = pytest.importorskip("helm_python", reason="PyPI helm-python-sdk is not installed")
    values = yaml.safe_load(VALUES.read_text(encoding="utf-8"))
    with helm.Chart.load(str(CHART)) as chart:
        manifests: dict[str, str] = chart.render(values, name="spotd", namespace="spotd")
    return [doc for path, text in sorted(manifests.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]  # fmt: skip


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_the_service_account_may_read_nodes_and_run_pods_in_the_jobs_namespaces_only(
    objects: list[dict[str, Any]],
) -> None:
    (cluster_role,) = of_kind(objects, "ClusterRole")
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    roles = of_kind(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["spotd-jobs", "team-vision"]
    granted = {res: set(rule["verbs"]) for rule in roles[0]["rules"] for res in rule["resources"]}
    assert granted["pods"] == {"get", "list", "watch", "create", "delete"}
    assert granted["pods/eviction"] == {"create"} and granted["pods/log"] == {"get"}
    assert "secrets" not in granted and "nodes" not in granted
    (sa,) = of_kind(objects, "ServiceAccount")
    for binding in [*of_kind(objects, "RoleBinding"), *of_kind(objects, "ClusterRoleBinding")]:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                        "namespace": "spotd"}]  # fmt: skip
    (deployment,) = of_kind(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is True


def test_the_rendered_objects_are_valid_kubernetes(objects: list[dict[str, Any]]) -> None:
    kv = pytest.importorskip("kubernetes_validate",
                             reason="PyPI kubernetes-validate is not installed")  # fmt: skip
    for obj in objects:
        kv.validate(obj, KUBE_VERSION, strict=True)


def test_the_rendered_config_enables_the_kubernetes_provider(
    objects: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (config_map,) = of_kind(objects, "ConfigMap")
    config = tmp_path / "spotd.toml"
    config.write_text(config_map["data"]["spotd.toml"])
    for key in [k for k in os.environ if k.startswith("SPOTD_")]:
        monkeypatch.delenv(key)
    settings = load_settings(config)
    assert [k.name for k, _ in settings.providers.enabled_kinds()] == ["kubernetes"]
    table = settings.providers.enabled_kinds()[0][1]
    assert isinstance(table, KubernetesSettings)
    assert table.auth == "in-cluster" and table.namespace_of("vision") == "team-vision"


def test_the_chart_mounts_no_token_without_the_provider() -> None:
    helm = pytest.importorskip("helm_python", reason="PyPI helm-python-sdk is not installed")
    values = {"database": {"url": "postgresql+psycopg://spotd:pw@db:5432/spotd"}}
    with helm.Chart.load(str(CHART)) as chart:
        manifests: dict[str, str] = chart.render(values, name="spotd", namespace="spotd")
    rendered = [doc for path, text in manifests.items() if path.endswith(".yaml")
                for doc in yaml.safe_load_all(text) if doc]  # fmt: skip
    (deployment,) = of_kind(rendered, "Deployment")
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert of_kind(rendered, "ClusterRole") == [] and of_kind(rendered, "Role") == []
