"""The spine's fast paths (issue 24 item 6: benchmarks/bench_spine.py at 1,000 instances) give
exactly what the straightforward code gave: the same findings in the same order, the same plan
and the same rendered bytes. The reference below is the code before the change (all-pairs
kv path walk, uncached instance list / release check / node env / extra_args scans / address
parsing), patched in for one run and compared with the fast run on a 1,000-instance topology
with many KV geometries, two vLLM releases, `hosts:` settings and findings of several rules.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from pdlaunch.plan import build as plan
from pdlaunch.plan import env as nodeenv
from pdlaunch.plan import kv_geometry as kv
from pdlaunch.plan import kv_path as kvpath
from pdlaunch.plan.render import render_plan
from pdlaunch.rules import args as args_rules
from pdlaunch.rules import validate
from pdlaunch.rules import versions as versions_rules
from pdlaunch.spec import addresses, facts, load, topology
from pdlaunch.spec.load import load_text
from pdlaunch.spec.topology import Topology, instance_name

GEOMETRIES = [("cuda", 16, "HND"), ("cuda", 64, "NHD"), ("hpu", 128, "NHD"), ("cuda", 32, "HND")]
# One device kind: the plan's own answer for mixed releases is not masked by mixed devices.
CUDA_ONLY = [g for g in GEOMETRIES if g[0] == "cuda"]


def varied(n: int, geometries: list[tuple[str, int, str]] = GEOMETRIES) -> dict:
    """4 instances per host; geometries interleaved so that paths first appear at different
    prefill/decode indices; a few instances on another release, with a managed variable or
    a misspelt flag."""

    def inst(i: int) -> dict:
        host, slot = divmod(i, 4)
        dev, block, layout = geometries[(i * 7 // 3) % len(geometries)]
        x: dict = {
            "host": f"10.{host // 250}.{host % 250}.1",
            "device": dev,
            "port": 8000 + slot,
            "tp": 2,
            "devices": [2 * slot, 2 * slot + 1],
            "block_size": block,
            "kv_layout": layout,
            "extra_args": ["--max-num-seqs=8", "--max-num-batched-tokens", "16384"],
            "env": {"NCCL_SOCKET_IFNAME": "eth0"},
        }
        if i % 97 == 5:
            x["vllm_version"] = "0.32"
        if i % 131 == 7:
            x["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] = "5600"
        if i % 113 == 3:
            x["extra_args"] = ["--max-num-seq", "8", "--bogus-flag"]
        return x

    half = n // 2
    return {
        "deployment": "varied",
        "model": {"name": "Qwen/Qwen3-0.6B", "vllm_version": "0.33"},
        "defaults": {"extra_args": ["--async-scheduling"], "env": {"NCCL_TIMEOUT": "1800"}},
        "hosts": {
            "10.0.0.1": {"env": {"UCX_TLS": "rc"}},
            "010.0.1.1": {"address": "192.168.0.9"},
        },
        "prefill": [inst(i) for i in range(half)],
        "decode": [inst(i) for i in range(half, n)],
        "router": {"host": "10.255.255.1"},
    }


# --- the straightforward code, as it was before the fast paths ------------------------------


def _instances(self: Topology) -> list:
    return [("prefill", i, x) for i, x in enumerate(self.prefill)] + [
        ("decode", i, x) for i, x in enumerate(self.decode)
    ]


def _derived(self: Topology, key, compute):
    if key not in self._derived:
        self._derived[key] = compute(self)
    return self._derived[key]


def _pair_paths(topo: Topology) -> list[kvpath.PairPath]:
    out: dict[object, kvpath.PairPath] = {}
    for pi, p in enumerate(topo.prefill):
        path = kv.prefill_kv(topo, p)
        for di, d in enumerate(topo.decode):
            key = (path, kv.block_size(d), kv.kv_layout(d))
            if key not in out:
                out[key] = kvpath.choose_pair(
                    instance_name("prefill", pi, p),
                    instance_name("decode", di, d),
                    path,
                    kv.block_size(d),
                    kv.kv_layout(d),
                )
    return list(out.values())


def _mixed_releases(topo: Topology) -> bool:
    return len({topo.vllm_version_of(inst) for _, _, inst in topo.instances()}) > 1


def _reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Topology, "instances", _instances)
    monkeypatch.setattr(Topology, "derived", _derived)
    monkeypatch.setattr(kv, "pair_paths", _pair_paths)
    monkeypatch.setattr(plan, "mixed_releases", _mixed_releases)
    for module in (nodeenv, plan, versions_rules):
        monkeypatch.setattr(module, "derived_env", nodeenv._derived_env)
    monkeypatch.setattr(args_rules, "_scan", lambda _topo, words, fx: facts.scan(words, fx))
    for name in ("canonical_host", "_address", "is_unspecified", "_bind_ips"):
        monkeypatch.setattr(addresses, name, getattr(addresses, name).__wrapped__)
    for module in (topology, load):
        monkeypatch.setattr(module, "canonical_host", addresses.canonical_host)


def _spine(text: str) -> tuple[list, dict, list]:
    topo, source = load_text(text, "varied.yaml")
    findings = [dataclasses.astuple(f) for f in validate(topo, source)]
    built = plan.build_plan(topo)
    files = [(f.name, f.content, f.executable) for f in render_plan(built)]
    return findings, built.model_dump(mode="json"), files


@pytest.fixture(scope="module", params=["mixed-devices", "cuda-only"])
def text(request: pytest.FixtureRequest) -> str:
    geometries = GEOMETRIES if request.param == "mixed-devices" else CUDA_ONLY
    return yaml.safe_dump(varied(1000, geometries), sort_keys=False)


@pytest.fixture(scope="module")
def fast(text: str) -> tuple[list, dict, list]:
    return _spine(text)


def test_the_topology_exercises_what_the_fast_paths_replace(fast):
    findings, built, files = fast
    rules = {f[0] for f in findings}
    assert {"managed-env", "unknown-flag", "pd-handshake"} <= rules
    # Several kv paths, first met at different pairs: the walk's order and names matter.
    assert len(built["kv_paths"]) > 4
    assert len({p["prefill"] for p in built["kv_paths"]}) > 1
    assert len({p["decode"] for p in built["kv_paths"]}) > 1
    assert len(files) == 1003
    # Two releases: the compatibility hash check is switched off for every NIXL node.
    configs = [
        argv[argv.index("--kv-transfer-config") + 1]
        for argv in (p["argv"] for p in built["processes"])
        if "--kv-transfer-config" in argv
    ]
    assert len(configs) == 1000
    assert all('"enforce_handshake_compat": false' in c for c in configs)


def test_fast_spine_equals_the_straightforward_one(text, fast, monkeypatch):
    _reference(monkeypatch)
    findings, built, files = _spine(text)
    assert fast[0] == findings
    assert fast[1] == built
    assert fast[2] == files


@pytest.mark.parametrize("n", [2, 7, 40])
def test_pair_paths_equal_the_all_pairs_walk(n):
    for shift in range(len(GEOMETRIES)):
        data = varied(n)
        data["decode"] = data["decode"][shift:] + data["decode"][:shift]
        topo, _ = load_text(yaml.safe_dump(data, sort_keys=False))
        assert kv.pair_paths(topo) == _pair_paths(topo)


def test_cached_answers_cannot_be_changed_by_a_caller():
    topo, _ = load_text(yaml.safe_dump(varied(8), sort_keys=False))
    node = plan.all_nodes(topo)[0]
    env = nodeenv.derived_env(topo, node)
    env.clear()
    assert nodeenv.derived_env(topo, node) == nodeenv._derived_env(topo, node) != {}
    fx = facts.vllm("0.33")
    scanned, _ = args_rules._scan(topo, ["--max-num-seqs", "8"], fx)
    scanned.clear()
    assert (
        args_rules._scan(topo, ["--max-num-seqs", "8"], fx)[0]
        == facts.scan(["--max-num-seqs", "8"], fx)[0]
    )
    assert isinstance(topo.instances(), tuple)
