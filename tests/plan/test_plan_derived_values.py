"""The plan derives every value once; check the derived values against the sources."""

from __future__ import annotations

import json
from pathlib import Path

from pdlaunch.kv import CONNECTOR_CLASS, CONNECTOR_MODULE_PATH
from pdlaunch.plan.build import build_plan
from pdlaunch.plan.render import render_plan
from pdlaunch.spec.load import load, load_text

ROOT = Path(__file__).resolve().parents[2]


def plan_of(name: str):
    topo, _ = load(ROOT / "topologies" / name)
    return build_plan(topo)


def kv_config(proc) -> dict:
    return json.loads(proc.argv[proc.argv.index("--kv-transfer-config") + 1])


def test_local_cpu_binds_separate_cores_and_side_channels():
    plan = plan_of("local-cpu.yaml")
    p, d = plan.by_role("prefill")[0], plan.by_role("decode")[0]
    assert p.env["VLLM_CPU_OMP_THREADS_BIND"] != d.env["VLLM_CPU_OMP_THREADS_BIND"]
    assert p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] != d.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    assert kv_config(p)["kv_buffer_device"] == "cpu"
    # One layout on CPU: left to vLLM; UCX kept on loopback.
    assert "VLLM_KV_CACHE_LAYOUT" not in p.env and p.env["UCX_NET_DEVICES"] == "lo"
    assert kv_config(p)["kv_connector_extra_config"] == {"kv_lease_duration": 600}
    assert plan.router.argv[plan.router.argv.index("--prometheus-port") + 1] == "29123"
    assert p.local and d.local
    assert plan.router.argv[:1] == ["vllm-router"]
    assert "--vllm-pd-disaggregation" in plan.router.argv
    assert p.health_url == "http://127.0.0.1:8100/health"
    assert "--no-enable-prefix-caching" in p.argv and "--enforce-eager" in p.argv


def test_gaudi_prefill_at_guide_pin_renders_the_native_connector():
    # Seed guide Case 2 (vLLM f21f5ea + vllm-gaudi e269485 on PR 30448's branch): the Gaudi
    # prefill runs NixlConnector with agreed_block_size and enable_permute_local_kv, not
    # pdlaunch's extension (which cannot re-block the flat HPU cache).
    plan = plan_of("gaudi-prefill-cuda-decode.yaml")
    p, d = plan.by_role("prefill")[0], plan.by_role("decode")[0]
    assert plan.agreed_block_size == 16
    assert p.plugin == "vllm-gaudi@e269485"
    assert kv_config(p) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
        "kv_buffer_device": "hpu",
        "enable_permute_local_kv": True,
        "kv_connector_extra_config": {"enforce_handshake_compat": False, "agreed_block_size": 16},
    }
    assert CONNECTOR_CLASS not in p.argv[-1] and CONNECTOR_MODULE_PATH not in " ".join(p.argv)
    # e269485 has no hetero_hpu_nixl_connector, so nothing switches it on.
    assert "VLLM_HPU_HETERO_KV_LAYOUT" not in p.env
    assert "--no-enable-prefix-caching" in p.argv
    assert "--no-enable-prefix-caching" not in d.argv
    assert kv_config(d)["kv_connector"] == "NixlConnector"
    assert p.env["UCX_TLS"] == "ib,rc,gaudi_gdr" and d.env["UCX_TLS"] == "ib,rc,cuda_copy"
    assert kv_config(d)["kv_buffer_device"] == "cuda"
    assert [(k.prefill, k.decode, k.path) for k in plan.kv_paths] == [
        ("prefill-0", "decode-0", "plugin")
    ]


GAUDI_PREFILL = """
deployment: t
model: {name: m}
prefill: [{host: a, device: hpu, block_size: 128, kv_layout: NHD%s}]
decode: [{host: b, device: %s, block_size: 16}]
router: {host: c}
"""


def test_gaudi_prefill_on_a_hetero_release_switches_the_plugin_connector_on():
    # vllm-gaudi >= v0.15.1 imports hetero_hpu_nixl_connector only with
    # VLLM_HPU_HETERO_KV_LAYOUT=true (vllm_gaudi/__init__.py:15 at v0.15.1).
    for plugin in ("", ", plugin: vllm-gaudi@v0.15.1"):
        topo, _ = load_text(GAUDI_PREFILL % (plugin, "cuda"), "t.yaml")
        p = build_plan(topo).by_role("prefill")[0]
        assert p.env["VLLM_HPU_HETERO_KV_LAYOUT"] == "true", plugin
        cfg = kv_config(p)
        assert cfg["kv_connector"] == "NixlConnector" and "kv_connector_module_path" not in cfg
        assert cfg["enable_permute_local_kv"] is True
        assert cfg["kv_connector_extra_config"]["agreed_block_size"] == 16
        assert "--no-enable-prefix-caching" in p.argv


