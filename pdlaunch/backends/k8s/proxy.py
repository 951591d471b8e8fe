"""A fixed-list proxy in the Kubernetes export (.manifests): vLLM's/vllm-gaudi's
toy_proxy_server.py or vllm-ascend's load_balance_proxy_server_example.py, which take the
prefill and decode endpoints as host and port lists when they start (no discovery).

Each endpoint is given by the name Kubernetes keeps for its pod: a LeaderWorkerSet's pods are
StatefulSet pods behind the LeaderWorkerSet's headless Service, so the pod of group g, node w
answers at ``<lws>-<g>[-<w>].<lws>.<namespace>.svc.<cluster domain>`` whatever its IP, across
restarts (docs/k8s-export.md, "Fixed-list proxies", cites lws). The ports are the plan's: each
pod keeps its own.
"""

from __future__ import annotations

from pdlaunch.backends.k8s.model import Context, ExportError, PodDns, RoleTemplate, Token
from pdlaunch.backends.k8s.pods import bind_to_pod_ip
from pdlaunch.plan.build import Plan, Process, ProcessRole
from pdlaunch.spec import proxies
from pdlaunch.spec.addresses import is_unspecified

# The options the plan gives each role's endpoints (plan/build.py _router_argv).
ENDPOINT_DESTS: dict[ProcessRole, tuple[str, str]] = {
    "prefill": ("prefiller_hosts", "prefiller_ports"),
    "decode": ("decoder_hosts", "decoder_ports"),
}


def lws_name(name: str, role: ProcessRole) -> str:
    """The LeaderWorkerSet of ``role`` in the `lws` target (manifests._workloads)."""
    return f"{name}-{role}"


def pod_name(lws: str, group: int, node: int) -> str:
    # lws v0.10.0: the leader StatefulSet is named <lws> (leaderworkerset_controller.go:846),
    # so group g's leader is pod <lws>-<g>; its workers are StatefulSet <lws>-<g> with
    # ordinals from 1 (pod_controller.go:438-444), pods <lws>-<g>-<w>.
    return f"{lws}-{group}" if node == 0 else f"{lws}-{group}-{node}"


def _http_port(proc: Process) -> int:
    return next(p.port for p in proc.ports if p.kind == "http")


def endpoints(plan: Plan, ctx: Context, role: RoleTemplate) -> list[tuple[PodDns, int]]:
    """(stable name, planned port) of every pod of ``role`` that serves HTTP, in the plan's
    order (the order the plan lists them to the proxy)."""
    lws = lws_name(ctx.name, role.role)
    out = []
    for proc in plan.by_role(role.role):
        if proc.health_url is None:  # a headless DP worker: no API server
            continue
        group = role.instances.index(proc.instance)
        # Shared subdomain (the default; the export sets no networkConfig): both
        # StatefulSets' serviceName is <lws> (leaderworkerset_controller.go:848,
        # pod_controller.go:432-434), the headless Service :215 creates; the StatefulSet
        # controller gives each pod hostname = its name and subdomain = serviceName
        # (kubernetes pkg/controller/statefulset/stateful_set_utils.go updateIdentity).
        out.append((PodDns(pod_name(lws, group, proc.node_index), lws), _http_port(proc)))
    return out


def proxy_argv(
    plan: Plan,
    ctx: Context,
    proxy: proxies.ProxyFacts,
    roles: list[RoleTemplate],
    notes: dict[str, None],
) -> list[Token]:
    """The plan's proxy argv, read as the script's parser reads it, with each endpoint's host
    replaced by its pod's stable name and a bind address by the pod's IP."""
    router = plan.router
    launcher, args = proxies.split_launcher(router.argv)
    try:
        values: dict[str, object] = proxies.parse(proxy, args)
    except proxies.ProxyArgError as exc:
        raise ExportError(
            f"the router's arguments are not ones {proxy.script} takes: {exc}"
        ) from None
    host = values.get("host")
    if isinstance(host, str) and not is_unspecified(host):
        values["host"] = bind_to_pod_ip(router, host, notes)
    for role in roles:
        hosts_dest, ports_dest = ENDPOINT_DESTS[role.role]
        pods = endpoints(plan, ctx, role)
        planned = values.get(ports_dest)
        if planned != [port for _, port in pods]:
            raise ExportError(
                f"the router lists {role.role} ports {planned}, the plan's {role.role} pods "
                f"serve {[port for _, port in pods]}"
            )
        values[hosts_dest] = [name for name, _ in pods]
    notes[
        f"router: {proxy.script} takes fixed host lists; each prefill and decode pod is "
        f"given by its stable DNS name (<pod>.<LeaderWorkerSet>.<namespace>.svc."
        f"cluster.local, the LeaderWorkerSet's headless Service) and its planned port"
    ] = None
    return [*launcher, *proxies.unparse(proxy, values)]
