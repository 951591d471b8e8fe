"""`pdlaunch export k8s` behind a fixed-list proxy (pdlaunch.backends.k8s.proxy): the toy proxy
of the Gaudi<->CUDA examples and vllm-ascend's load-balance proxy are given each prefill and
decode pod by the DNS name its LeaderWorkerSet's headless Service gives it, with the planned
port, in an argv the proxy's own parser (its recorded facts, pdlaunch/spec/facts/proxies.json)
takes.

Without a cluster: tests/backends/kube.py expands the container's `$(VAR)`s as the kubelet
does, and the pod names come from LWS's naming (the leader address LWS injects, which
test_k8s_export.py already holds to the engines' commands)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pdlaunch.backends.k8s.files import export_k8s
from pdlaunch.backends.k8s.manifests import ExportError, build, default_target
from pdlaunch.backends.k8s.model import PodDns
from pdlaunch.backends.k8s.pods import container_command
from pdlaunch.plan.build import Plan, build_plan
from pdlaunch.spec import proxies
from pdlaunch.spec.load import load
from tests.backends import kube
from tests.support.k8s_export import (
    HPU_IMAGE,
    ROOT,
    objects_by_kind,
    plan_of,
    role_specs,
    router_container,
    run_shell,
    templates,
    topology_data,
)

PROXIED = {
    "cuda-prefill-gaudi-decode.yaml": "toy_proxy_server.py",
    "gaudi-prefill-cuda-decode.yaml": "toy_proxy_server.py",
    "ascend-mooncake-tp2.yaml": "load_balance_proxy_server_example.py",
}
NS = "team-a"


def _proxy_line(objects: list[dict]) -> list[str]:
    c = router_container(objects)
    return kube.command_line(c, kube.resolved_env(c, "10.9.8.7", NS))


def _leader_address(lws: str, group: int) -> str:
    # What LWS injects as LWS_LEADER_ADDRESS (kube.lws_pod, AddLWSVariables): the leader's
    # hostname.subdomain.namespace. Its full name adds svc.<cluster domain>.
    template = {"metadata": {}, "spec": {"containers": [{}]}}
    pod = kube.lws_pod(template, lws=lws, group=group, worker=0, size=1, ns=NS)
    (address,) = [e["value"] for e in pod["spec"]["containers"][0]["env"]
                  if e["name"] == "LWS_LEADER_ADDRESS"]  # fmt: skip
    return address


def _expected_endpoints(plan: Plan, name: str, role: str) -> list[tuple[str, str]]:
    """(host, port) per pod that serves HTTP: the pod's stable name, the planned port."""
    lws = f"{name}-{role}"
    instances = list(dict.fromkeys(p.instance for p in plan.by_role(role)))
    out = []
    for p in plan.by_role(role):
        if p.health_url is None:
            continue
        leader = _leader_address(lws, instances.index(p.instance))
        pod, rest = leader.split(".", 1)
        host = pod if p.node_index == 0 else f"{pod}-{p.node_index}"
        port = next(x.port for x in p.ports if x.kind == "http")
        out.append((f"{host}.{rest}.svc.cluster.local", str(port)))
    return out


def _option(line: list[str], flag: str) -> list[str]:
    i = line.index(flag) + 1
    j = next((k for k in range(i, len(line)) if line[k].startswith("--")), len(line))
    return line[i:j]


@pytest.mark.parametrize("name", sorted(PROXIED))
def test_the_proxy_names_each_pod_by_its_stable_dns_name_and_planned_port(name: str):
    topo, _ = load(ROOT / "topologies" / name)
    plan = build_plan(topo)
    export = build(plan)
    assert export.target == "lws" == default_target(plan)
    line = _proxy_line(export.objects)
    launcher, args = proxies.split_launcher(line)
    assert launcher == plan.router.argv[: len(launcher)] and launcher[-1].endswith(PROXIED[name])
    # The proxy's own parser (recorded facts) takes the argv whole, with paired lists.
    values = proxies.parse(proxies.facts_for(line), args)
    for role, (hosts, ports) in {
        "prefill": ("prefiller_hosts", "prefiller_ports"),
        "decode": ("decoder_hosts", "decoder_ports"),
    }.items():
        want = _expected_endpoints(plan, export.name, role)
        assert list(zip(values[hosts], map(str, values[ports]), strict=True)) == want
        # The planned port is the one the pod's engine serves.
        leader_t, _ = templates(role_specs(export.objects)[role])
        c = leader_t["spec"]["containers"][0]
        served = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
        assert [str(served)] == [port for _, port in want][:1]
        script = " ".join(c["command"] + c["args"])
        assert f"--port {served}" in script
    # The router's own flags, as planned; nothing a proxy does not read.
    assert values["port"] == plan.router.ports[0].port
    flags = {a for a in args if a.startswith("--")}
    known = {f for o in proxies.facts_for(line).options for f in o["flags"]}
    assert flags <= known


@pytest.mark.parametrize("name", sorted(PROXIED))
def test_a_proxied_example_exports_valid_objects_without_discovery_rbac(name: str, tmp_path):
    topo, source = load(ROOT / "topologies" / name)
    plan = build_plan(topo)
    written = export_k8s(plan, topo, tmp_path / "out", source=source)
    objects = [yaml.safe_load(p.read_text()) for p in written if p.suffix == ".yaml"]
    assert [o["kind"] for o in objects] == [
        "LeaderWorkerSet", "LeaderWorkerSet", "Service", "Deployment"
    ]  # fmt: skip
    for obj in objects:
        kube.validate(obj)
    # No pod watching: no ServiceAccount for the proxy.
    pod = objects_by_kind(objects)["Deployment"][0]["spec"]["template"]["spec"]
    assert "serviceAccountName" not in pod
    c = router_container(objects)
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthcheck", "port": "http"}
    assert {e["name"] for e in c["env"]} >= {"POD_NAMESPACE"}
    index = (tmp_path / "out" / "index.md").read_text()
    assert "stable DNS name" in index


