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
functions from the plan; `files` writes them, one YAML file per object.

This module builds the roles (one pod template per role, checked to fit every instance) and
the workloads (DisaggregatedSet or LeaderWorkerSets); beside it: `model` (the objects,
names and labels), `pods` (each process's container), `router` (vllm-router and its
RBAC, Service and Deployment).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pdlaunch.backends.k8s.model import (
    DS_API_VERSION,
    LWS_API_VERSION,
    MAX_NAME,
    TARGETS,
    Context,
    Export,
    ExportError,
    ImageChoice,
    Manifest,
    RoleTemplate,
    Target,
    k8s_name,
    labels,
)
from pdlaunch.backends.k8s.pods import (
    DEVICE_RESOURCES,
    PORT_NAMES,
    SIDE_CHANNEL_PORT,
    engine_container,
    pod_container_spec,
    pod_template,
)
from pdlaunch.backends.k8s.proxy import proxy_argv
from pdlaunch.backends.k8s.router import check_router, discovery_argv, router_objects
from pdlaunch.plan.build import Plan, Process, ProcessRole
from pdlaunch.spec import facts, proxies

__all__ = [
    "DEFAULT_IMAGES",
    "DEFAULT_ROUTER_IMAGE",
    "DEVICE_RESOURCES",
    "MAX_NAME",
    "TARGETS",
    "Export",
    "ExportError",
    "ImageChoice",
    "Manifest",
    "Target",
    "build",
    "default_target",
    "k8s_name",
]

# Default images per device kind for the plan's vLLM series ({series}: "0.32" -> v0.32.0).
# None: no public image pairs that device's vLLM plugin with a given vLLM release (Gaudi
# images follow Intel Gaudi software releases, Ascend images CANN and MindIE releases), so
# the caller or the topology's container.image names one.
DEFAULT_IMAGES: dict[str, str | None] = {
    # {version}: the release of the instance's vLLM facts (its vllm_version's series).
    "cuda": "vllm/vllm-openai:v{version}",
    "cpu": "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v{version}",
    "hpu": None,
    "npu": None,
}
# The router version pdlaunch's router facts were generated from (pdlaunch/spec/facts/).
DEFAULT_ROUTER_IMAGE = "vllm/vllm-router:v{version}"

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
        if e["name"] == SIDE_CHANNEL_PORT:
            e["value"] = "*"
    for p in out["ports"]:
        if p["name"].startswith(PORT_NAMES["nixl_side_channel"]):
            p["containerPort"] = 0
    return out


def _image(proc: Process, image: ImageChoice, release: facts.Facts) -> str:
    """The command line's image, else the topology's `container.image`, else the default."""
    device = proc.device or "cpu"
    if isinstance(image, str):
        return image
    if image is not None and device in image:
        return image[device]
    if proc.container is not None:
        return proc.container.image
    default = DEFAULT_IMAGES[device]
    if default is None:
        raise ExportError(
            f"no default image for {device} instances: name one "
            f"(image={{'{device}': 'REGISTRY/IMAGE:TAG'}}; docs/k8s-export.md)"
        )
    return default.format(version=release.version)