def test_cuda_prefill_larger_block_uses_the_extension():
    topo, _ = load_text(
        "deployment: t\nmodel: {name: m}\n"
        "prefill: [{host: a, device: cuda, block_size: 64, kv_layout: NHD}]\n"
        "decode: [{host: b, device: cuda, block_size: 16, kv_layout: HND}]\n"
        "router: {host: c}\n",
        "t.yaml",
    )
    plan = build_plan(topo)
    p = plan.by_role("prefill")[0]
    assert p.plugin is None
    assert kv_config(p)["kv_connector"] == CONNECTOR_CLASS
    assert kv_config(p)["kv_connector_module_path"] == CONNECTOR_MODULE_PATH
    assert plan.kv_paths[0].path == "extension"


def test_cuda_prefill_gaudi_decode_permutes_on_decode():
    plan = plan_of("cuda-prefill-gaudi-decode.yaml")
    p, d = plan.by_role("prefill")[0], plan.by_role("decode")[0]
    assert kv_config(d)["enable_permute_local_kv"] is True
    assert "enable_permute_local_kv" not in kv_config(p)
    assert kv_config(p)["kv_connector"] == "NixlConnector"
    assert d.env["HABANA_VISIBLE_MODULES"] == "0"


def test_gb200_nodes_ranks_and_ports():
    plan = plan_of("gb200-xpyd.yaml")
    names = [p.name for p in plan.processes]
    assert names == [
        "prefill-0-node0",
        "prefill-0-node1",
        "prefill-1-node0",
        "prefill-1-node1",
        "decode-0-node0",
        "decode-0-node1",
        "router",
    ]
    worker = plan.processes[1]
    argv = worker.argv
    assert argv[argv.index("--data-parallel-start-rank") + 1] == "4"
    assert argv[argv.index("--data-parallel-address") + 1] == "gb200-p0-master"
    assert argv[argv.index("--data-parallel-size-local") + 1] == "4"
    assert "--data-parallel-hybrid-lb" in argv
    side = sorted(x.port for x in worker.ports if "NIXL" in x.purpose)
    assert side == [5604, 5605, 5606, 5607]  # base + global DP rank
    assert worker.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert worker.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    master_ports = {x.port for x in plan.processes[0].ports}
    assert 13345 in master_ports and 13345 not in {x.port for x in worker.ports}
    assert plan.router.argv.count("--prefill") == 4 and plan.router.argv.count("--decode") == 2
    assert worker.secret_env == {"HF_TOKEN": "HF_TOKEN"}
    assert "HF_TOKEN" not in worker.env


def test_each_api_server_knows_the_dp_ranks_it_fronts():
    # hybrid load balancing (gb200-xpyd): each node's API server takes its own 4 ranks
    plan = plan_of("gb200-xpyd.yaml")
    ranks = {p.name: p.dp_ranks for p in plan.processes}
    assert ranks["prefill-0-node0"] == [0, 1, 2, 3]
    assert ranks["prefill-0-node1"] == [4, 5, 6, 7]
    assert ranks["router"] == []
    # internal load balancing: the master's server takes every rank, the other node is
    # headless (no API server, nothing to pin)
    text = (ROOT / "topologies" / "gb200-xpyd.yaml").read_text()
    assert text.count("hybrid_lb: true") == 3
    topo, _ = load_text(text.replace("hybrid_lb: true", "hybrid_lb: false"), "gb200-internal-lb")
    plan = build_plan(topo)
    ranks = {p.name: p.dp_ranks for p in plan.processes}
    assert ranks["decode-0-node0"] == list(range(8)) and ranks["decode-0-node1"] == []
    assert plan.by_role("decode")[1].health_url is None
    # no data parallel: one engine
    assert all(p.dp_ranks == [] for p in plan_of("local-cpu.yaml").processes)


def test_ascend_mooncake_config():
    plan = plan_of("ascend-mooncake-tp2.yaml")
    p, d = plan.by_role("prefill")[0], plan.by_role("decode")[0]
    assert (
        p.env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1" and d.env["ASCEND_RT_VISIBLE_DEVICES"] == "2,3"
    )
    cp, cd = kv_config(p), kv_config(d)
    assert (cp["kv_role"], cp["kv_port"], cp["engine_id"]) == ("kv_producer", "20001", "0")
    assert (cd["kv_role"], cd["kv_port"], cd["engine_id"]) == ("kv_consumer", "20002", "1")
    assert cp["kv_connector_extra_config"]["prefill"] == {"dp_size": 1, "tp_size": 2}
    assert sorted(x.port for x in p.ports) == [8107, 20001, 20002]
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in p.env


def test_render_is_deterministic_and_quoted():
    plan = plan_of("gb200-xpyd.yaml")
    a = [(f.name, f.content) for f in render_plan(plan)]
    b = [(f.name, f.content) for f in render_plan(plan_of("gb200-xpyd.yaml"))]
    assert a == b
    decode = dict(a)["decode-0-node0.sh"]
    # JSON reaches the script single-quoted, byte for byte.
    kv_json = next(a for a in plan.by_role("decode")[0].argv if a.startswith('{"kv_connector"'))
    assert f"--kv-transfer-config '{kv_json}'" in decode