def test_several_instances_and_nodes_are_each_named():
    # gb200's groups (2 prefill x 2 nodes, 1 decode x 2 nodes, every node serving HTTP)
    # behind the toy proxy: every pod, workers too, gets its own name.
    data = topology_data("gb200-xpyd.yaml")
    data["router"] = {
        "kind": "toy-proxy",
        "host": "gb200-router",
        "port": 8123,
        "binary": "/opt/vllm-gaudi/examples/nixl/toy_proxy_server.py",
        "container": {"image": "registry.example/proxy:1"},
    }
    plan, _ = plan_of(data)
    export = build(plan)
    line = _proxy_line(export.objects)
    hosts = _option(line, "--prefiller-hosts")
    assert hosts == [
        f"gb200-xpyd-prefill-{g}{w}.gb200-xpyd-prefill.{NS}.svc.cluster.local"
        for g in (0, 1)
        for w in ("", "-1")
    ]
    assert _option(line, "--prefiller-ports") == ["8087"] * 4
    assert _option(line, "--decoder-hosts") == [
        f"gb200-xpyd-decode-0{w}.gb200-xpyd-decode.{NS}.svc.cluster.local" for w in ("", "-1")
    ]
    assert router_container(export.objects)["image"] == "registry.example/proxy:1"
    for role in ("prefill", "decode"):
        assert [h for h, _ in _expected_endpoints(plan, export.name, role)] == _option(
            line, "--prefiller-hosts" if role == "prefill" else "--decoder-hosts"
        )


def test_a_disaggregatedset_cannot_name_the_proxys_pods(tmp_path: Path):
    data = topology_data("cuda-prefill-gaudi-decode.yaml")
    topo, source = load(ROOT / "topologies" / "cuda-prefill-gaudi-decode.yaml")
    plan = build_plan(topo)
    with pytest.raises(ExportError, match=r"revision.*--k8s-target lws"):
        export_k8s(plan, topo, tmp_path / "o", "disaggregatedset", source=source)
    assert not (tmp_path / "o").exists()
    assert data["router"]["kind"] == "toy-proxy"


def test_the_proxy_runs_in_the_image_of_the_plugin_that_ships_it():
    # The hetero examples' router names no image (it runs on its host over SSH): in a pod it
    # runs in the Gaudi engines' image, where the guide installs vllm-gaudi from its checkout.
    plan, _ = plan_of(topology_data("cuda-prefill-gaudi-decode.yaml"))
    export = build(plan)
    gaudi = next(p for p in plan.processes if (p.plugin or "").startswith("vllm-gaudi"))
    assert router_container(export.objects)["image"] == gaudi.container.image
    assert any("vllm-gaudi's checkout holds it" in n for n in export.notes)
    assert router_container(build(plan, image={"hpu": HPU_IMAGE}).objects)["image"] == HPU_IMAGE
    assert (
        router_container(build(plan, router_image="reg/proxy:2").objects)["image"] == "reg/proxy:2"
    )
    # A deployment without that plugin and a router without an image: nothing to run it in.
    data = topology_data("cuda-prefill-gaudi-decode.yaml")
    data["decode"][0] = {**data["prefill"][0], "host": "10.0.0.2", "port": 8200}
    plan, _ = plan_of(data)
    with pytest.raises(ExportError, match=r"names no image.*toy_proxy_server\.py"):
        build(plan)


def test_a_proxy_pdlaunch_has_no_facts_for_is_refused():
    data = topology_data("cuda-prefill-gaudi-decode.yaml")
    data["router"]["binary"] = "/opt/my_proxy.py"
    plan, _ = plan_of(data)
    with pytest.raises(ExportError, match=r"no facts for.*toy_proxy_server.py"):
        build(plan)


def test_router_args_the_proxy_does_not_take_are_refused():
    data = topology_data("ascend-mooncake-tp2.yaml")
    data["router"]["extra_args"] = ["--policy", "x"]
    plan, _ = plan_of(data)
    with pytest.raises(ExportError, match=r"not ones load_balance_proxy_server_example\.py takes"):
        build(plan)
    # vllm-ascend's own options pass through, typed as its parser reads them.
    data["router"]["extra_args"] = ["--max-retries", "5", "--retry-delay=0.5"]
    plan, _ = plan_of(data)
    line = _proxy_line(build(plan).objects)
    assert _option(line, "--max-retries") == ["5"] and _option(line, "--retry-delay") == ["0.5"]


def test_mooncake_behind_vllm_router_is_still_refused():
    data = topology_data("ascend-mooncake-tp2.yaml")
    data["router"] = {"host": "127.0.0.1", "port": 9090}
    plan, _ = plan_of(data)
    with pytest.raises(ExportError, match="mooncake behind vllm-router is not exported"):
        build(plan, "lws")


def test_a_pod_name_in_a_shell_line_reads_the_namespace(stand_in_vllm: Path):
    # Where a container needs the shell (a library path to prepend), the name still resolves.
    command, args = container_command(
        ["vllm", "--host", PodDns("x-prefill-0", "x-prefill")], {"LD_LIBRARY_PATH": ["/l"]}
    )
    line = kube.command_line({"command": command, "args": args}, {})
    out = run_shell(line, {"POD_NAMESPACE": NS}, stand_in_vllm)
    assert out["argv"] == ["--host", f"x-prefill-0.x-prefill.{NS}.svc.cluster.local"]
