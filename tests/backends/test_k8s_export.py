"""`pdlaunch export k8s` (pdlaunch.backends.k8s.manifests): the manifests are valid Kubernetes
objects, carry the plan (argv, env, ports, devices) with only machine-bound values replaced, never a
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

from pdlaunch.backends.k8s import manifests as k8s
from pdlaunch.backends.k8s.files import export_k8s, write_manifests
from pdlaunch.backends.k8s.manifests import ExportError, build
from pdlaunch.plan.build import build_plan
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.load import load
from tests.backends import kube
from tests.support.k8s_export import (
    HPU_IMAGE,
    ROOT,
    SENTINEL,
    SHIPPED,
    TARGETS,
    plan_of,
    pod_command,
    role_specs,
    run_shell,
    templates,
    topology,
    topology_data,
    with_vllm_router,
)

# -- every shipped topology --------------------------------------------------------------------

# The shipped topologies whose router takes fixed host lists (router.kind toy-proxy): they
# export as LeaderWorkerSets, whose pods have names known at export (test_k8s_proxy.py).
PROXIED = {
    "ascend-mooncake-tp2.yaml",
    "cuda-prefill-gaudi-decode.yaml",
    "gaudi-prefill-cuda-decode.yaml",
}


def test_every_shipped_topology_exports_with_the_default_target(tmp_path: Path):
    assert {p.name for p in SHIPPED} >= PROXIED | {"gb200-xpyd.yaml", "local-cpu.yaml"}
    for path in SHIPPED:
        topo, source = load(path)
        written = export_k8s(build_plan(topo), topo, tmp_path / path.stem, source=source)
        index = (tmp_path / path.stem / "index.md").read_text()
        target = "lws" if path.name in PROXIED else "disaggregatedset"
        assert f"Kubernetes manifests ({target})" in index, path.name
        assert len(written) > 3


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_topology_exports_valid_objects(path: Path, target: str, tmp_path: Path):
    topo, source = load(path)
    assert not has_errors(validate(topo, source)), "a shipped topology must validate"
    plan = build_plan(topo)
    image = {"hpu": HPU_IMAGE}
    if path.name in PROXIED and target == "disaggregatedset":
        with pytest.raises(ExportError, match="DisaggregatedSet names its LeaderWorkerSets"):
            export_k8s(plan, topo, tmp_path / "out", target, image, source=source)
        assert not (tmp_path / "out").exists()
        if "ascend" in path.name:
            return
        # The same deployment behind vllm-router exports.
        plan, topo = plan_of(with_vllm_router(topology_data(path.name)))
    written = export_k8s(plan, topo, tmp_path / "out", target, image)
    objects = [yaml.safe_load(p.read_text()) for p in written if p.suffix == ".yaml"]
    assert objects == build(plan, target, image).objects
    kinds = [o["kind"] for o in objects]
    workload = ["DisaggregatedSet"] if target == "disaggregatedset" else ["LeaderWorkerSet"] * 2
    rbac = [] if k8s.check_router(plan) else ["ServiceAccount", "Role", "RoleBinding"]
    assert kinds == [*rbac, *workload, "Service", "Deployment"]
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
        from pdlaunch.spec.load import load
        from pdlaunch.plan.build import build_plan
        from pdlaunch.backends.k8s.files import write_manifests
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
