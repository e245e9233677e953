"""A loopback fake of the Kubernetes API server, for the real ``kubernetes`` client.

It serves the paths the kubernetes provider calls, with the JSON shapes of the API:

- GET ``/api/v1/nodes``, GET ``/api/v1/nodes/N``
- GET / POST ``/api/v1/namespaces/NS/pods`` (``labelSelector`` with ``k=v`` terms;
  409 ``AlreadyExists`` for a name taken)
- GET / DELETE ``/api/v1/namespaces/NS/pods/N``
- GET ``/api/v1/namespaces/NS/pods/N/log``
- POST ``/api/v1/namespaces/NS/pods/N/eviction``: the pod gets ``DisruptionTarget`` and a
  deletion timestamp; it is gone at the next read after the one that shows it so
- GET ``/api/v1/namespaces/NS/resourcequotas``
- GET ``/api/v1/namespaces/NS/events`` (:attr:`KubeFake.events`)
- POST ``/apis/authorization.k8s.io/v1/selfsubjectaccessreviews``: allowed unless in
  :attr:`KubeFake.denied`

A small scheduler binds a created pod at once to a node that satisfies its required
node affinity (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``), tolerates the node's
``NoSchedule`` taints, is not cordoned, and has the GPUs the pod asks free; a bound pod
is Running with its own pod IP. A pod with no such node stays Pending with
``PodScheduled=False``, reason ``Unschedulable``, as the real scheduler leaves it.

Levers: :meth:`KubeFake.fail_next_create` (an HTTP error of the next pod create),
:meth:`KubeFake.remove_node` (a node reclaimed: it and its pods go),
:meth:`KubeFake.cordon`, :meth:`KubeFake.disrupt` (``DisruptionTarget`` on a pod),
:meth:`KubeFake.finish` (the pod's container exits), :attr:`KubeFake.no_room`,
:attr:`KubeFake.quotas`,
:attr:`KubeFake.logs`. Every request is recorded in :attr:`KubeFake.requests`.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

GPU = "nvidia.com/gpu"
CREATED = "2026-12-01T00:00:00Z"


@dataclass(frozen=True)
class Seen:
    """One request the fake answered."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any


def node(name: str, labels: Mapping[str, str], gpus: int,
         extra: Mapping[str, int] | None = None,
         provider_id: str = "") -> dict[str, Any]:  # fmt: skip
    """A GPU node's JSON, with ``gpus`` and the ``extra`` device resources allocatable,
    and ``spec.providerID`` when given (``aws:///us-east-1a/i-0abc``)."""
    allocatable = {"cpu": "96", "memory": "1000Gi", GPU: str(gpus)}
    allocatable.update({k: str(v) for k, v in (extra or {}).items()})
    if gpus == 0:
        del allocatable[GPU]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels), "creationTimestamp": CREATED},
            "spec": {"providerID": provider_id} if provider_id else {},
            "status": {"allocatable": allocatable, "capacity": dict(allocatable)}}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip


