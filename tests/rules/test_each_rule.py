"""Each rule fires on the topology it exists for, names the right field and line, and
stays quiet on the seed topologies."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from pdlaunch.rules import RULES, validate
from pdlaunch.spec.load import load, load_text

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))

BASE = {
    "deployment": "t",
    "model": {"name": "m"},
    "prefill": [{"host": "10.0.0.1", "device": "cuda", "port": 8100}],
    "decode": [{"host": "10.0.0.2", "device": "cuda", "port": 8200}],
    "router": {"host": "10.0.0.3"},
}


def findings(patch: dict | None = None, **top):
    data = copy.deepcopy(BASE)
    for key, value in (patch or {}).items():
        role, idx, field = key.split(".")
        data[role][int(idx)][field] = value
    data.update(top)
    text = yaml.safe_dump(data, sort_keys=False)
    topo, source = load_text(text, "t.yaml")
    return validate(topo, source)


def ids(found) -> set[str]:
    return {f.rule for f in found if f.severity == "error"}


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.name)
def test_shipped_topologies_are_valid(path):
    topo, source = load(path)
    assert [f for f in validate(topo, source) if f.severity == "error"] == []


def test_base_is_valid():
    assert findings() == []


def test_every_rule_has_id_source_and_is_unique():
    assert len({r.id for r in RULES}) == len(RULES)
    assert all(r.source and r.summary for r in RULES)


def test_finding_names_file_line_field_and_fix():
    found = findings(
        {
            "decode.0.kv_layout": "NHD",
            "decode.0.device": "hpu",
            "decode.0.block_size": 128,
            "prefill.0.kv_layout": "NHD",
        },
        kv_connector={"enforce_handshake_compat": True},
    )
    f = next(f for f in found if f.rule == "handshake-compat")
    assert f.file == "t.yaml" and f.line is not None and f.line > 1
    assert f.where.startswith("t.yaml:") and "kv_connector.enforce_handshake_compat" in f.where
    assert f.fix and f.source


def test_same_model_dtype_mismatch():
    found = findings({"decode.0.dtype": "float16"}, model={"name": "m", "dtype": "bfloat16"})
    assert "same-model" in ids(found)
    assert "same-model" not in ids(
        findings({"decode.0.dtype": "bfloat16"}, model={"name": "m", "dtype": "bfloat16"})
    )


def test_kv_cache_dtype_mismatch():
    assert "same-model" in ids(findings({"prefill.0.kv_cache_dtype": "fp8"}))


def test_different_model_paths_need_served_name():
    assert "same-model" in ids(findings({"prefill.0.model_path": "/data/m"}))
    assert "same-model" not in ids(
        findings({"prefill.0.model_path": "/data/m"}, model={"name": "m", "served_name": "m"})
    )


def test_managed_flag_in_extra_args():
    found = findings({"prefill.0.extra_args": ["--seed=1", "--block-size=32"]})
    f = next(f for f in found if f.rule == "managed-flag")
    assert f.field == ("prefill", 0, "extra_args", 1)
    assert "block_size" in f.fix


def test_secret_in_args_refused():
    assert "secret-placement" in ids(findings({"prefill.0.extra_args": ["--api-key=${env:K}"]}))


def test_hetero_block_gcd_and_direction_decode_larger_is_stock():
    # decode 32 = 2 x prefill 16: stock vLLM merges on receive, no extension needed.
    assert ids(findings({"decode.0.block_size": 32})) == set()


def test_prefill_larger_needs_reblock_and_prefix_caching_off():
    found = findings(
        {
            "prefill.0.device": "hpu",
            "prefill.0.block_size": 128,
            "prefill.0.kv_layout": "NHD",
            "prefill.0.prefix_caching": True,
        }
    )
    f = next(f for f in found if f.rule == "prefill-postprocess")
    assert f.field == ("prefill", 0, "prefix_caching")
    # Left unset, pdlaunch turns prefix caching off itself: valid.
    assert (
        ids(
            findings(
                {
                    "prefill.0.device": "hpu",
                    "prefill.0.block_size": 128,
                    "prefill.0.kv_layout": "NHD",
                }
            )
        )
        == set()
    )


def test_agreed_block_size_must_divide_and_be_supported():
    found = findings({"decode.0.block_size": 48}, kv_connector={"agreed_block_size": 32})
    assert "agreed-block-size" in ids(found)
    # GCD(48, 32) = 16 is fine on CUDA ...
    assert "agreed-block-size" not in ids(
        findings({"prefill.0.block_size": 32, "decode.0.block_size": 48})
    )
    # ... but GCD(128, 160) = 32 is not a Gaudi block (multiple of 16 ok) -> use a CPU case:
    found = findings(
        {
            "prefill.0.block_size": 64,
            "decode.0.block_size": 96,
            "prefill.0.device": "hpu",
            "decode.0.device": "hpu",
            "prefill.0.kv_layout": "NHD",
            "decode.0.kv_layout": "NHD",
        },
        kv_connector={"agreed_block_size": 8},
    )
    assert "agreed-block-size" in ids(found)


def test_block_size_supported_per_device():
    assert "block-size" in ids(findings({"decode.0.block_size": 24}))
    assert "block-size" in ids(
        findings({"decode.0.device": "cpu", "decode.0.block_size": 48, "prefill.0.device": "cpu"})
    )


def test_cpu_refuses_heterogeneous_blocks():
    cpu = {"prefill.0.device": "cpu", "decode.0.device": "cpu"}
    # Decode merging smaller prefill blocks: stock merge, wrong tokens on CPU (measured).
    merge = findings({**cpu, "prefill.0.block_size": 64, "decode.0.block_size": 128})
    assert [f.field for f in merge if f.rule == "cpu-block-size"] == [("decode", 0, "block_size")]
    assert "cpu-block-size" not in ids(findings(cpu))
    # Prefill 128 -> decode 64: the extension's CPU adapter re-blocks, with a proven dtype.
    reblock = {**cpu, "prefill.0.block_size": 128, "decode.0.block_size": 64}

    def model(**kw):
        return {"model": {**BASE["model"], **kw}}

    ok = findings(reblock, **model(dtype="float32"))
    assert "cpu-block-size" not in ids(ok) and "prefill-postprocess" not in ids(ok)
    for dtype in ("bfloat16", "auto"):  # may select the unproven AMX kernels
        found = findings(reblock, **model(dtype=dtype))
        assert [f.field for f in found if f.rule == "cpu-block-size"] == [("model", "dtype")]
    fp8 = findings(reblock, **model(dtype="float32", kv_cache_dtype="fp8"))
    assert "cpu-block-size" in ids(fp8)
    # Prefix caching on a re-blocking CPU prefill is still refused.
    pc = findings({**reblock, "prefill.0.prefix_caching": True}, **model(dtype="float32"))
    assert "prefill-postprocess" in ids(pc)


def test_layouts_per_device():
    assert "kv-layout" in ids(
        findings(
            {"decode.0.device": "hpu", "decode.0.kv_layout": "HND", "decode.0.block_size": 128}
        )
    )
    assert "kv-layout" in ids(
        findings({"decode.0.device": "cpu", "decode.0.kv_layout": "NHD", "prefill.0.device": "cpu"})
    )


def test_layout_direction():
    # prefill HND -> decode NHD: vLLM permutes on receive (valid).
    assert ids(findings({"decode.0.kv_layout": "NHD"})) == set()
    # prefill NHD (can re-block on cuda) -> decode HND: the extension converts (valid).
    assert ids(findings({"prefill.0.kv_layout": "NHD"})) == set()
    # prefill NHD on npu (no extension) with mooncake is out of NIXL's scope; on CPU the
    # extension cannot run: a CPU prefill in NHD is already refused by kv-layout.


def test_advertised_layout_is_always_one_decode_can_take():
    """Why there is no layout-direction rule: kvgeometry.prefill_kv only advertises NHD pages
    to NHD decodes; anything else is HND, which vLLM permutes into an NHD cache
    (enable_permute_local_kv, base_worker.py:2511). Checked over every layout combination."""
    from itertools import product

    from pdlaunch.plan import kv_geometry as kv
    from pdlaunch.spec.load import load_text

    for p_dev, p_lay, d_lays in product(("cuda", "hpu"), ("NHD", "HND"), ("NHD", "HND", "mix")):
        if p_dev == "hpu" and p_lay == "HND":
            continue
        lays = ["NHD", "HND"] if d_lays == "mix" else [d_lays]
        decodes = ",".join(
            f"{{host: 10.0.0.{i + 2}, device: cuda, port: 8200, kv_layout: {lay}}}"
            for i, lay in enumerate(lays)
        )
        topo, _ = load_text(
            f"deployment: t\nmodel: {{name: m}}\nprefill: [{{host: 10.0.0.1, device: {p_dev}, "
            f"port: 8100, kv_layout: {p_lay}}}]\ndecode: [{decodes}]\nrouter: {{host: 10.0.0.9}}"
        )
        adv = kv.prefill_kv(topo, topo.prefill[0])
        for d in topo.decode:
            local = kv.kv_layout(d)
            assert adv.layout == local or (adv.layout, local) == ("HND", "NHD"), (p_lay, lays)


def test_tp_order_nixl_divisibility_and_hetero_block():
    assert "tp-order" in ids(
        findings(
            {
                "prefill.0.tp": 3,
                "decode.0.tp": 2,
                "prefill.0.devices": [0, 1, 2],
                "decode.0.devices": [0, 1],
            }
        )
    )
    found = findings({"prefill.0.tp": 2, "prefill.0.devices": [0, 1], "decode.0.block_size": 32})
    f = next(f for f in found if f.rule == "tp-order")
    assert "P TP > D TP" in f.source


def test_tp_order_mooncake_prefill_at_least_decode():
    npu = {
        "prefill.0.device": "npu",
        "decode.0.device": "npu",
        "decode.0.tp": 2,
        "decode.0.devices": [0, 1],
    }
    assert "tp-order" in ids(findings(npu, kv_connector={"kind": "mooncake"}))
    npu["prefill.0.tp"], npu["prefill.0.devices"] = 2, [0, 1]
    assert "tp-order" not in ids(findings(npu, kv_connector={"kind": "mooncake"}))


def test_tp_layout_needs_hnd_prefill():
    found = findings(
        {
            "prefill.0.kv_layout": "NHD",
            "decode.0.kv_layout": "NHD",
            "decode.0.tp": 2,
            "decode.0.devices": [0, 1],
        }
    )
    assert "tp-layout" in ids(found)


def test_connector_device():
    assert "connector-device" in ids(findings({"decode.0.device": "npu"}))


def test_port_conflicts_same_host():
    same = {"decode.0.host": "10.0.0.1", "decode.0.devices": [1]}
    assert ids(findings(same)) == set()  # side-channel bases are allocated apart
    found = findings({**same, "decode.0.port": 8100})
    f = next(f for f in found if f.rule == "port-conflict")
    assert "8100" in f.message and f.field == ("decode", 0, "port")
    # An explicit base is kept; automatic bases steer around it ...
    assert ids(findings({**same, "decode.0.side_channel_port": 5600})) == set()
    # ... but two explicit equal bases on one host clash.
    found = findings(
        {**same, "decode.0.side_channel_port": 5600, "prefill.0.side_channel_port": 5600}
    )
    assert "port-conflict" in ids(found)
    # loopback spellings are one host
    found = findings(
        {
            "prefill.0.host": "127.0.0.1",
            "decode.0.host": "localhost",
            "decode.0.port": 8100,
            "decode.0.devices": [1],
        },
        router={"host": "127.0.0.1"},
    )
    assert "port-conflict" in ids(found)


def test_router_port_conflict_and_privileged_warning():
    found = findings(router={"host": "10.0.0.1", "port": 8100})
    assert "port-conflict" in ids(found)
    warn = [f for f in findings({"prefill.0.port": 80}) if f.severity == "warning"]
    assert warn and warn[0].rule == "port-conflict"


def test_side_channel_range_beyond_65535():
    found = findings(
        {
            "prefill.0.dp": {"size": 4},
            "prefill.0.devices": [0, 1, 2, 3],
            "prefill.0.side_channel_port": 65534,
        }
    )
    assert any("beyond 65535" in f.message for f in found)


def test_mooncake_producer_ports_span_tp():
    npu = {
        "prefill.0.device": "npu",
        "decode.0.device": "npu",
        "prefill.0.tp": 2,
        "prefill.0.devices": [0, 1],
        "decode.0.host": "10.0.0.1",
        "decode.0.devices": [2, 3],
        "decode.0.tp": 2,
        "prefill.0.kv_port": 20001,
        "decode.0.port": 8101,
    }
    assert ids(findings(npu, kv_connector={"kind": "mooncake"})) == set()
    npu["decode.0.port"] = 20002  # prefill's TP rank 1 listens on 20002
    assert "port-conflict" in ids(findings(npu, kv_connector={"kind": "mooncake"}))


def test_hccl_range():
    npu = {"prefill.0.device": "npu", "decode.0.device": "npu", "prefill.0.kv_port": 16666}
    assert "ascend-ports" in ids(findings(npu, kv_connector={"kind": "mooncake"}))


def test_devices_overlap_and_count():
    same = {"decode.0.host": "10.0.0.1"}
    assert "devices" in ids(findings(same))  # both default to device 0
    assert "devices" not in ids(findings({**same, "decode.0.devices": [1]}))
    assert "devices" in ids(findings({"prefill.0.tp": 2, "prefill.0.devices": [0]}))


def test_dp_shape():
    found = findings(
        {"prefill.0.host": None, "prefill.0.hosts": ["a", "b"], "prefill.0.dp": {"size": 3}}
    )
    assert "dp-shape" in ids(found)


def test_handshake_compat_forced_on_with_mixed_devices():
    hetero = {"decode.0.device": "hpu", "decode.0.kv_layout": "NHD", "decode.0.block_size": 128}
    assert ids(findings(hetero)) == set()
    assert "handshake-compat" in ids(
        findings(hetero, kv_connector={"enforce_handshake_compat": True})
    )


def test_host_buffer_with_hetero_blocks_refused():
    found = findings({"decode.0.block_size": 32}, kv_connector={"kv_buffer_device": "cpu"})
    assert "handshake-compat" in ids(found)


def test_router_reach_loopback_bind():
    found = findings({"prefill.0.bind": "127.0.0.1"})
    assert "router-reach" in ids(found)
    found = findings({"prefill.0.host": "127.0.0.1"})
    assert "router-reach" in ids(found)


def test_pipeline_parallel_refused():
    assert "pipeline-parallel" in ids(
        findings({"decode.0.extra_args": ["--pipeline-parallel-size=2"]})
    )
    assert "pipeline-parallel" not in ids(findings({"decode.0.extra_args": ["-pp", "1"]}))


def test_unique_names():
    assert "unique-names" in ids(findings({"decode.0.name": "prefill-0"}))


def test_decode_prefix_caching_off_when_merging():
    found = findings({"decode.0.block_size": 32, "decode.0.prefix_caching": True})
    assert "decode-prefix-caching" in ids(found)
    assert "decode-prefix-caching" not in ids(findings({"decode.0.block_size": 32}))
