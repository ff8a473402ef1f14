"""A stand-in Kubernetes API server, just enough for the real Helm library to install a chart.

There is no cluster on this machine. Helm renders a chart only as part of an install, so the
tests point the real Helm library (helm-sdkpy) at this server: it answers discovery for the
kinds the chart uses, accepts creates and updates, and keeps what it was sent; Helm's install
result then carries the rendered manifests, hooks and `helm test` pods included, for the tests
to validate against the Kubernetes schemas. Nothing here does what a real API server would
(admission, defaulting, controllers): that cannot run on this machine.
"""
from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import yaml

KUBE_MINOR = 31

# group/version -> [(plural, kind, namespaced)]
RESOURCES: dict[str, list[tuple[str, str, bool]]] = {
    "v1": [("configmaps", "ConfigMap", True), ("secrets", "Secret", True),
           ("services", "Service", True), ("serviceaccounts", "ServiceAccount", True),
           ("persistentvolumeclaims", "PersistentVolumeClaim", True), ("pods", "Pod", True),
           ("namespaces", "Namespace", False)],
    "apps/v1": [("statefulsets", "StatefulSet", True), ("deployments", "Deployment", True)],
    "batch/v1": [("cronjobs", "CronJob", True), ("jobs", "Job", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "monitoring.coreos.com/v1": [("servicemonitors", "ServiceMonitor", True)],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _resource_list(gv: str) -> dict:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
            "resources": [{"name": p, "singularName": k.lower(), "namespaced": ns, "kind": k,
                           "verbs": VERBS} for p, k, ns in RESOURCES[gv]]}


def _group_list() -> dict:
    groups = []
    for gv in RESOURCES:
        if "/" in gv:
            group, version = gv.split("/")
            v = {"groupVersion": gv, "version": version}
            groups.append({"name": group, "versions": [v], "preferredVersion": v})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


class FakeKube:
    """Serves on loopback until closed; `objects` maps an object's API path to its body."""

    def __init__(self) -> None:
        self.objects: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def kubeconfig(self, namespace: str = "default") -> str:
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                       "namespace": namespace}}]})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:     # quiet: the tests print what matters
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _not_found(self, path: str) -> None:
                self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                 "reason": "NotFound", "code": 404,
                                 "message": f"{path} not found"})

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                if "protobuf" in (self.headers.get("Content-Type") or ""):
                    return _secret_from_protobuf(raw)   # Helm's release storage (typed client)
                return json.loads(raw or b"{}")

            def do_GET(self) -> None:
                path = urlparse(self.path).path.rstrip("/")
                if path == "/version":
                    return self._send(200, {"major": "1", "minor": str(KUBE_MINOR),
                                            "gitVersion": f"v1.{KUBE_MINOR}.0",
                                            "platform": "linux/amd64"})
                if path == "/api":
                    return self._send(200, {"kind": "APIVersions", "versions": ["v1"],
                                            "serverAddressByClientCIDRs": []})
                if path == "/apis":
                    return self._send(200, _group_list())
                if path == "/api/v1":
                    return self._send(200, _resource_list("v1"))
                if path.startswith("/apis/") and path.count("/") == 3:
                    gv = path[len("/apis/"):]
                    if gv in RESOURCES:
                        return self._send(200, _resource_list(gv))
                    return self._not_found(path)
                with fake.lock:
                    if path in fake.objects:
                        return self._send(200, fake.objects[path])
                    prefix = path + "/"
                    items = [o for p, o in fake.objects.items()
                             if p.startswith(prefix) and "/" not in p[len(prefix):]]
                last = path.rsplit("/", 1)[-1]
                if any(last == plural for rs in RESOURCES.values() for plural, _, _ in rs):
                    query = urlparse(self.path).query
                    if "labelSelector" in query:
                        items = [o for o in items if _matches(o, query)]
                    return self._send(200, {"kind": "List", "apiVersion": "v1",
                                            "metadata": {"resourceVersion": "1"}, "items": items})
                return self._not_found(path)

            def do_POST(self) -> None:
                path = urlparse(self.path).path.rstrip("/")
                body = self._body()
                meta = body.setdefault("metadata", {})
                meta.setdefault("uid", str(uuid.uuid4()))
                meta["resourceVersion"] = str(time.monotonic_ns())
                meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ"))
                with fake.lock:
                    fake.objects[f"{path}/{meta['name']}"] = body
                self._send(201, body)

            def do_PUT(self) -> None:
                path = urlparse(self.path).path.rstrip("/")
                body = self._body()
                body.setdefault("metadata", {})["resourceVersion"] = str(time.monotonic_ns())
                with fake.lock:
                    fake.objects[path] = body
                self._send(200, body)

            def do_PATCH(self) -> None:
                path = urlparse(self.path).path.rstrip("/")
                with fake.lock:
                    current = fake.objects.get(path)
                if current is None:
                    return self._not_found(path)
                self._send(200, current)

            def do_DELETE(self) -> None:
                path = urlparse(self.path).path.rstrip("/")
                with fake.lock:
                    gone = fake.objects.pop(path, None)
                if gone is None:
                    return self._not_found(path)
                self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

        return Handler


def _matches(obj: dict, query: str) -> bool:
    """labelSelector=a=b,c=d (equality terms only: what Helm's release storage asks)."""
    from urllib.parse import parse_qs
    selector = parse_qs(query).get("labelSelector", [""])[0]
    labels = obj.get("metadata", {}).get("labels", {})
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value.lstrip("="):
            return False
    return True


def _fields(buf: bytes):
    """(field number, value) pairs of one protobuf message; length-delimited values as bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"protobuf wire type {wire} not expected")
        yield field, value


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return out, i


def _secret_from_protobuf(raw: bytes) -> dict:
    """A Secret sent as Kubernetes protobuf ("k8s\\0" + runtime.Unknown) as its JSON form."""
    if not raw.startswith(b"k8s\x00"):
        raise ValueError("not a Kubernetes protobuf envelope")
    inner = dict(_fields(raw[4:]))[2]                 # runtime.Unknown.raw
    meta: dict = {}
    data: dict = {}
    out: dict = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": data}
    for field, value in _fields(inner):
        if field == 1:                                # ObjectMeta
            for f, v in _fields(value):
                if f in (1, 3):
                    meta["name" if f == 1 else "namespace"] = v.decode()
                elif f in (11, 12):                   # labels, annotations (map entries)
                    entry = dict(_fields(v))
                    meta.setdefault("labels" if f == 11 else "annotations", {})[
                        entry.get(1, b"").decode()] = entry.get(2, b"").decode()
        elif field == 2:                              # data: map<string, bytes>
            entry = dict(_fields(value))
            data[entry.get(1, b"").decode()] = base64.b64encode(entry.get(2, b"")).decode()
        elif field == 3:
            out["type"] = value.decode()
    return out
