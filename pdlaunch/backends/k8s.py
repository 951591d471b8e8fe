"""Kubernetes manifests for the deployment a `Plan` describes (`pdlaunch export k8s`).

Every engine container runs the plan's argv and env. Only what names one machine is replaced,
by what Kubernetes gives the pod instead (docs/k8s-export.md lists each replacement with its
source):

* the host a process runs on: the pod's IP (downward API) or the LWS group leader's address;
* a worker node's `--data-parallel-start-rank`: `LWS_WORKER_INDEX` x DP ranks per node;
* device pinning (`CUDA_VISIBLE_DEVICES`, ...): a device-plugin resource limit;
* the router's `--prefill URL` / `--decode URL`: vllm-router's Kubernetes service discovery.

Prefill and decode are one LeaderWorkerSet template each (replicas = instances, size = nodes
per instance), inside a DisaggregatedSet (lws >= 0.9) or as two plain LeaderWorkerSets. Pure
functions from the plan; `k8s_files` writes them, one YAML file per object.
"""

from __future__ import annotations

import copy
import hashlib
import re
import shlex
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from pdlaunch import facts
from pdlaunch.addresses import is_unspecified
from pdlaunch.nodeenv import VISIBLE_DEVICE_VARS
from pdlaunch.plan import Plan, Process, ProcessRole
from pdlaunch.ports import PortKind

Target = Literal["disaggregatedset", "lws"]
TARGETS: tuple[Target, ...] = ("disaggregatedset", "lws")
Manifest = dict[str, Any]
ImageChoice = str | Mapping[str, str] | None

# kubernetes-sigs/lws v0.10.0 (docs/k8s-export.md): api/disaggregatedset/v1/
# groupversion_info.go and api/leaderworkerset/v1/groupversion_info.go.
DS_API_VERSION = "disaggregatedset.x-k8s.io/v1"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
# api/leaderworkerset/v1/leaderworkerset_types.go: the label every LWS pod carries ("0" on the
# leader), and variables pkg/utils/pod/pod_utils.go (AddLWSVariables) puts in every container.
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"

# Extended resources the vendors' device plugins advertise, one unit per device: NVIDIA
# k8s-device-plugin, the Intel Gaudi device plugin, the Ascend device plugin (910 and 910B).
# A CPU instance asks for none: its cores are the kubelet's to give.
DEVICE_RESOURCES: dict[str, str | None] = {
    "cuda": "nvidia.com/gpu",
    "hpu": "habana.ai/gaudi",
    "npu": "huawei.com/Ascend910",
    "cpu": None,
}
# Default images per device kind for the plan's vLLM series ({series}: "0.32" -> v0.32.0).
# None: no public image pairs that device's vLLM plugin with a given vLLM release (Gaudi
# images follow Intel Gaudi software releases), so the caller names one; Ascend is never
# exported (Mooncake, see build()).
DEFAULT_IMAGES: dict[str, str | None] = {
    # {version}: the release of the instance's vLLM facts (its vllm_version's series).
    "cuda": "vllm/vllm-openai:v{version}",
    "cpu": "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v{version}",
    "hpu": None,
    "npu": None,
}
# The router version pdlaunch's router facts were generated from (pdlaunch/facts/).
DEFAULT_ROUTER_IMAGE = "vllm/vllm-router:v{version}"

# Names of derived objects must stay within 63 characters: a DisaggregatedSet names its
# LeaderWorkerSets <name>-<slice>-<8-hex revision>-<role> (lws pkg/utils/disaggregatedset/
# utils.go), LWS names the worker StatefulSet of group g <lws>-<g>, and the StatefulSet
# controller labels pods <statefulset>-<10-char hash>.
MAX_NAME = 28