class KubeFake:
    """The fake API server; :attr:`url` is its base URL once :meth:`start` ran."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.quotas: dict[str, list[dict[str, Any]]] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.requests: list[Seen] = []
        self._fail: list[tuple[int, str]] = []
        self.denied: set[tuple[str, str, str]] = set()
        """(namespace or "", resource[/subresource], verb) access reviews answer no to."""
        self.no_room = 0
        """Pod creates still to come that find every node full (a pool out of capacity)."""
        self._ips = itertools.count(2)
        self._lock = threading.RLock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- levers ---------------------------------------------------------------

    def fail_next_create(self, code: int, reason: str) -> None:
        """Answer the next pod create with this HTTP error."""
        self._fail.append((code, reason))

    def remove_node(self, name: str) -> None:
        """The node is reclaimed: it goes, and its pods with it (pod garbage collection)."""
        with self._lock:
            self.nodes.pop(name, None)
            for key, pod in list(self.pods.items()):
                if pod["spec"].get("nodeName") == name:
                    del self.pods[key]

    def cordon(self, name: str, taint: str | None = None) -> None:
        """``kubectl cordon`` (or a drain's taint ``taint``)."""
        with self._lock:
            spec = self.nodes[name]["spec"]
            spec["unschedulable"] = True
            if taint:
                spec.setdefault("taints", []).append({"key": taint, "effect": "NoSchedule"})

    def disrupt(self, namespace: str, name: str) -> None:
        """The pod gets the condition ``DisruptionTarget`` (a preemption or taint manager)."""
        with self._lock:
            self._condition(self.pods[(namespace, name)], "DisruptionTarget", "True",
                            "PreemptionByScheduler")  # fmt: skip

    def finish(self, namespace: str, name: str, exit_code: int,
               reason: str | None = None) -> None:  # fmt: skip
        """The pod's container exits with ``exit_code`` (``reason``: a Failed pod's)."""
        with self._lock:
            pod = self.pods[(namespace, name)]
            pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            if reason:
                pod["status"]["reason"] = reason
            pod["status"]["containerStatuses"] = [self._container(pod, {"terminated": {
                "exitCode": exit_code, "finishedAt": CREATED, "startedAt": CREATED}})]

    def pod_of(self, instance_id: str) -> dict[str, Any]:
        namespace, name = instance_id.split("/", 1)
        return self.pods[(namespace, name)]

    def created(self) -> list[dict[str, Any]]:
        """The bodies of every pod create the fake received, in order."""
        return [s.body for s in self.requests if s.method == "POST" and s.path.endswith("/pods")]

    # -- the scheduler ---------------------------------------------------------------

    def _schedule(self, pod: dict[str, Any]) -> None:
        want = int(pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
                   .get(GPU, "0"))  # fmt: skip
        full, self.no_room = self.no_room > 0, max(0, self.no_room - 1)
        for name, candidate in sorted(self.nodes.items()) if not full else ():
            if self._fits(pod, candidate) and self._free_gpus(name, candidate) >= want:
                pod["spec"]["nodeName"] = name
                pod["status"] = {
                    "phase": "Running", "podIP": f"10.8.0.{next(self._ips)}",
                    "startTime": CREATED,
                    "containerStatuses": [self._container(pod, {"running": {
                        "startedAt": CREATED}})],
                }  # fmt: skip
                self._condition(pod, "PodScheduled", "True", None)
                return
        pod["status"] = {"phase": "Pending"}
        self._condition(pod, "PodScheduled", "False", "Unschedulable",
                        f"0/{len(self.nodes)} nodes are available: insufficient {GPU}")

    def _fits(self, pod: dict[str, Any], candidate: dict[str, Any]) -> bool:
        spec = candidate["spec"]
        if spec.get("unschedulable"):
            return False
        tolerated = {(t.get("key"), t.get("value")) for t in pod["spec"].get("tolerations", [])}
        keys = {k for k, _ in tolerated}
        for taint in spec.get("taints", []):
            if taint.get("effect") == "NoSchedule" and taint["key"] not in keys:
                return False
        labels = candidate["metadata"]["labels"]
        affinity = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
        terms = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}) \
            .get("nodeSelectorTerms", [])
        return not terms or any(_matches(t.get("matchExpressions", []), labels) for t in terms)

    def _free_gpus(self, name: str, candidate: dict[str, Any]) -> int:
        used = sum(
            int(p["spec"]["containers"][0].get("resources", {}).get("limits", {}).get(GPU, "0"))
            for p in self.pods.values()
            if p["spec"].get("nodeName") == name
            and p["status"].get("phase") not in ("Succeeded", "Failed")
        )  # fmt: skip
        return int(candidate["status"]["allocatable"].get(GPU, "0")) - used

    @staticmethod
    def _condition(pod: dict[str, Any], kind: str, status: str, reason: str | None,
                   message: str | None = None) -> None:  # fmt: skip
        conditions = [c for c in pod["status"].get("conditions", []) if c["type"] != kind]
        entry = {"type": kind, "status": status, "lastTransitionTime": CREATED}
        if reason:
            entry["reason"] = reason
        if message:
            entry["message"] = message
        pod["status"]["conditions"] = [*conditions, entry]

    @staticmethod
    def _container(pod: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        container = pod["spec"]["containers"][0]
        return {"name": container["name"], "image": container.get("image", ""),
                "imageID": "", "ready": "running" in state, "restartCount": 0,
                "state": state}  # fmt: skip

    # -- serving ---------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: Any) -> tuple[int, Any]:  # fmt: skip
        """One request: (status, JSON body or text)."""
        self.requests.append(Seen(method, path, query, body))
        parts = path.strip("/").split("/")
        with self._lock:
            if parts == ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]:
                return 201, self._review(body)
            if parts[:3] == ["api", "v1", "nodes"]:
                return self._nodes(parts[3:])
            if parts[:3] == ["api", "v1", "namespaces"] and len(parts) >= 5:
                return self._namespaced(method, parts[3], parts[4:], query, body)
        return 404, _status(404, "NotFound", f"no route {path}")

    def _review(self, body: dict[str, Any]) -> dict[str, Any]:
        asked = body["spec"]["resourceAttributes"]
        resource = asked["resource"] + (f"/{asked['subresource']}" if asked.get("subresource")
                                        else "")  # fmt: skip
        key = (asked.get("namespace", ""), resource, asked["verb"])
        return {**body, "status": {"allowed": key not in self.denied}}

    def _nodes(self, rest: list[str]) -> tuple[int, Any]:
        if not rest:
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {},
                         "items": list(self.nodes.values())}  # fmt: skip
        found = self.nodes.get(rest[0])
        if found is None:
            return 404, _status(404, "NotFound", f'nodes "{rest[0]}" not found')
        return 200, found

    def _namespaced(self, method: str, namespace: str, rest: list[str],
                    query: dict[str, list[str]], body: Any) -> tuple[int, Any]:  # fmt: skip
        kind = rest[0]
        if kind == "resourcequotas":
            return 200, {"kind": "ResourceQuotaList", "apiVersion": "v1", "metadata": {},
                         "items": self.quotas.get(namespace, [])}  # fmt: skip
        if kind == "events":
            return 200, {"kind": "EventList", "apiVersion": "v1", "metadata": {},
                         "items": self.events.get(namespace, [])}  # fmt: skip
        if kind != "pods":
            return 404, _status(404, "NotFound", f"no {kind} here")
        if len(rest) == 1:
            return self._create(namespace, body) if method == "POST" \
                else self._list(namespace, query)
        return self._pod(method, namespace, rest[1], rest[2:])

    def _create(self, namespace: str, body: dict[str, Any]) -> tuple[int, Any]:
        if self._fail:
            code, reason = self._fail.pop(0)
            return code, _status(code, reason, f"the fake refuses: {reason}")
        name = body["metadata"]["name"]
        if (namespace, name) in self.pods:
            return 409, _status(409, "AlreadyExists", f'pods "{name}" already exists')
        pod = json.loads(json.dumps(body))
        pod["metadata"].update(namespace=namespace, uid=f"uid-{name}",
                               creationTimestamp=CREATED, resourceVersion="1")  # fmt: skip
        pod["status"] = {}
        self._schedule(pod)
        self.pods[(namespace, name)] = pod
        return 201, pod

    def _list(self, namespace: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        wanted = dict(term.split("=", 1) for term in (query.get("labelSelector") or [""])[0]
                      .split(",") if term)  # fmt: skip
        items = [p for (ns, _), p in sorted(self.pods.items()) if ns == namespace
                 and wanted.items() <= p["metadata"].get("labels", {}).items()]  # fmt: skip
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}

    def _pod(self, method: str, namespace: str, name: str, rest: list[str]) -> tuple[int, Any]:
        key = (namespace, name)
        pod = self.pods.get(key)
        if pod is not None and pod.get("_leaving") == 0 and method == "GET" and not rest:
            del self.pods[key]  # the eviction's grace period is over
            pod = None
        if pod is None:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        if rest == ["log"]:
            return 200, self.logs.get(key, "")
        if rest == ["eviction"] and method == "POST":
            self._condition(pod, "DisruptionTarget", "True", "EvictionByEvictionAPI")
            pod["metadata"]["deletionTimestamp"] = CREATED
            pod["_leaving"] = 1
            return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
        if method == "DELETE":
            del self.pods[key]
            return 200, pod
        if pod.get("_leaving"):
            pod["_leaving"] -= 1
        return 200, {k: v for k, v in pod.items() if not k.startswith("_")}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                code, answer = fake.handle(self.command, url.path, parse_qs(url.query), body)
                if isinstance(answer, str):
                    data, kind = answer.encode(), "text/plain"
                else:
                    data, kind = json.dumps(answer).encode(), "application/json"
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def _matches(expressions: list[dict[str, Any]], labels: Mapping[str, str]) -> bool:
    for e in expressions:
        key, op, values = e["key"], e["operator"], e.get("values", [])
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True