def _role(
    plan: Plan, role: ProcessRole, ctx: Context, image: ImageChoice, notes: dict[str, None]
) -> RoleTemplate:
    shapes = []
    for nodes in _instances(plan, role):
        img = _image(nodes[0], image, ctx.vllm[nodes[0].name])
        leader = engine_container(nodes[0], ctx, img, True, notes)
        # Worker k listens on side channels base + k x ranks per node: one template lists
        # them only when there is one worker.
        listed = len(nodes) == 2
        workers = [engine_container(n, ctx, img, listed, notes) for n in nodes[1:]]
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
    spec = pod_container_spec(first_nodes[0], notes)
    if spec is not None and spec.privileged and DEVICE_RESOURCES[first_nodes[0].device or "cpu"]:
        # A privileged container gets every device node of its node (Kubernetes: privileged
        # = all host devices), so the device plugin's allocation no longer limits it.
        notes[
            f"{role}: the pods run privileged (the container spec's --privileged), so they "
            f"see every device of their node, not only the ones the device plugin gave them; "
            f"keep one engine pod per node (or drop privileged where the device plugin "
            f"suffices)"
        ] = None
    pod_labels = labels(ctx.name, role)
    return RoleTemplate(
        role=role,
        instances=tuple(nodes[0].instance for nodes, _, _ in shapes),
        size=len(first_nodes),
        leader=pod_template(leader, pod_labels, spec),
        worker=pod_template(worker, pod_labels, spec) if worker else None,
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


def default_target(plan: Plan) -> Target:
    """DisaggregatedSet, but two LeaderWorkerSets for a fixed-list proxy: it names pods by the
    LeaderWorkerSets' names, which a DisaggregatedSet derives from a hash (build())."""
    return "disaggregatedset" if check_router(plan) is None else "lws"


def _proxy_image(
    plan: Plan, proxy: proxies.ProxyFacts, image: ImageChoice, ctx: Context, notes: dict[str, None]
) -> str:
    """A proxy without an image of its own runs in the image of the engines whose plugin's
    checkout ships the script: the guides install that plugin from its checkout there."""
    script = proxies.split_launcher(plan.router.argv)[0][-1]
    for proc in plan.processes:
        if proc.role != "router" and (proc.plugin or "").split("@")[0] == proxy.plugin:
            img = _image(proc, image, ctx.vllm[proc.name])
            notes[
                f"router: the router names no image, so {proxy.script} runs in "
                f"{proc.instance}'s ({img}): {proxy.plugin}'s checkout holds it "
                f"({proxy.path}); that image must have it at {script}"
            ] = None
            return img
    raise ExportError(
        f"the router runs {proxy.script} and names no image: give the router a "
        f"container.image holding {script} with python, fastapi, httpx and uvicorn"
    )


def build(
    plan: Plan,
    target: Target | None = None,
    image: ImageChoice = None,
    router_image: str | None = None,
) -> Export:
    """Every object of the deployment, in the order `kubectl apply` should create them.
    ``target`` None: :func:`default_target`."""
    proxy = check_router(plan)
    target = target or default_target(plan)
    if target not in TARGETS:
        raise ExportError(f"unknown target {target!r}: use one of {', '.join(TARGETS)}")
    if proxy is not None and target == "disaggregatedset":
        # lws v0.10.0 pkg/utils/disaggregatedset/utils.go: GenerateName, ComputeRevision.
        raise ExportError(
            f"the router runs {proxy.script}, which takes fixed host lists, and a "
            f"DisaggregatedSet names its LeaderWorkerSets <name>-<slice>-<revision>-<role> "
            f"with the revision a hash of the templates as the API server stores them, so its "
            f"pods' DNS names are not known at export: use --k8s-target lws (or router.kind: "
            f"vllm-router, which finds pods by label)"
        )
    if plan.kv_connector != "nixl" and proxy is None:
        raise ExportError(
            f"kv_connector {plan.kv_connector} behind vllm-router is not exported: its "
            f"--kv-connector mooncake mode is not verified against vllm-ascend's connector "
            f"(docs/k8s-export.md); run vllm-ascend's proxy (router.kind: toy-proxy)"
        )
    if isinstance(image, Mapping):
        unknown = sorted(set(image) - set(DEVICE_RESOURCES))
        if unknown:
            raise ExportError(f"image: unknown device kind {', '.join(unknown)}")
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
    # vllm-router discovers one port for every pod; a proxy is given each pod's own.
    http_port = _http_port(plan, notes) if proxy is None else None
    ctx = Context(name, vllm, http_port, f"{name}-secrets")
    roles = [_role(plan, role, ctx, image, notes) for role in ("prefill", "decode")]
    own_image = router_image or (plan.router.container.image if plan.router.container else None)
    if proxy is None:
        argv = discovery_argv(plan, ctx, roles, notes)
        img = own_image or DEFAULT_ROUTER_IMAGE.format(version=facts.router().version)
    else:
        argv = proxy_argv(plan, ctx, proxy, roles, notes)
        img = own_image or _proxy_image(plan, proxy, image, ctx, notes)
    before, after = router_objects(plan, ctx, argv, img, notes, discovers=proxy is None)
    if plan.kv_connector == "mooncake":
        # vllm-ascend af62af3c vllm_ascend/distributed/mooncake_connector.py.
        notes[
            "mooncake: vllm-ascend's connector advertises get_ip(), the pod's IP, as its "
            "side-channel host (mooncake_connector.py:746) and its NPU by "
            "ASCEND_RT_VISIBLE_DEVICES or else its TP rank (:758-769): in a pod, the device "
            "plugin's NPUs counted from 0. Not run on Ascend hardware"
        ] = None
    keys = sorted({src for p in plan.processes for src in p.secret_env.values()})
    return Export(
        name=name,
        target=target,
        # Copied, so no two places share one dict (a caller may edit what it gets).
        objects=copy.deepcopy([*before, *_workloads(name, target, roles), *after]),
        secret=ctx.secret if keys else None,
        secret_keys=tuple(keys),
        notes=tuple(notes),
    )