# The variables the plan derives for one machine's devices, cores or interfaces. In a pod the
# device plugin exposes only the pod's own devices (renumbered from 0) and the kubelet owns
# the cores, so the host's values would point at the wrong ones.
_HOST_BOUND_ENV: dict[str, str] = {
    **{var: "the device plugin exposes only the pod's own devices" for var in VISIBLE_DEVICE_VARS},
    "VLLM_CPU_OMP_THREADS_BIND": "the kubelet assigns a pod's cores; vLLM binds within them",
}
# nodeenv.py pins UCX to loopback for instances that share one machine; pods talk over the
# pod network.
_LOOPBACK_UCX = ("UCX_NET_DEVICES", "lo")
# Where the NIXL side channel listens and what decode dials (nixl/base_scheduler.py:348).
_SIDE_CHANNEL_HOST = "VLLM_NIXL_SIDE_CHANNEL_HOST"
_SIDE_CHANNEL_PORT = "VLLM_NIXL_SIDE_CHANNEL_PORT"
# Downward-API values a container can be given as variables.
_FIELD_REFS = {"POD_IP": "status.podIP", "POD_NAMESPACE": "metadata.namespace"}

_PORT_NAMES: dict[PortKind, str] = {
    "http": "http",
    "nixl_side_channel": "nixl",
    "dp_rpc": "dp-rpc",
    "mooncake_kv": "mooncake",
    "router_http": "http",
    "router_metrics": "metrics",
}
# IANA service name: what a container port's name must be (15 characters at most).
_PORT_NAME = re.compile(r"(?=.*[a-z])(?!.*--)[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?")

# vLLM, PyTorch and NCCL share tensors between processes through /dev/shm, which container
# runtimes cap at 64 MiB.
_SHM_VOLUME = {"name": "dshm", "emptyDir": {"medium": "Memory"}}
_SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}


class ExportError(Exception):
    """A plan, topology or option the export cannot turn into manifests; the message says
    what to change. Nothing is written when it is raised."""


@dataclass(frozen=True)
class EnvRef:
    """A variable the pod has when it starts (downward API, or injected by LWS)."""

    name: str


@dataclass(frozen=True)
class WorkerRank:
    """A worker node's `--data-parallel-start-rank`: LWS_WORKER_INDEX x DP ranks per node,
    the plan's `node_index x local DP size` (ports.nodes_of) with LWS's index for the node's."""

    per_node: int


Token = str | EnvRef | WorkerRank


@dataclass(frozen=True)
class RoleTemplate:
    role: ProcessRole
    instances: tuple[str, ...]
    size: int  # pods per instance: the leader and size - 1 workers
    leader: Manifest  # pod template
    worker: Manifest | None  # None when size == 1
    # Some nodes run headless (no HTTP): the router must pick leader pods only.
    leaders_only: bool

    @property
    def replicas(self) -> int:
        return len(self.instances)


@dataclass(frozen=True)
class Export:
    name: str
    target: Target
    objects: list[Manifest]
    # The Secret the pods read their secret variables from (keys: the `${env:NAME}` names);
    # None when the plan has no secrets. pdlaunch never writes its values.
    secret: str | None
    secret_keys: tuple[str, ...]
    # What differs from the plan and why (also written to index.md).
    notes: tuple[str, ...]


@dataclass(frozen=True)
class _Context:
    name: str
    vllm: dict[str, facts.Facts]  # per process name: the facts of the release it runs
    http_port: int
    secret: str


def k8s_name(deployment: str) -> str:
    """The deployment name as a Kubernetes name (DNS-1035 label) all derived names fit."""
    name = re.sub(r"[^a-z0-9-]+", "-", deployment.lower()).strip("-")
    if not name[:1].isalpha():
        name = f"pd-{name}".rstrip("-")
    if name == deployment and len(name) <= MAX_NAME:
        return name
    # A changed or shortened name keeps a digest of the original, so two deployments that
    # differ only in case or punctuation stay apart.
    digest = hashlib.sha256(deployment.encode()).hexdigest()[:5]
    return f"{name[: MAX_NAME - 6].rstrip('-')}-{digest}"


def labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/part-of": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "pdlaunch",
    }


