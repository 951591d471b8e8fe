"""What Kubernetes does with the exported objects, for tests without a cluster.

* Schemas: core kinds against the Kubernetes OpenAPI schemas that `kubernetes-validate` ships
  (strict: an unknown field is an error, as `kubectl apply --validate=strict` says); the
  DisaggregatedSet and LeaderWorkerSet against the `openAPIV3Schema` of the lws CRDs in
  tests/fixtures/k8s (SOURCES.md), made strict the same way; the pod templates they embed
  also against the core PodTemplate schema of the Kubernetes release below.
* The kubelet's `$(VAR)` expansion of command, args and env values: a port of kubernetes
  third_party/forked/golang/expansion/expand.go (kubernetes/kubernetes@fde22c3f).
* The variables and labels LWS gives each pod: lws v0.10.0 pkg/utils/pod/pod_utils.go
  (AddLWSVariables) and api/leaderworkerset/v1/leaderworkerset_types.go.
"""

from __future__ import annotations

import copy
import lzma
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "k8s"
# A Kubernetes release LWS v0.10 supports; the schemas ship inside kubernetes-validate.
K8S_VERSION = "1.31"
CRDS = {
    ("disaggregatedset.x-k8s.io/v1", "DisaggregatedSet"): [
        "lws-v0.9.0-disaggregatedset.x-k8s.io_disaggregatedsets.yaml.xz",
        "lws-v0.10.0-disaggregatedset.x-k8s.io_disaggregatedsets.yaml.xz",
    ],
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): [
        "lws-v0.10.0-leaderworkerset.x-k8s.io_leaderworkersets.yaml.xz",
    ],
}

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # DNS-1035 (Service names too)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
# IANA_SVC_NAME (container and Service port names): 15 characters, a letter, no "--".
PORT_NAME = re.compile(r"^(?=.{1,15}$)(?=.*[a-z])(?!.*--)[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever it lists the known ones."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@cache
def crd_validator(fixture: str) -> jsonschema.protocols.Validator:
    with lzma.open(FIXTURES / fixture) as f:
        crd = yaml.load(f.read(), Loader=yaml.CSafeLoader)
    (version,) = [v for v in crd["spec"]["versions"] if v["served"]]
    schema = strict(version["schema"]["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)  # once: jsonschema.validate would redo it on every call
    return cls(schema)


def pod_templates(obj: dict) -> list[dict]:
    """Every pod template inside an exported object."""
    kind = obj["kind"]
    if kind == "Deployment":
        return [obj["spec"]["template"]]
    if kind not in ("DisaggregatedSet", "LeaderWorkerSet"):
        return []
    specs = (
        [r["spec"] for r in obj["spec"]["roles"]] if kind == "DisaggregatedSet" else [obj["spec"]]
    )
    out = []
    for spec in specs:
        lwt = spec["leaderWorkerTemplate"]
        out += [lwt[k] for k in ("leaderTemplate", "workerTemplate") if k in lwt]
    return out


def validate(obj: dict) -> None:
    """Raise (jsonschema.ValidationError or kubernetes_validate's) unless `obj` is valid."""
    key = (obj["apiVersion"], obj["kind"])
    if key in CRDS:
        for fixture in CRDS[key]:
            crd_validator(fixture).validate(obj)
        for template in pod_templates(obj):
            kubernetes_validate.validate(
                {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                 "template": template},
                K8S_VERSION,
                strict=True,
            )  # fmt: skip
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    check_names(obj)


def check_names(obj: dict) -> None:
    """What the API server checks beyond the schema: names, label syntax, port names."""
    assert DNS_LABEL.match(obj["metadata"]["name"]), obj["metadata"]["name"]
    metas = [obj["metadata"], *(t["metadata"] for t in pod_templates(obj))]
    for meta in metas:
        for k, v in meta.get("labels", {}).items():
            assert LABEL_KEY.match(k) and LABEL_VALUE.match(v), (k, v)
    for template in pod_templates(obj):
        for c in template["spec"]["containers"]:
            names = [p["name"] for p in c.get("ports", [])]
            assert len(names) == len(set(names)), names
            assert all(PORT_NAME.match(n) for n in names), names
            assert all(ENV_NAME.match(e["name"]) for e in c.get("env", []))
    if obj["kind"] == "Service":
        assert all(PORT_NAME.match(p["name"]) for p in obj["spec"]["ports"])


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of `$(NAME)` (expand.go Expand + MappingFuncFor): a defined
    variable is replaced, an undefined one kept as written, `$$` becomes `$`."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(value):
        if value[cursor] == "$" and cursor + 1 < len(value):
            out.append(value[checkpoint:cursor])
            rest = value[cursor + 1 :]
            if rest[0] == "$":
                read, is_var, advance = "$", False, 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close == -1:
                    read, is_var, advance = "$(", False, 1
                else:
                    read, is_var, advance = rest[1:close], True, close + 1
            else:
                read, is_var, advance = "$" + rest[0], False, 1
            out.append(env.get(read, f"$({read})") if is_var else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + value[checkpoint:]


def lws_pod(template: dict, *, lws: str, group: int, worker: int, size: int, ns: str) -> dict:
    """The pod LWS creates from a template: its worker-index label, and LWS_LEADER_ADDRESS,
    LWS_GROUP_SIZE, LWS_WORKER_INDEX first in every container's env (AddLWSVariables; the
    leader address is `<lws>-<group>.<subdomain = lws>.<namespace>`)."""
    pod = copy.deepcopy(template)
    pod["metadata"].setdefault("labels", {})["leaderworkerset.sigs.k8s.io/worker-index"] = str(
        worker
    )
    injected = [
        {"name": "LWS_LEADER_ADDRESS", "value": f"{lws}-{group}.{lws}.{ns}"},
        {"name": "LWS_GROUP_SIZE", "value": str(size)},
        {"name": "LWS_WORKER_INDEX", "value": str(worker)},
    ]
    for c in pod["spec"]["containers"]:
        names = {e["name"] for e in injected}
        c["env"] = injected + [e for e in c.get("env", []) if e["name"] not in names]
    return pod


def resolved_env(container: dict, pod_ip: str, namespace: str) -> dict[str, str]:
    """The container's variables as the kubelet sets them (downward API and expansion of
    each value against the variables before it); secrets as a marker naming their key."""
    env: dict[str, str] = {}
    fields = {"status.podIP": pod_ip, "metadata.namespace": namespace}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
        elif "fieldRef" in e["valueFrom"]:
            env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = f"<secret {ref['name']}/{ref['key']}>"
    return env


def command_line(container: dict, env: dict[str, str]) -> list[str]:
    """command + args after the kubelet's expansion."""
    return [expand(w, env) for w in [*container.get("command", []), *container.get("args", [])]]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """vllm-router's test (src/service_discovery.rs PodInfo::matches_selector): every key."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())
