"""The router objects of the Kubernetes export (.manifests): vllm-router finding
prefill and decode pods by their labels (service discovery), with the ServiceAccount, Role
and RoleBinding that lets it watch pods, or a fixed-list proxy given the pods' stable names
(.proxy); then its Service and its Deployment."""

from __future__ import annotations

from pdlaunch.backends.k8s.model import (
    Context,
    EnvRef,
    ExportError,
    Manifest,
    RoleTemplate,
    Token,
    labels,
    selector,
)
from pdlaunch.backends.k8s.pods import (
    apply_container_spec,
    bind_to_pod_ip,
    container_command,
    container_env,
    container_ports,
    host_path_volumes,
    probes,
    substitute,
)
from pdlaunch.plan.build import Plan
from pdlaunch.spec import facts, proxies
from pdlaunch.spec.addresses import is_unspecified

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


def check_router(plan: Plan) -> proxies.ProxyFacts | None:
    """None when the router is vllm-router, else the facts of the fixed-list proxy it runs;
    ExportError for a router pdlaunch knows neither way."""
    args, positionals = facts.scan(plan.router.argv, facts.router(), start=1)
    dests = {a.dest for a in args}
    # The plan runs vllm-router exactly when its router argv is one vllm-router's parser takes
    # whole, in PD mode (plan._router_argv); a toy proxy's has its own flags and a script.
    if not (positionals or None in dests or "vllm_pd_disaggregation" not in dests):
        return None
    proxy = proxies.facts_for(plan.router.argv)
    if proxy is None:
        launcher, _ = proxies.split_launcher(plan.router.argv)
        raise ExportError(
            f"the router runs {' '.join(launcher) or '(nothing)'}, a proxy whose arguments "
            f"pdlaunch has no facts for (it knows vllm-router and {', '.join(proxies.known())}"
            f"); set router.kind: vllm-router or run one of those scripts"
        )
    return proxy


def discovery_argv(
    plan: Plan, ctx: Context, roles: list[RoleTemplate], notes: dict[str, None]
) -> list[Token]:
    """vllm-router's argv: the plan's without the fixed URLs, with service discovery."""
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
        new["host"] = bind_to_pod_ip(router, host.values[0], notes)
    argv = substitute(router.argv, args, new, frozenset({"prefill", "decode"}))
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


def router_objects(
    plan: Plan,
    ctx: Context,
    argv: list[Token],
    image: str,
    notes: dict[str, None],
    *,
    discovers: bool,
) -> tuple[list[Manifest], list[Manifest]]:
    """(the objects before the engines: the RBAC vllm-router's discovery (``discovers``)
    needs, none for a fixed-list proxy; those after: the router's Service and Deployment)."""
    router = plan.router
    command, args = container_command(argv, router.path_prepend)
    container: Manifest = {
        "name": "vllm-router" if discovers else "proxy",
        "image": image,
        "command": command,
        "args": args,
        "env": container_env(router, argv, ctx.secret, notes),
        "ports": container_ports(router, ctx, True),
    }
    if router.health_url:
        container.update(probes(router.health_url, startup=False))
    pod_spec: Manifest = {"containers": [container]}
    if router.container is not None:
        # The router's `container:` as the engines' (mounts and devices from hostPath volumes,
        # --privileged as the security context), without their /dev/shm.
        container["volumeMounts"] = []
        apply_container_spec(container, router.container)
        if not container["volumeMounts"]:
            del container["volumeMounts"]
        if volumes := host_path_volumes(router.container):
            pod_spec["volumes"] = volumes
    name = f"{ctx.name}-router"
    meta = {"name": name, "labels": labels(ctx.name, "router")}
    match = {k: v for k, v in meta["labels"].items() if k != "app.kubernetes.io/managed-by"}
    rbac = "rbac.authorization.k8s.io"
    before: list[Manifest] = []
    if discovers:
        pod_spec = {"serviceAccountName": name, **pod_spec}
        before = [
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
        ]
    after = [
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
                "template": {"metadata": {"labels": dict(meta["labels"])}, "spec": pod_spec},
            },
        },
    ]
    return before, after