def selector(name: str, role: RoleTemplate) -> dict[str, str]:
    """The pod labels that pick the pods of `role` serving HTTP (vllm-router matches every
    key, src/service_discovery.rs PodInfo::matches_selector)."""
    out = {k: v for k, v in labels(name, role.role).items() if k != "app.kubernetes.io/managed-by"}
    if role.leaders_only:
        out[WORKER_INDEX_LABEL] = "0"
    return out


# -- argv and env ----------------------------------------------------------------------------


def _literal(value: str) -> str:
    # The kubelet expands $(VAR) in command, args and env values, and reads $$ as $
    # (kubernetes third_party/forked/golang/expansion/expand.go): a plan value passes as is.
    return value.replace("$", "$$")


def _substitute(
    argv: list[str], args: list[facts.Arg], new: Mapping[str, Token], drop: frozenset[str]
) -> list[Token]:
    """`argv` with the values of the options in `new` replaced and those in `drop` removed."""
    at = {a.index: a for a in args if a.dest in new or a.dest in drop}
    out: list[Token] = []
    i = 0
    while i < len(argv):
        a = at.get(i)
        if a is None:
            out.append(argv[i])
            i += 1
            continue
        inline = "=" in argv[i]
        if a.dest in new:
            out += [a.spelling, new[a.dest or ""]]
        i += 1 if inline else 1 + len(a.values)
    return out


def _bind(proc: Process, bind: str, notes: dict[str, None]) -> EnvRef:
    # One address of its own machine: in a pod, that is the pod's IP (loopback would keep the
    # router and the probes out).
    notes[f"{proc.role}: --host {bind} becomes the pod's IP"] = None
    return EnvRef("POD_IP")


def _engine_argv(proc: Process, ctx: _Context, notes: dict[str, None]) -> list[Token]:
    args, _ = facts.scan(proc.argv, ctx.vllm[proc.name], start=1)
    opt = {a.dest: a for a in args if a.dest and a.values}
    new: dict[str, Token] = {}
    if "port" in opt:
        new["port"] = str(ctx.http_port)
    if "host" in opt and not is_unspecified(opt["host"].values[0]):
        new["host"] = _bind(proc, opt["host"].values[0], notes)
    if "data_parallel_address" in opt:
        new["data_parallel_address"] = EnvRef(LWS_LEADER_ADDRESS)
    if "data_parallel_start_rank" in opt:
        per_node = int(opt["data_parallel_size_local"].values[0])
        if int(opt["data_parallel_start_rank"].values[0]) != proc.node_index * per_node:
            raise ExportError(
                f"{proc.name}: --data-parallel-start-rank is not node index x "
                f"--data-parallel-size-local, which an LWS worker template cannot express"
            )
        new["data_parallel_start_rank"] = WorkerRank(per_node)
    return _substitute(proc.argv, args, new, frozenset())


def _command(
    argv: list[Token], path_prepend: Mapping[str, list[str]]
) -> tuple[list[str], list[str]]:
    """(command, args): the argv itself where the kubelet can resolve every reference, else
    a POSIX shell line (arithmetic for the start rank, prepending to an inherited path)."""
    if not path_prepend and not any(isinstance(t, WorkerRank) for t in argv):
        words = [_literal(t) if isinstance(t, str) else f"$({t.name})" for t in argv]
        return words[:1], words[1:]
    lines = [
        # Same form as templates/process.sh.j2: the image's own value stays after ours.
        f'export {var}={shlex.quote(":".join(dirs))}"${{{var}:+:${var}}}"'
        for var, dirs in path_prepend.items()
    ]
    # One option (with its value) per line, as render.command writes scripts for people.
    words: list[list[str]] = [[]]
    for i, t in enumerate(argv):
        if isinstance(t, str):
            if i > 0 and t.startswith("-") and words[-1]:
                words.append([])
            words[-1].append(shlex.quote(t))
        elif isinstance(t, EnvRef):
            words[-1].append(f'"${{{t.name}:?}}"')
        else:
            words[-1].append(f'"$(( ${{{LWS_WORKER_INDEX}:?}} * {t.per_node} ))"')
    lines.append("exec " + " \\\n    ".join(" ".join(w) for w in words))
    return ["/bin/sh", "-c"], [_literal("\n".join(lines) + "\n")]