def test_overrides_precedence():
    topo, _ = load_text(
        """
deployment: t
model: {name: m}
defaults: {env: {A: d, B: d}, ssh: {user: u1}, work_dir: /w}
hosts:
  h1: {env: {B: h}, ssh: {user: u2, port: 2222}}
prefill: [{host: h1, device: cuda, env: {C: i}}]
decode: [{host: h2, device: cuda, work_dir: /x, ssh: {user: u3}}]
router: {host: h3}
""",
        "t.yaml",
    )
    plan = build_plan(topo)
    p, d = plan.by_role("prefill")[0], plan.by_role("decode")[0]
    assert (p.env["A"], p.env["B"], p.env["C"]) == ("d", "h", "i")
    assert (p.ssh.user, p.ssh.port) == ("u2", 2222)
    assert d.ssh.user == "u3" and d.work_dir == "/x/t" and p.work_dir == "/w/t"
    assert not p.local


def test_nhd_to_nhd_uses_alias_mode_without_permute():
    # CUDA (the extension's cache): NHD pages feeding NHD decodes are already sub-pages.
    topo, _ = load_text(
        """
deployment: t
model: {name: m}
prefill: [{host: a, device: cuda, block_size: 128, kv_layout: NHD}]
decode: [{host: b, device: cuda, block_size: 16, kv_layout: NHD}]
router: {host: c}
""",
        "t.yaml",
    )
    plan = build_plan(topo)
    p, d = plan.by_role("prefill")[0], plan.by_role("decode")[0]
    extra = kv_config(p)["kv_connector_extra_config"]
    assert extra["decode_kv_layout"] == "NHD" and extra["agreed_block_size"] == 16
    assert "enable_permute_local_kv" not in kv_config(d)


def test_hpu_to_hpu_smaller_block_saves_hnd_and_decode_permutes():
    # vllm-gaudi's hetero connector always saves HND (hetero_hpu_nixl_connector.py
    # kv_cache_layout_on_save = "HND"), so an NHD Gaudi decode permutes it back on receive.
    topo, _ = load_text(GAUDI_PREFILL % ("", "hpu"), "t.yaml")
    plan = build_plan(topo)
    p, d = plan.by_role("prefill")[0], plan.by_role("decode")[0]
    assert kv_config(p)["kv_connector"] == "NixlConnector"
    assert p.env["VLLM_HPU_HETERO_KV_LAYOUT"] == "true"
    assert kv_config(d)["enable_permute_local_kv"] is True


def test_nixl_kv_role_split_by_default_and_both_on_request():
    text = (ROOT / "topologies" / "local-cpu.yaml").read_text()
    plan = build_plan(load_text(text, "local-cpu.yaml")[0])
    roles = {p.role: kv_config(p)["kv_role"] for p in plan.processes if p.role != "router"}
    assert roles == {"prefill": "kv_producer", "decode": "kv_consumer"}
    both = text.replace("  kind: nixl\n", "  kind: nixl\n  kv_role: both\n")
    assert both != text
    plan = build_plan(load_text(both, "local-cpu.yaml")[0])
    engines = [p for p in plan.processes if p.role != "router"]
    assert {kv_config(p)["kv_role"] for p in engines} == {"kv_both"}


def test_processes_carry_typed_facts():
    plan = plan_of("gb200-xpyd.yaml")
    p0 = plan.processes[0]
    assert (p0.device, p0.model_path) == ("cuda", "nvidia/DeepSeek-R1-0528-FP4-v2")
    assert p0.kv_transfer_config == kv_config(p0) and p0.gpu_memory_utilization == 0.9
    kinds = {pp.kind for p in plan.processes for pp in p.ports}
    assert kinds == {"http", "nixl_side_channel", "dp_rpc", "router_http", "router_metrics"}
    assert plan.router.device is None and plan.vllm_version == "0.32"
    cpu = plan_of("local-cpu.yaml").by_role("decode")[0]
    assert cpu.device == "cpu" and cpu.gpu_memory_utilization is None


def test_reach_pairs_read_port_kinds_not_labels():
    from pdlaunch.check.reach import reach_pairs

    plan = plan_of("gb200-xpyd.yaml")
    relabeled = plan.model_copy(
        update={
            "processes": [
                p.model_copy(
                    update={"ports": [pp.model_copy(update={"purpose": "x"}) for pp in p.ports]}
                )
                for p in plan.processes
            ]
        }
    )
    pairs = [(r.source, r.dest, r.port) for r in reach_pairs(plan)]
    assert pairs == [(r.source, r.dest, r.port) for r in reach_pairs(relabeled)]
    assert len(pairs) > 10
