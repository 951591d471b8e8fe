"""`pdlaunch export k8s`, pod by pod: multi-node data-parallel groups and their ranks, how the
router finds the engine pods, and the environment and paths each container ends up with
(tests/support/k8s_export.py turns the objects into the commands pods run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdlaunch.backends.k8s import manifests as k8s
from pdlaunch.backends.k8s.manifests import ExportError, build
from pdlaunch.spec import facts
from pdlaunch.spec.devices import PROFILES
from tests.backends import kube
from tests.support.k8s_export import (
    HPU_IMAGE,
    non_hybrid,
    objects_by_kind,
    plan_of,
    role_specs,
    router_container,
    run_shell,
    templates,
    topology_data,
    with_vllm_router,
)

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
        "vllm/vllm-openai:v0.13.0",  # the release the example pins (its guide's)
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


# -- the router's container -------------------------------------------------------------------


def test_the_router_takes_its_containers_mounts_and_devices():
    data = topology_data("local-cpu.yaml")
    data["router"]["container"] = {
        "image": "registry.example/router:1",
        "mounts": ["/etc/pki/tls:/etc/pki/tls:ro", "/var/log/router:/logs"],
        "devices": ["/dev/infiniband/uverbs0"],
    }
    plan, _ = plan_of(data)
    objects = build(plan).objects
    (dep,) = objects_by_kind(objects)["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    container = router_container(objects)
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounted = {m["mountPath"]: (volumes[m["name"]], m.get("readOnly", False))
               for m in container["volumeMounts"]}  # fmt: skip
    assert mounted == {
        "/etc/pki/tls": ("/etc/pki/tls", True),
        "/logs": ("/var/log/router", False),
        "/dev/infiniband/uverbs0": ("/dev/infiniband/uverbs0", False),
    }
    assert container["image"] == "registry.example/router:1"
    kube.validate(dep)


def test_a_router_without_a_container_spec_gets_no_volumes():
    plan, _ = plan_of(topology_data("local-cpu.yaml"))
    (dep,) = objects_by_kind(build(plan).objects)["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert "volumes" not in pod and "volumeMounts" not in pod["containers"][0]
    assert "securityContext" not in pod["containers"][0]


# -- what the device plugin gives a pod itself -------------------------------------------------


def _pod_of(objects: list[dict], role: str) -> dict:
    return templates(role_specs(objects)[role])[0]["spec"]


def test_ascend_pods_get_their_npus_from_the_device_plugin_not_the_host():
    plan, _ = plan_of(topology_data("ascend-mooncake-tp2.yaml"))
    export = build(plan)
    for role in ("prefill", "decode"):
        proc = plan.by_role(role)[0]
        # Over SSH the guide's docker run: every device node, /dev, the driver, privileged.
        assert proc.container.privileged and "/dev:/dev" in proc.container.mounts
        assert "/dev/davinci_manager" in proc.container.devices
        pod = _pod_of(export.objects, role)
        (c,) = pod["containers"]
        host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        # In a pod: none of them (they would show every NPU of the node); the topology's own
        # mounts stay, the NPUs come as the resource.
        assert "securityContext" not in c
        assert not host_paths & {"/dev", "/usr/local/Ascend/driver", "/dev/davinci_manager",
                                 "/dev/hisi_hdc", "/dev/devmm_svm", "/usr/local/dcmi"}  # fmt: skip
        assert {"/mnt", "/data", "/home", "/opt"} <= host_paths
        assert c["resources"] == {"limits": {"huawei.com/Ascend910": 2}}
        assert not any(e["name"] == "ASCEND_RT_VISIBLE_DEVICES" for e in c["env"])
        # Mooncake's handshake ports (kv_port + TP rank) are the pod's own.
        assert [p["containerPort"] for p in c["ports"] if p["name"].startswith("mooncake")] == [
            x.port for x in proc.ports if x.kind == "mooncake_kv"
        ]
    assert any("Ascend Docker Runtime" in n for n in export.notes)
    assert any("get_ip(), the pod's IP" in n for n in export.notes)
    for obj in export.objects:
        kube.validate(obj)


def test_gaudi_pods_do_not_ask_the_runtime_for_every_gaudi():
    plan, _ = plan_of(topology_data("cuda-prefill-gaudi-decode.yaml"))
    proc = plan.by_role("decode")[0]
    assert proc.container.env["HABANA_VISIBLE_DEVICES"] == "all"  # over SSH: the guide's
    export = build(plan)
    (c,) = _pod_of(export.objects, "decode")["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert "HABANA_VISIBLE_DEVICES" not in env
    assert env["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"
    # The guide's --privileged (for InfiniBand) stays, and the export says what it costs.
    assert c["securityContext"] == {"privileged": True}
    assert any("decode: the pods run privileged" in n for n in export.notes)