def _field_ref(var: str) -> Manifest:
    return {"name": var, "valueFrom": {"fieldRef": {"fieldPath": _FIELD_REFS[var]}}}


def _env(proc: Process, argv: list[Token], secret: str, notes: dict[str, None]) -> list[Manifest]:
    refs = {t.name for t in argv if isinstance(t, EnvRef)}
    out = [_field_ref(var) for var in _FIELD_REFS if var in refs]
    for var, value in proc.env.items():
        if var in _HOST_BOUND_ENV:
            notes[f"{var} is not set in pods: {_HOST_BOUND_ENV[var]}"] = None
        elif (var, value) == _LOOPBACK_UCX:
            notes[
                f"{var}={value} is not set in pods: pods reach each other over the pod network"
            ] = None
        elif var == _SIDE_CHANNEL_HOST:
            out.append({"name": var, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        else:
            out.append({"name": var, "value": _literal(value)})
    for var, source in proc.secret_env.items():
        out.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": source}}})
    return out


def _ports(proc: Process, ctx: _Context, side_channels: bool) -> list[Manifest]:
    kept = [p for p in proc.ports if side_channels or p.kind != "nixl_side_channel"]
    count = Counter(p.kind for p in kept)
    seen: Counter[str] = Counter()
    out = []
    for p in kept:
        name = _PORT_NAMES[p.kind]
        if count[p.kind] > 1:
            name = f"{name}-{seen[p.kind]}"
            seen[p.kind] += 1
        if not _PORT_NAME.fullmatch(name):
            raise ExportError(f"{proc.name}: {name!r} is not a valid container port name")
        port = ctx.http_port if p.kind == "http" else p.port
        out.append({"name": name, "containerPort": port, "protocol": "TCP"})
    return out


def _probes(health_url: str, startup: bool) -> Manifest:
    get = {"path": urlsplit(health_url).path or "/", "port": "http"}
    out: Manifest = {}
    if startup:
        # Loading weights (and compiling) takes minutes to an hour; liveness starts after it.
        out["startupProbe"] = {"httpGet": get, "periodSeconds": 10, "failureThreshold": 360}
    out["readinessProbe"] = {"httpGet": get, "periodSeconds": 10, "failureThreshold": 3}
    # A busy engine answers /health late; restart only after two minutes without an answer.
    out["livenessProbe"] = {
        "httpGet": get,
        "periodSeconds": 30,
        "timeoutSeconds": 10,
        "failureThreshold": 4,
    }
    return out


def _engine_container(
    proc: Process, ctx: _Context, image: str, side_channels: bool, notes: dict[str, None]
) -> Manifest:
    argv = _engine_argv(proc, ctx, notes)
    command, args = _command(argv, proc.path_prepend)
    container: Manifest = {
        "name": "vllm",
        "image": image,
        "command": command,
        "args": args,
        "env": _env(proc, argv, ctx.secret, notes),
        "ports": _ports(proc, ctx, side_channels),
    }
    resource = DEVICE_RESOURCES[proc.device or "cpu"]
    if resource:
        container["resources"] = {"limits": {resource: len(proc.devices)}}
    if proc.health_url:
        container.update(_probes(proc.health_url, startup=True))
    container["volumeMounts"] = [_SHM_MOUNT]
    return container


def _pod_template(container: Manifest, pod_labels: dict[str, str]) -> Manifest:
    return {
        "metadata": {"labels": dict(pod_labels)},
        "spec": {"containers": [container], "volumes": [_SHM_VOLUME]},
    }


# -- roles -----------------------------------------------------------------------------------


def _instances(plan: Plan, role: ProcessRole) -> list[list[Process]]:
    groups: dict[str, list[Process]] = {}
    for p in plan.by_role(role):
        groups.setdefault(p.instance, []).append(p)
    return [sorted(nodes, key=lambda p: p.node_index) for nodes in groups.values()]


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{path}.{key}".lstrip("."))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return path or "(all)"


def _shape(container: Manifest) -> Manifest:
    """The container without the NIXL side-channel base, which the plan allocates per
    machine (ports.side_channel_bases) and which a pod, having its own address, may share."""
    out = copy.deepcopy(container)
    for e in out["env"]:
        if e["name"] == _SIDE_CHANNEL_PORT:
            e["value"] = "*"
    for p in out["ports"]:
        if p["name"].startswith(_PORT_NAMES["nixl_side_channel"]):
            p["containerPort"] = 0
    return out


def _image(device: str, image: ImageChoice, release: facts.Facts) -> str:
    if isinstance(image, str):
        return image
    if image is not None and device in image:
        return image[device]
    default = DEFAULT_IMAGES[device]
    if default is None:
        raise ExportError(
            f"no default image for {device} instances: name one "
            f"(image={{'{device}': 'REGISTRY/IMAGE:TAG'}}; docs/k8s-export.md)"
        )
    return default.format(version=release.version)


def _role(
    plan: Plan, role: ProcessRole, ctx: _Context, image: ImageChoice, notes: dict[str, None]
) -> RoleTemplate:
    shapes = []
    for nodes in _instances(plan, role):
        img = _image(nodes[0].device or "cpu", image, ctx.vllm[nodes[0].name])
        leader = _engine_container(nodes[0], ctx, img, True, notes)
        # Worker k listens on side channels base + k x ranks per node: one template lists
        # them only when there is one worker.
        listed = len(nodes) == 2
        workers = [_engine_container(n, ctx, img, listed, notes) for n in nodes[1:]]
        for n, w in zip(nodes[2:], workers[1:], strict=True):
            if w != workers[0]:
                where = _first_difference(workers[0], w)
                raise ExportError(f"{n.name} differs from {nodes[1].name} in {where}")
        if len(nodes) > 2:
            notes[
                f"{role}: the worker template lists no NIXL side-channel ports (each worker "
                f"listens on its own ranks' ports; containerPorts are informational)"
            ] = None
        shapes.append((nodes, leader, workers[0] if workers else None))
    first_nodes, leader, worker = shapes[0]
    for nodes, other_leader, other_worker in shapes[1:]:
        mine = (len(first_nodes), _shape(leader), worker and _shape(worker))
        theirs = (len(nodes), _shape(other_leader), other_worker and _shape(other_worker))
        if mine != theirs:
            where = (
                "the number of nodes"
                if mine[0] != theirs[0]
                else _first_difference(mine[1:], theirs[1:])
            )
            raise ExportError(
                f"{role} instances {first_nodes[0].instance} and {nodes[0].instance} differ "
                f"({where}): a role is one pod template for all its instances; give them the "
                f"same settings"
            )
        if (leader, worker) != (other_leader, other_worker):
            notes[
                f"{role}: instance {nodes[0].instance} has another NIXL side-channel base in "
                f"the plan (it shares a machine there); its pods use "
                f"{first_nodes[0].instance}'s, each pod having its own address"
            ] = None
    pod_labels = labels(ctx.name, role)
    return RoleTemplate(
        role=role,
        instances=tuple(nodes[0].instance for nodes, _, _ in shapes),
        size=len(first_nodes),
        leader=_pod_template(leader, pod_labels),
        worker=_pod_template(worker, pod_labels) if worker else None,
        leaders_only=any(p.health_url is None for p in plan.by_role(role)),
    )


def _http_port(plan: Plan, notes: dict[str, None]) -> int:
    """One HTTP port for every engine pod: vllm-router scrapes one discovery port."""
    ports: dict[str, int] = {}
    for p in plan.processes:
        if p.role != "router" and p.health_url:
            ports.setdefault(p.role, next(x.port for x in p.ports if x.kind == "http"))
    chosen = ports["prefill"]
    if len(set(ports.values())) > 1:
        notes[
            f"HTTP port: the topology gives prefill {ports['prefill']} and decode "
            f"{ports['decode']}; vllm-router's --service-discovery-port is one port for "
            f"both roles, so every engine pod serves {chosen} (pods do not share addresses)"
        ] = None
    return chosen


# -- router ----------------------------------------------------------------------------------

# Flags the export sets on the router; the plan's own argv must not set them already.
_DISCOVERY_DESTS = frozenset(
    {
        "service_discovery",
        "service_discovery_port",
        "service_discovery_namespace",
        "selector",
        "prefill_selector",
        "decode_selector",
        "worker_urls",
    }
)


def _check_router(plan: Plan) -> None:
    args, positionals = facts.scan(plan.router.argv, facts.router(), start=1)
    dests = {a.dest for a in args}
    # The plan runs vllm-router exactly when its router argv is one vllm-router's parser takes
    # whole, in PD mode (plan._router_argv); a toy proxy's has its own flags and a script.
    if positionals or None in dests or "vllm_pd_disaggregation" not in dests:
        raise ExportError(
            "the router is not vllm-router: only vllm-router finds prefill and decode pods by "
            "their labels (the toy proxies take fixed host lists); set router.kind: "
            "vllm-router in the topology"
        )


def _router_argv(
    plan: Plan, ctx: _Context, roles: list[RoleTemplate], notes: dict[str, None]
) -> list[Token]:
    router = plan.router
    args, _ = facts.scan(router.argv, facts.router(), start=1)
    dests = {a.dest for a in args}
    taken = sorted(a.spelling for a in args if a.dest in _DISCOVERY_DESTS)
    if taken:
        raise ExportError(
            f"router.extra_args set {', '.join(taken)}, which the Kubernetes export derives: "
            f"remove them"
        )
    new: dict[str, Token] = {}
    host = next((a for a in args if a.dest == "host" and a.values), None)
    if host and not is_unspecified(host.values[0]):
        new["host"] = _bind(router, host.values[0], notes)
    argv = _substitute(router.argv, args, new, frozenset({"prefill", "decode"}))
    by_role = {r.role: r for r in roles}
    prefill = [f"{k}={v}" for k, v in selector(ctx.name, by_role["prefill"]).items()]
    decode = [f"{k}={v}" for k, v in selector(ctx.name, by_role["decode"]).items()]
    argv += [
        "--service-discovery",
        "--service-discovery-port", str(ctx.http_port),
        "--service-discovery-namespace", EnvRef("POD_NAMESPACE"),
        "--prefill-selector", *prefill,
        "--decode-selector", *decode,
    ]  # fmt: skip
    if "prometheus_host" not in dests:
        # The router's default, 127.0.0.1, is unreachable from outside the pod.
        argv += ["--prometheus-host", "0.0.0.0"]
    return argv


def _router_objects(
    plan: Plan, ctx: _Context, roles: list[RoleTemplate], image: str, notes: dict[str, None]
) -> list[Manifest]:
    router = plan.router
    argv = _router_argv(plan, ctx, roles, notes)
    command, args = _command(argv, router.path_prepend)
    container: Manifest = {
        "name": "vllm-router",
        "image": image,
        "command": command,
        "args": args,
        "env": _env(router, argv, ctx.secret, notes),
        "ports": _ports(router, ctx, True),
    }
    if router.health_url:
        container.update(_probes(router.health_url, startup=False))
    name = f"{ctx.name}-router"
    meta = {"name": name, "labels": labels(ctx.name, "router")}
    match = {k: v for k, v in meta["labels"].items() if k != "app.kubernetes.io/managed-by"}
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": meta,
            # Service discovery watches pods (src/service_discovery.rs: Api<Pod> watcher).
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            # No namespace: RBAC reads a ServiceAccount subject in the binding's namespace.
            "subjects": [{"kind": "ServiceAccount", "name": name}],
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {
                "selector": match,
                "ports": [
                    {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"]}
                    for p in container["ports"]
                ],
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": match},
                "template": {
                    "metadata": {"labels": dict(meta["labels"])},
                    "spec": {"serviceAccountName": name, "containers": [container]},
                },
            },
        },
    ]


# -- the export ------------------------------------------------------------------------------


def _lws_spec(role: RoleTemplate) -> Manifest:
    template: Manifest = {"size": role.size}
    if role.worker is None:
        template["workerTemplate"] = role.leader
    else:
        template["leaderTemplate"] = role.leader
        template["workerTemplate"] = role.worker
    return {"replicas": role.replicas, "leaderWorkerTemplate": template}


def _workloads(name: str, target: Target, roles: list[RoleTemplate]) -> list[Manifest]:
    if target == "disaggregatedset":
        return [
            {
                "apiVersion": DS_API_VERSION,
                "kind": "DisaggregatedSet",
                "metadata": {"name": name, "labels": labels(name, "engines")},
                "spec": {"roles": [{"name": r.role, "spec": _lws_spec(r)} for r in roles]},
            }
        ]
    return [
        {
            "apiVersion": LWS_API_VERSION,
            "kind": "LeaderWorkerSet",
            "metadata": {"name": f"{name}-{r.role}", "labels": labels(name, r.role)},
            "spec": _lws_spec(r),
        }
        for r in roles
    ]


def build(
    plan: Plan,
    target: Target = "disaggregatedset",
    image: ImageChoice = None,
    router_image: str | None = None,
) -> Export:
    """Every object of the deployment, in the order `kubectl apply` should create them."""
    if target not in TARGETS:
        raise ExportError(f"unknown target {target!r}: use one of {', '.join(TARGETS)}")
    if plan.kv_connector != "nixl":
        raise ExportError(
            f"kv_connector {plan.kv_connector} is not exported: the Ascend Mooncake path runs "
            f"vllm-ascend's proxy, which has no Kubernetes service discovery, and vllm-router's "
            f"mooncake mode is not verified against vllm-ascend's connector (docs/k8s-export.md)"
        )
    if isinstance(image, Mapping):
        unknown = sorted(set(image) - set(DEVICE_RESOURCES))
        if unknown:
            raise ExportError(f"image: unknown device kind {', '.join(unknown)}")
    _check_router(plan)
    name = k8s_name(plan.deployment)
    notes: dict[str, None] = {}
    vllm: dict[str, facts.Facts] = {}
    for proc in plan.processes:
        version = proc.vllm_version or plan.vllm_version
        try:
            vllm[proc.name] = facts.vllm(version)
        except KeyError:
            raise ExportError(
                f"pdlaunch has no facts for vLLM {version} ({proc.name}); it has: "
                f"{', '.join(facts.supported_vllm())}"
            ) from None
    ctx = _Context(name, vllm, _http_port(plan, notes), f"{name}-secrets")
    roles = [_role(plan, role, ctx, image, notes) for role in ("prefill", "decode")]
    router = _router_objects(
        plan,
        ctx,
        roles,
        router_image or DEFAULT_ROUTER_IMAGE.format(version=facts.router().version),
        notes,
    )
    keys = sorted({src for p in plan.processes for src in p.secret_env.values()})
    return Export(
        name=name,
        target=target,
        # Copied, so no two places share one dict (a caller may edit what it gets).
        objects=copy.deepcopy([*router[:3], *_workloads(name, target, roles), *router[3:]]),
        secret=ctx.secret if keys else None,
        secret_keys=tuple(keys),
        notes=tuple(notes),
    )


def manifests(
    plan: Plan,
    target: Target = "disaggregatedset",
    image: ImageChoice = None,
    router_image: str | None = None,
) -> list[Manifest]:
    return build(plan, target, image, router_image).objects
