"""`pdlaunch export k8s` (pdlaunch.backends.k8s): the manifests are valid Kubernetes objects,
carry the plan (argv, env, ports, devices) with only machine-bound values replaced, never a
secret's value, and the router finds exactly the pods that serve HTTP.

Kubernetes and LWS are not run here: tests/backends/kube.py holds their schemas (fixtures) and
ports of the kubelet's `$(VAR)` expansion and LWS's pod variables, and vLLM's and
vllm-router's own parsers judge the commands the containers end up with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from pdlaunch import facts
from pdlaunch.backends import k8s
from pdlaunch.backends.k8s import ExportError, build
from pdlaunch.backends.k8s_files import export_k8s, write_manifests
from pdlaunch.devices import PROFILES
from pdlaunch.load import load, load_text
from pdlaunch.plan import Plan, build_plan
from pdlaunch.rules import has_errors, validate
from tests.backends import kube

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "topologies").glob("*.yaml"))
TARGETS = k8s.TARGETS
HPU_IMAGE = "registry.example/vllm-gaudi:1.23.0"  # Gaudi has no default image (by design)
SENTINEL = "hf_SENTINEL_do_not_leak_7f3a"


def topology_data(name: str) -> dict:
    return yaml.safe_load((ROOT / "topologies" / name).read_text())


def topology(data: dict):
    return load_text(yaml.safe_dump(data, sort_keys=False), "variant.yaml")


def plan_of(data: dict) -> tuple[Plan, object]:
    topo, _ = topology(data)
    return build_plan(topo), topo


def with_vllm_router(data: dict) -> dict:
    # The shipped hetero topologies run a toy proxy, which has no service discovery.
    data["router"]["kind"] = "vllm-router"
    data["router"].pop("binary", None)
    return data


def non_hybrid(data: dict) -> dict:
    for inst in data["prefill"] + data["decode"]:
        inst["dp"]["hybrid_lb"] = False
    return data


def objects_by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for o in objects:
        out.setdefault(o["kind"], []).append(o)
    return out


def role_specs(objects: list[dict]) -> dict[str, dict]:
    """role -> LeaderWorkerSet spec, for either target."""
    kinds = objects_by_kind(objects)
    if "DisaggregatedSet" in kinds:
        (ds,) = kinds["DisaggregatedSet"]
        return {r["name"]: r["spec"] for r in ds["spec"]["roles"]}
    return {o["metadata"]["name"].rsplit("-", 1)[1]: o["spec"] for o in kinds["LeaderWorkerSet"]}


def templates(spec: dict) -> tuple[dict, dict | None]:
    """(leader pod template, worker pod template or None)."""
    lwt = spec["leaderWorkerTemplate"]
    if "leaderTemplate" in lwt:
        return lwt["leaderTemplate"], lwt["workerTemplate"]
    return lwt["workerTemplate"], None


def router_container(objects: list[dict]) -> dict:
    (dep,) = objects_by_kind(objects)["Deployment"]
    return dep["spec"]["template"]["spec"]["containers"][0]


def pod_command(template: dict, *, lws: str, group: int, worker: int, size: int) -> list[str]:
    pod = kube.lws_pod(template, lws=lws, group=group, worker=worker, size=size, ns="ns")
    c = pod["spec"]["containers"][0]
    return kube.command_line(c, kube.resolved_env(c, "10.1.2.3", "ns"))


def run_shell(line: list[str], env: dict[str, str], bin_dir: Path) -> dict:
    """Run a container's `/bin/sh -c SCRIPT` with a stand-in `vllm` that reports its argv and
    LD_LIBRARY_PATH: what the script would exec."""
    assert line[:2] == ["/bin/sh", "-c"], line
    proc = subprocess.run(
        line, env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def stand_in_vllm(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "vllm"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'ld': os.environ.get('LD_LIBRARY_PATH')}))\n"
    )
    script.chmod(0o755)
    return bin_dir


# -- every shipped topology --------------------------------------------------------------------

# Why a shipped topology is not exported as it is (anything else must export).
REFUSED = {
    "ascend-mooncake-tp2.yaml": "kv_connector mooncake is not exported",
    "cuda-prefill-gaudi-decode.yaml": "the router is not vllm-router",
    "gaudi-prefill-cuda-decode.yaml": "the router is not vllm-router",
}


def test_the_refusal_table_names_shipped_topologies():
    names = {p.name for p in SHIPPED}
    assert set(REFUSED) <= names
    assert {"gb200-xpyd.yaml", "local-cpu.yaml"} <= names - set(REFUSED)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_topology_exports_valid_objects(path: Path, target: str, tmp_path: Path):
    topo, source = load(path)
    assert not has_errors(validate(topo, source)), "a shipped topology must validate"
    plan = build_plan(topo)
    image = {"hpu": HPU_IMAGE}
    if path.name in REFUSED:
        with pytest.raises(ExportError, match=REFUSED[path.name]):
            export_k8s(plan, topo, tmp_path / "out", target, image, source=source)
        assert not (tmp_path / "out").exists()
        if "vllm-router" not in REFUSED[path.name]:
            return
        # The same deployment behind vllm-router exports.
        plan, topo = plan_of(with_vllm_router(topology_data(path.name)))
    written = export_k8s(plan, topo, tmp_path / "out", target, image)
    objects = [yaml.safe_load(p.read_text()) for p in written if p.suffix == ".yaml"]
    assert objects == build(plan, target, image).objects
    kinds = [o["kind"] for o in objects]
    workload = ["DisaggregatedSet"] if target == "disaggregatedset" else ["LeaderWorkerSet"] * 2
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", *workload, "Service", "Deployment"]
    for obj in objects:
        kube.validate(obj)
    specs = role_specs(objects)
    for role in ("prefill", "decode"):
        assert specs[role]["replicas"] == len({p.instance for p in plan.by_role(role)}) > 0


def test_the_validators_refuse_what_kubernetes_refuses():
    plan, _ = plan_of(topology_data("gb200-xpyd.yaml"))
    objects = build(plan).objects
    ds = next(o for o in objects if o["kind"] == "DisaggregatedSet")
    dep = next(o for o in objects if o["kind"] == "Deployment")
    lws = next(o for o in build(plan, "lws").objects if o["kind"] == "LeaderWorkerSet")

    typo = json.loads(json.dumps(ds))
    typo["spec"]["roles"][0]["spec"]["leaderWorkerTemplat"] = {}
    with pytest.raises(jsonschema.ValidationError):
        kube.validate(typo)
    no_size_type = json.loads(json.dumps(lws))
    no_size_type["spec"]["leaderWorkerTemplate"]["size"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        kube.validate(no_size_type)
    # A field the pod template does not have (a CRD schema lists them, and unknown fields are
    # refused as `kubectl apply --validate=strict` would).
    bad_pod = json.loads(json.dumps(ds))
    bad_pod["spec"]["roles"][1]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"][
        "containers"
    ][0]["comand"] = ["x"]
    with pytest.raises(jsonschema.ValidationError, match="comand"):
        kube.validate(bad_pod)
    no_selector = json.loads(json.dumps(dep))
    del no_selector["spec"]["selector"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kube.validate(no_selector)
    long_port = json.loads(json.dumps(dep))
    long_port["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"] = "a" * 16
    with pytest.raises(AssertionError):
        kube.validate(long_port)


# -- secrets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
def test_secret_values_never_appear(target: str, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SENTINEL)
    monkeypatch.setenv("ROUTER_KEY", SENTINEL)
    data = topology_data("gb200-xpyd.yaml")
    data["router"]["env"]["RUST_TOKEN"] = "${env:ROUTER_KEY}"
    data["router"]["env"]["PLAIN_MARK"] = "plain-value-visible"  # the grep finds what is there
    plan, topo = plan_of(data)
    written = export_k8s(plan, topo, tmp_path, target)
    text = "".join(p.read_text() for p in written)
    assert SENTINEL not in text
    assert "plain-value-visible" in text
    objects = [yaml.safe_load(p.read_text()) for p in written if p.suffix == ".yaml"]
    containers = [
        c for o in objects for t in kube.pod_templates(o) for c in t["spec"]["containers"]
    ]
    refs = {
        (e["name"], e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for c in containers
        for e in c["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {
        ("HF_TOKEN", "gb200-xpyd-secrets", "HF_TOKEN"),
        ("RUST_TOKEN", "gb200-xpyd-secrets", "ROUTER_KEY"),
    }
    assert not any(
        "value" in e
        for c in containers
        for e in c["env"]
        if e["name"] in {"HF_TOKEN", "RUST_TOKEN"}
    )
    index = (tmp_path / "index.md").read_text()
    assert '--from-literal=HF_TOKEN="$HF_TOKEN" --from-literal=ROUTER_KEY="$ROUTER_KEY"' in index


# -- one topology in detail --------------------------------------------------------------------


def test_gb200_containers_carry_the_plan():
    plan, _ = plan_of(topology_data("gb200-xpyd.yaml"))
    objects = build(plan).objects
    specs = role_specs(objects)
    for role, spec in specs.items():
        nodes = [p for p in plan.by_role(role) if p.instance == plan.by_role(role)[0].instance]
        leader_t, worker_t = templates(spec)
        for proc, template in zip(nodes, [leader_t, worker_t], strict=True):
            c = template["spec"]["containers"][0]
            env = {e["name"]: e for e in c["env"]}
            # Every plain variable of the plan, with its value, but the device pinning.
            expected = {k: v for k, v in proc.env.items() if k != "CUDA_VISIBLE_DEVICES"}
            expected.pop("VLLM_NIXL_SIDE_CHANNEL_HOST")
            assert {k: e["value"] for k, e in env.items() if "value" in e} == expected
            assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {
                "fieldRef": {"fieldPath": "status.podIP"}
            }
            assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "HF_TOKEN"
            assert "CUDA_VISIBLE_DEVICES" in proc.env and "CUDA_VISIBLE_DEVICES" not in env
            # Ports: the plan's, named by kind.
            assert [p["containerPort"] for p in c["ports"]] == [p.port for p in proc.ports]
            kinds = {"http": "http", "dp_rpc": "dp-rpc", "nixl_side_channel": "nixl"}
            names = [p["name"] for p in c["ports"]]
            assert [n.rsplit("-", 1)[0] if n.startswith("nixl-") else n for n in names] == [
                kinds[p.kind] for p in proc.ports
            ]
            assert c["resources"] == {"limits": {"nvidia.com/gpu": len(proc.devices)}}
            assert len(proc.devices) == 4
            # Probes on the plan's health URL, through the port named http.
            http = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
            assert proc.health_url == f"http://{proc.host}:{http}/health"
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}


def test_commands_are_the_plans_argv_with_the_pods_addresses(stand_in_vllm: Path):
    plan, _ = plan_of(topology_data("gb200-xpyd.yaml"))
    specs = role_specs(build(plan, "lws").objects)
    for role, spec in specs.items():
        lws = f"gb200-xpyd-{role}"
        leader_t, worker_t = templates(spec)
        for proc in plan.by_role(role):
            group = int(proc.instance.rsplit("-", 1)[1])
            leader = f"{lws}-{group}.{lws}.ns"
            want = [leader if a == proc.argv[proc.argv.index("--data-parallel-address") + 1]
                    else a for a in proc.argv]  # fmt: skip
            template = leader_t if proc.node_index == 0 else worker_t
            line = pod_command(template, lws=lws, group=group, worker=proc.node_index, size=2)
            if proc.node_index == 0:
                assert line == want
                continue
            pod = kube.lws_pod(
                template, lws=lws, group=group, worker=proc.node_index, size=2, ns="ns"
            )
            env = kube.resolved_env(pod["spec"]["containers"][0], "10.1.2.3", "ns")
            assert run_shell(line, env, stand_in_vllm)["argv"] == want[1:]


# -- multi-node data parallel ------------------------------------------------------------------


def test_gb200_is_two_node_groups_whose_workers_compute_their_start_rank():
    plan, _ = plan_of(topology_data("gb200-xpyd.yaml"))
    specs = role_specs(build(plan).objects)
    assert {r: (s["replicas"], s["leaderWorkerTemplate"]["size"]) for r, s in specs.items()} == {
        "prefill": (2, 2),
        "decode": (1, 2),
    }
    leader_t, worker_t = templates(specs["prefill"])
    leader = leader_t["spec"]["containers"][0]
    assert leader["args"][leader["args"].index("--data-parallel-address") + 1] == (
        "$(LWS_LEADER_ADDRESS)"
    )
    assert "--data-parallel-start-rank" not in leader["args"]
    (script,) = worker_t["spec"]["containers"][0]["args"]
    assert '--data-parallel-start-rank "$$(( $${LWS_WORKER_INDEX:?} * 4 ))"' in script
    assert '--data-parallel-address "$${LWS_LEADER_ADDRESS:?}"' in script
    # gb200 runs hybrid load balancing: every node serves HTTP, so no worker is headless and
    # the router takes every pod.
    assert "--headless" not in script and "--data-parallel-hybrid-lb" in script
    assert "readinessProbe" in worker_t["spec"]["containers"][0]


def test_non_hybrid_workers_run_headless_and_the_router_picks_leaders(stand_in_vllm: Path):
    data = non_hybrid(topology_data("gb200-xpyd.yaml"))
    plan, _ = plan_of(data)
    objects = build(plan).objects
    leader_t, worker_t = templates(role_specs(objects)["decode"])
    worker = worker_t["spec"]["containers"][0]
    assert "--headless" in worker["args"][0] and "--port" not in worker["args"][0]
    assert not any(k.endswith("Probe") for k in worker)
    assert [p["name"] for p in worker["ports"]] == ["nixl-0", "nixl-1", "nixl-2", "nixl-3"]
    proc = next(p for p in plan.by_role("decode") if p.node_index == 1)
    assert "--headless" in proc.argv and proc.health_url is None
    pod = kube.lws_pod(worker_t, lws="d", group=0, worker=1, size=2, ns="ns")
    env = kube.resolved_env(pod["spec"]["containers"][0], "10.1.2.3", "ns")
    got = run_shell(kube.command_line(pod["spec"]["containers"][0], env), env, stand_in_vllm)
    master = proc.argv[proc.argv.index("--data-parallel-address") + 1]
    assert got["argv"] == [("d-0.d.ns" if a == master else a) for a in proc.argv[1:]]
    args = facts.scan(got["argv"], facts.vllm(), start=0)[0]
    assert any(a.dest == "headless" for a in args)
    assert next(a for a in args if a.dest == "data_parallel_start_rank").values == ("4",)
    router = kube.command_line(router_container(objects), {"POD_NAMESPACE": "ns"})
    from vllm_router.launch_router import parse_router_args

    parsed = parse_router_args(router[1:])
    for template, serves in ((leader_t, True), (worker_t, False)):
        pod = kube.lws_pod(template, lws="d", group=0, worker=0 if serves else 1, size=2, ns="ns")
        labels = pod["metadata"]["labels"]
        assert kube.matches(parsed.decode_selector, labels) is serves
        assert not kube.matches(parsed.prefill_selector, labels)


def test_three_node_groups_give_each_worker_its_rank(stand_in_vllm: Path):
    data = topology_data("gb200-xpyd.yaml")
    data["decode"][0]["hosts"].append("gb200-d0-worker2")
    data["decode"][0]["dp"]["size"] = 12
    plan, _ = plan_of(data)
    objects = build(plan, "lws").objects
    _, worker_t = templates(role_specs(objects)["decode"])
    # Each worker listens on its own ranks' side channels: one template cannot list them.
    assert [p["name"] for p in worker_t["spec"]["containers"][0]["ports"]] == ["http"]
    for proc in plan.by_role("decode")[1:]:
        pod = kube.lws_pod(worker_t, lws="d", group=0, worker=proc.node_index, size=3, ns="n")
        env = kube.resolved_env(pod["spec"]["containers"][0], "10.1.2.3", "n")
        got = run_shell(kube.command_line(pod["spec"]["containers"][0], env), env, stand_in_vllm)
        master = proc.argv[proc.argv.index("--data-parallel-address") + 1]
        assert got["argv"] == [("d-0.d.n" if a == master else a) for a in proc.argv[1:]]
    assert any("worker template lists no NIXL" in n for n in build(plan).notes)


# -- router ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gb200-xpyd.yaml", "local-cpu.yaml"])
def test_router_discovers_the_engine_pods_on_their_http_port(name: str):
    from vllm_router.launch_router import parse_router_args

    plan, _ = plan_of(topology_data(name))
    export = build(plan)
    objects = export.objects
    c = router_container(objects)
    line = kube.command_line(c, kube.resolved_env(c, "10.9.9.9", "ns"))
    # Every flag is one vllm-router 0.1.17's parser has (the facts), and its parser takes it.
    args, positionals = facts.scan(line, facts.router(), start=1)
    assert not positionals and all(a.flag is not None for a in args)
    parsed = parse_router_args(line[1:])
    assert parsed.service_discovery and parsed.vllm_pd_disaggregation
    assert parsed.service_discovery_namespace == "ns"
    assert parsed.prefill_urls == [] and parsed.decode_urls == []
    assert parsed.prometheus_host == "0.0.0.0"
    for role, selector in (
        ("prefill", parsed.prefill_selector),
        ("decode", parsed.decode_selector),
    ):
        leader_t, worker_t = templates(role_specs(objects)[role])
        for template in filter(None, (leader_t, worker_t)):
            engine = template["spec"]["containers"][0]
            assert kube.matches(selector, template["metadata"]["labels"] | {
                "leaderworkerset.sigs.k8s.io/worker-index": "0"})  # fmt: skip
            http = [p["containerPort"] for p in engine["ports"] if p["name"] == "http"]
            assert http == [parsed.service_discovery_port]
            assert engine["readinessProbe"]["httpGet"]["port"] == "http"
            other = "decode" if role == "prefill" else "prefill"
            labels = template["metadata"]["labels"] | {"app.kubernetes.io/component": other}
            assert not kube.matches(selector, labels)
    # The Service reaches the router's own ports; RBAC lets it watch pods.
    kinds = objects_by_kind(objects)
    (svc,) = kinds["Service"]
    names = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert {p["targetPort"]: p["port"] for p in svc["spec"]["ports"]} == names
    assert names == {
        {"router_http": "http", "router_metrics": "metrics"}[p.kind]: p.port
        for p in plan.router.ports
    }
    (dep,) = kinds["Deployment"]
    assert kube.matches(svc["spec"]["selector"], dep["spec"]["template"]["metadata"]["labels"])
    assert kube.matches(dep["spec"]["selector"]["matchLabels"],
                        dep["spec"]["template"]["metadata"]["labels"])  # fmt: skip
    (sa,), (role,), (binding,) = kinds["ServiceAccount"], kinds["Role"], kinds["RoleBinding"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]


def test_one_discovery_port_when_the_topology_gives_two():
    plan, _ = plan_of(topology_data("local-cpu.yaml"))
    ports = {p.role: p.ports[0].port for p in plan.processes if p.role != "router"}
    assert ports == {"prefill": 8100, "decode": 8200}  # the finding this test is about
    export = build(plan)
    for spec in role_specs(export.objects).values():
        c = templates(spec)[0]["spec"]["containers"][0]
        assert c["args"][c["args"].index("--port") + 1] == "8100"
        assert [p["containerPort"] for p in c["ports"] if p["name"] == "http"] == [8100]
    router = router_container(export.objects)["args"]
    assert router[router.index("--service-discovery-port") + 1] == "8100"
    assert any("prefill 8100 and decode 8200" in n for n in export.notes)
    # Loopback binds become the pod's address: nothing else could reach them.
    c = templates(role_specs(export.objects)["decode"])[0]["spec"]["containers"][0]
    assert c["args"][c["args"].index("--host") + 1] == "$(POD_IP)"
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    assert not any(e["name"] in ("UCX_NET_DEVICES", "VLLM_CPU_OMP_THREADS_BIND") for e in c["env"])


def test_the_runtime_parsers_accept_the_expanded_commands(stand_in_vllm: Path):
    from tests.fidelity.judge import judge_router, judge_serve

    for name in ("gb200-xpyd.yaml", "local-cpu.yaml"):
        plan, _ = plan_of(topology_data(name))
        objects = build(plan, "lws").objects
        for role, spec in role_specs(objects).items():
            for worker, template in enumerate(filter(None, templates(spec))):
                pod = kube.lws_pod(template, lws="x", group=0, worker=worker, size=2, ns="ns")
                c = pod["spec"]["containers"][0]
                env = kube.resolved_env(c, "10.1.2.3", "ns")
                line = kube.command_line(c, env)
                if line[0] == "/bin/sh":
                    line = ["vllm", *run_shell(line, env, stand_in_vllm)["argv"]]
                device = plan.by_role(role)[0].device
                assert judge_serve(line, env, device) == [], (name, role, worker)
        c = router_container(objects)
        assert (
            judge_router(kube.command_line(c, {"POD_NAMESPACE": "ns"}), "/health", "vllm-router")
            == []
        )


# -- environment and paths ---------------------------------------------------------------------


def test_literal_dollars_survive_the_kubelet_expansion():
    data = topology_data("local-cpu.yaml")
    data["defaults"]["env"]["ODD"] = "a$(HOME)b$$c$"
    data["model"]["served_name"] = "tiny$(HOSTNAME)"
    plan, _ = plan_of(data)
    c = templates(role_specs(build(plan).objects)["prefill"])[0]["spec"]["containers"][0]
    env = kube.resolved_env(c, "10.1.2.3", "ns") | {"HOME": "/root", "HOSTNAME": "pod"}
    assert env["ODD"] == "a$(HOME)b$$c$"
    line = kube.command_line(c, env)
    assert line[line.index("--served-model-name") + 1] == "tiny$(HOSTNAME)"


def test_library_paths_are_prepended_to_the_images_own(stand_in_vllm: Path):
    plan, _ = plan_of(with_vllm_router(topology_data("cuda-prefill-gaudi-decode.yaml")))
    proc = plan.by_role("prefill")[0]
    assert proc.path_prepend["LD_LIBRARY_PATH"]
    objects = build(plan, image={"hpu": HPU_IMAGE}).objects
    c = templates(role_specs(objects)["prefill"])[0]["spec"]["containers"][0]
    env = kube.resolved_env(c, "10.1.2.3", "ns") | {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}
    got = run_shell(kube.command_line(c, env), env, stand_in_vllm)
    assert got["ld"] == ":".join([*proc.path_prepend["LD_LIBRARY_PATH"], "/usr/local/cuda/lib64"])
    assert got["argv"] == proc.argv[1:]


def test_device_resources_and_images_per_kind():
    assert set(k8s.DEVICE_RESOURCES) == set(PROFILES) == set(k8s.DEFAULT_IMAGES)
    data = with_vllm_router(topology_data("gaudi-prefill-cuda-decode.yaml"))
    # The shipped example names the guide's images (`container:`): the export uses them ...
    shipped = role_specs(build(plan_of(data)[0]).objects)
    guide = "vault.habana.ai/gaudi-docker/1.22.2/ubuntu24.04/habanalabs/pytorch-installer-2.7.1"
    assert templates(shipped["prefill"])[0]["spec"]["containers"][0]["image"] == guide
    # ... and without them, hpu has no default.
    data.get("defaults", {}).pop("container", None)
    for inst in data["prefill"] + data["decode"]:
        inst.pop("container", None)
    data["router"].pop("container", None)
    plan, _ = plan_of(data)
    with pytest.raises(ExportError, match="no default image for hpu"):
        build(plan)
    specs = role_specs(build(plan, image={"hpu": HPU_IMAGE}).objects)
    p = templates(specs["prefill"])[0]["spec"]["containers"][0]
    d = templates(specs["decode"])[0]["spec"]["containers"][0]
    assert (p["image"], p["resources"]) == (HPU_IMAGE, {"limits": {"habana.ai/gaudi": 1}})
    assert (d["image"], d["resources"]) == (
        "vllm/vllm-openai:v0.32.0",
        {"limits": {"nvidia.com/gpu": 1}},
    )
    assert not any(e["name"] == "HABANA_VISIBLE_MODULES" for e in p["env"])
    cpu, _ = plan_of(topology_data("local-cpu.yaml"))
    c = templates(role_specs(build(cpu).objects)["prefill"])[0]["spec"]["containers"][0]
    assert "resources" not in c and c["image"].endswith("vllm-cpu-release-repo:v0.32.0")
    one = build(cpu, image="mine:1", router_image="router:2").objects
    assert templates(role_specs(one)["decode"])[0]["spec"]["containers"][0]["image"] == "mine:1"
    assert router_container(one)["image"] == "router:2"
    with pytest.raises(ExportError, match="unknown device kind tpu"):
        build(cpu, image={"tpu": "x"})


# -- refusals ----------------------------------------------------------------------------------


def test_a_topology_the_rules_reject_exports_nothing(tmp_path: Path):
    data = topology_data("local-cpu.yaml")
    data["decode"][0]["port"] = 8100  # the prefill's port on the same host
    topo, source = topology(data)
    assert has_errors(validate(topo, source))
    with pytest.raises(ExportError, match="port-conflict"):
        export_k8s(build_plan(topo), topo, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_plan_must_come_from_the_topology(tmp_path: Path):
    plan, _ = plan_of(topology_data("local-cpu.yaml"))
    _, other = plan_of(topology_data("gb200-xpyd.yaml"))
    with pytest.raises(ExportError, match="not built from this topology"):
        export_k8s(plan, other, tmp_path)


def test_instances_of_a_role_must_share_one_template():
    data = topology_data("gb200-xpyd.yaml")
    data["prefill"][1]["extra_args"] = ["--max-num-seqs=16"]
    plan, _ = plan_of(data)
    with pytest.raises(ExportError, match=r"prefill instances prefill-0 and prefill-1 differ"):
        build(plan)
    # Two instances that share a machine differ only in their side-channel base: allowed.
    data = topology_data("local-cpu.yaml")
    data["decode"].append({**data["decode"][0], "port": 8300, "devices": [5]})
    plan, _ = plan_of(data)
    bases = {p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for p in plan.by_role("decode")}
    assert len(bases) == 2
    export = build(plan)
    assert role_specs(export.objects)["decode"]["replicas"] == 2
    assert any("another NIXL side-channel base" in n for n in export.notes)


def test_router_flags_the_export_derives_are_refused():
    data = topology_data("local-cpu.yaml")
    data["router"]["extra_args"] = ["--service-discovery-port", "9"]
    topo, source = topology(data)
    assert not has_errors(validate(topo, source))  # the rules take it; the export cannot
    with pytest.raises(ExportError, match="--service-discovery-port"):
        build(build_plan(topo))


def test_unknown_target():
    plan, _ = plan_of(topology_data("local-cpu.yaml"))
    with pytest.raises(ExportError, match="unknown target"):
        build(plan, "helm")  # type: ignore[arg-type]


# -- files -------------------------------------------------------------------------------------


def test_same_plan_same_bytes(tmp_path: Path):
    plan, _ = plan_of(topology_data("gb200-xpyd.yaml"))
    a = write_manifests(plan, tmp_path / "a")
    b = write_manifests(plan, tmp_path / "b")
    assert [p.name for p in a] == [p.name for p in b]
    assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b, strict=True))
    # Another interpreter, another hash seed: still the same bytes.
    code = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {str(ROOT)!r})
        from pdlaunch.load import load
        from pdlaunch.plan import build_plan
        from pdlaunch.backends.k8s_files import write_manifests
        write_manifests(build_plan(load({str(ROOT / "topologies" / "gb200-xpyd.yaml")!r})[0]),
                        {str(tmp_path / "c")!r})
        """
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONHASHSEED": "7"}
    )
    c = sorted((tmp_path / "c").iterdir())
    assert [p.name for p in c] == sorted(p.name for p in a)
    assert all(p.read_bytes() == (tmp_path / "a" / p.name).read_bytes() for p in c)


