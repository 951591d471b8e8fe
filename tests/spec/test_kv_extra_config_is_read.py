"""Every kv_connector_extra_config key pdlaunch renders is read by the connector that process
loads, for every shipped topology on every vLLM release pdlaunch has facts for.

A key nobody reads parses and does nothing (the bar: "a flag that parses but does nothing is
a bug"). The readers are worked out here from the data, not from pdlaunch/plan/kv_readers.py:

- vLLM's NixlConnector of the process's release: facts `runtime.nixl.extra_config_keys`
  (generated from each wheel, file:line);
- pdlaunch's KV extension (kv_connector_module_path pdlaunch.kv.connector): its documented
  keys (pdlaunch/kv/__init__.py, read in pdlaunch/kv/connector.py) on top of NIXL's;
- a prefill whose plugin profile post-processes natively with that very connector, with the
  env that switches it on exported: the profile's `extra_config` keys;
- Mooncake: the plugin profile's `mooncake_extra_config` keys.
"""

from __future__ import annotations

import json
from pathlib import Path

from pdlaunch.plan.build import build_plan
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec import facts
from pdlaunch.spec.load import parse_text, read_text, validate_data
from scripts.check_vllm_matrix import _without_user_extras

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "pdlaunch" / "spec" / "facts" / "plugins"
EXTENSION_KEYS = {"agreed_block_size", "decode_block_sizes", "decode_kv_layout"}


def _profile(pid: str) -> dict:
    return json.loads((PROFILES / f"{pid}.json").read_text())


def expected_readers(plan_kind: str, proc) -> set[str]:
    cfg = proc.kv_transfer_config
    if plan_kind == "mooncake":
        assert proc.plugin, proc.name
        return set(_profile(proc.plugin)["mooncake_extra_config"]["keys"])
    keys = set(facts.vllm(proc.vllm_version).nixl["extra_config_keys"])
    if cfg.get("kv_connector_module_path") == "pdlaunch.kv.connector":
        return keys | EXTENSION_KEYS
    if proc.role == "prefill" and proc.plugin:
        for post in _profile(proc.plugin)["post_processing"]:
            on = all(proc.env.get(k) == v for k, v in post["env"].items())
            if post["side"] == "prefill" and post["connector"] == cfg["kv_connector"] and on:
                keys |= set(post["extra_config"])
    return keys


def _plan_for(path: Path, series: str):
    data, source = parse_text(read_text(path), str(path))
    data["model"]["vllm_version"] = series
    for role in ("prefill", "decode"):
        for inst in data.get(role, []):
            inst.pop("vllm_version", None)
    for candidate in (data, _without_user_extras(data)):
        topo = validate_data(candidate, source)
        if not has_errors(validate(topo, source)):
            return build_plan(topo)
    return None


def test_every_rendered_extra_config_key_is_read_by_its_connector():
    unread: list[str] = []
    planned = rendered = 0
    agreed_on: set[tuple[str, str]] = set()
    for series in facts.supported_vllm():
        for path in sorted((ROOT / "topologies").glob("*.yaml")):
            plan = _plan_for(path, series)
            if plan is None:
                continue
            planned += 1
            for proc in plan.processes:
                if proc.role == "router" or not proc.kv_transfer_config:
                    continue
                extra = proc.kv_transfer_config.get("kv_connector_extra_config", {})
                readers = expected_readers(plan.kv_connector, proc)
                rendered += len(extra)
                if "agreed_block_size" in extra:
                    agreed_on.add((path.stem, proc.role))
                unread += [
                    f"{series} {path.name} {proc.name}: {key!r} (read: {sorted(readers)})"
                    for key in extra
                    if key not in readers
                ]
    assert unread == [], "\n".join(unread)
    # Not vacuous: most (release, topology) pairs plan, keys are rendered, and the agreed
    # block size still reaches the Gaudi prefill whose native post-processing reads it.
    assert planned >= 3 * len(facts.supported_vllm()) and rendered > 100
    assert ("gaudi-prefill-cuda-decode", "prefill") in agreed_on
    assert not any(role == "decode" for _, role in agreed_on), agreed_on


TWO_CUDA = """
deployment: t
model: {{name: m}}
prefill: [{{host: 10.0.0.1, device: cuda, port: 8100, block_size: {p}}}]
decode: [{{host: 10.0.0.2, device: cuda, port: 8200, block_size: 64}}]
kv_connector: {{kind: nixl, agreed_block_size: 16}}
router: {{host: 10.0.0.3}}
"""


def test_an_explicit_agreed_size_only_a_re_blocking_prefill_reads():
    from pdlaunch.spec.load import load_text

    # Prefill 64 -> 16: pdlaunch's extension re-blocks and reads it, decode does not get it.
    topo, source = load_text(TWO_CUDA.format(p=64), "t.yaml")
    assert not has_errors(validate(topo, source))
    plan = build_plan(topo)
    p, d = plan.by_role("prefill")[0], plan.by_role("decode")[0]
    assert p.kv_transfer_config["kv_connector_extra_config"]["agreed_block_size"] == 16
    assert "agreed_block_size" not in d.kv_transfer_config.get("kv_connector_extra_config", {})
    # Prefill 16 -> decode 64: stock NIXL on both sides (decode merges), nobody reads it.
    topo, source = load_text(TWO_CUDA.format(p=16), "t.yaml")
    found = [f for f in validate(topo, source) if f.severity == "error"]
    assert [(f.rule, f.field) for f in found] == [
        ("version-render", ("kv_connector", "agreed_block_size"))
    ]
    assert "read by no process" in found[0].message