def test_switching_target_removes_the_other_targets_files(tmp_path: Path):
    plan, _ = plan_of(topology_data("local-cpu.yaml"))
    write_manifests(plan, tmp_path, "disaggregatedset")
    (tmp_path / "mine.yaml").write_text("kind: ConfigMap\n")
    write_manifests(plan, tmp_path, "lws")
    names = sorted(p.name for p in tmp_path.glob("*.yaml"))
    assert not any("disaggregatedset" in n for n in names)
    assert "mine.yaml" in names and any("leaderworkerset" in n for n in names)


def test_k8s_names():
    assert k8s.k8s_name("gb200-xpyd") == "gb200-xpyd"
    odd = k8s.k8s_name("My_Deploy.v2")
    assert kube.DNS_LABEL.match(odd) and odd.startswith("my-deploy-v2-")
    assert k8s.k8s_name("My_Deploy.v2") != k8s.k8s_name("my-deploy-v2")
    long = k8s.k8s_name("a" * 63)
    assert len(long) <= k8s.MAX_NAME and kube.DNS_LABEL.match(long)
    assert k8s.k8s_name("9lives").startswith("pd-9lives")
    # The longest name DisaggregatedSet derives from it stays a DNS label:
    # <name>-<slice>-<8-hex revision>-prefill, its worker StatefulSet -<group>, and the
    # StatefulSet controller's <statefulset>-<10-char hash> label value.
    worst = f"{long}-0-abcdef12-prefill-999-abcdefghij"
    assert len(worst) <= 63


def test_objects_are_independent_copies():
    plan, _ = plan_of(topology_data("local-cpu.yaml"))
    first = build(plan).objects
    first[3]["spec"]["roles"][0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"][
        "volumes"
    ][0]["name"] = "changed"
    again = build(plan).objects
    assert (
        again[3]["spec"]["roles"][0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"][
            "volumes"
        ][0]["name"]
        == "dshm"
    )
