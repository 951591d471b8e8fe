"""The KV lease budget (pdlaunch.plan.lease): the lease a plan sets per release, the gap
between prefill finishing and decode reading, measured on /metrics of a real 1P1D run
(tests/fixtures/bench/hops), and the warnings of `status --watch`, `doctor` and `validate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pdlaunch.doctor.diagnose import diagnose_evidence
from pdlaunch.doctor.evidence import Evidence, ProcessEvidence
from pdlaunch.observe import lease_budget
from pdlaunch.observe.watch import lease_warnings
from pdlaunch.plan import lease as kvlease
from pdlaunch.plan.build import build_plan
from pdlaunch.rules import validate
from pdlaunch.spec.load import load_text

ROOT = Path(__file__).resolve().parents[2]
HOPS = ROOT / "tests" / "fixtures" / "bench" / "hops"
BEFORE = (HOPS / "decode-0_before.txt").read_text()
AFTER = (HOPS / "decode-0_after.txt").read_text()
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}


def local_cpu(**kv_connector) -> tuple:
    data = yaml.safe_load((ROOT / "topologies" / "local-cpu.yaml").read_text())
    data["kv_connector"] = {"kind": "nixl", **kv_connector}
    return load_text(yaml.safe_dump(data), "t.yaml")


# -- the lease ------------------------------------------------------------------------------------
def test_lease_of_per_release():
    with_lease = {**NIXL, "kv_connector_extra_config": {"kv_lease_duration": 90}}
    assert kvlease.lease_of(with_lease, {}, True) == kvlease.Lease(
        90, "kv_connector.kv_lease_duration"
    )
    assert kvlease.lease_of(NIXL, {}, True).seconds == 30  # base_scheduler.py:82-86
    old = kvlease.lease_of(NIXL, {"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "300"}, False)
    assert old == kvlease.Lease(300, "VLLM_NIXL_ABORT_REQUEST_TIMEOUT")
    assumed = kvlease.lease_of(NIXL, {}, False)
    assert assumed is not None and assumed.seconds == 120 and "assumed" in assumed.source
    assert kvlease.lease_of({"kv_connector": "MooncakeConnectorV1"}, {}, True) is None
    assert kvlease.lease_of(None, {}, True) is None


def test_release_facts_decide_lease_or_abort_timeout():
    assert kvlease.release_reads_lease("0.32")
    assert not kvlease.release_reads_lease("0.19")  # VLLM_NIXL_ABORT_REQUEST_TIMEOUT era


def test_plan_lease_is_what_the_plan_renders():
    topo, _ = local_cpu(kv_lease_duration=600)
    lease = kvlease.plan_lease(build_plan(topo))
    assert lease == kvlease.Lease(600, "kv_connector.kv_lease_duration")
    topo, _ = local_cpu()
    lease = kvlease.plan_lease(build_plan(topo))
    assert lease is not None and lease.seconds == 30


# -- the gap, measured ----------------------------------------------------------------------------
def test_decode_gap_from_the_real_run():
    g = lease_budget.decode_gap("decode-0", BEFORE, AFTER)
    assert g.count == 40
    # every queue wait was under vLLM's first bucket (0.3 s): the p99 is a bound
    assert g.p99_bound == "<=" and g.p50_bound == "<="
    # plus decode's own frontend mean: TTFT - queue - first step, ~0.93 s in that run
    assert 0.5 < g.handoff_mean_s < 1.5
    assert g.p99_s == pytest.approx(0.3 + g.handoff_mean_s)
    # over its whole life (no before): the canary request too
    assert lease_budget.decode_gap("decode-0", None, AFTER).count == 42


def test_budget_warning_before_expiry_not_after():
    g = lease_budget.decode_gap("decode-0", BEFORE, AFTER)
    assert lease_budget.budget_warning(g, kvlease.Lease(600, "x")) is None
    assert lease_budget.budget_warning(g, kvlease.Lease(30, "x")) is None
    warning = lease_budget.budget_warning(g, kvlease.Lease(2, "kv_lease_duration"))
    assert warning is not None and "decode-0" in warning and "up to" in warning
    assert "2 s lease" in warning
    assert lease_budget.budget_warning(g, None) is None


def test_watch_warns_on_a_decode_only():
    lease = kvlease.Lease(2, "kv_lease_duration")
    (w,) = lease_warnings("decode-0", "decode", BEFORE, AFTER, lease)
    assert "p99 gap" in w
    assert lease_warnings("prefill-0", "prefill", BEFORE, AFTER, lease) == []
    assert lease_warnings("decode-0", "decode", BEFORE, AFTER, None) == []
    # an idle window: nothing observed, nothing to say
    assert lease_warnings("decode-0", "decode", AFTER, AFTER, lease) == []


def test_doctor_finding_uses_the_plans_lease():
    def evidence() -> Evidence:
        return Evidence(
            "local-cpu",
            [
                ProcessEvidence(
                    "decode-0", "decode", "127.0.0.1", metrics=BEFORE, metrics_after=AFTER
                )
            ],
        )

    short, _ = local_cpu(kv_lease_duration=2)
    found = [f for f in diagnose_evidence(evidence(), build_plan(short))]
    (f,) = [f for f in found if f.id == "kv-lease-budget"]
    assert f.severity == "warning" and f.process == "decode-0" and "2 s lease" in f.what
    long, _ = local_cpu(kv_lease_duration=600)
    found = diagnose_evidence(evidence(), build_plan(long))
    assert not [f for f in found if f.id == "kv-lease-budget"]


# -- validate -------------------------------------------------------------------------------------
LLAMA_70B = {  # the geometry of a 70B GQA model's config.json
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "bfloat16",
}


def test_kv_bytes_per_token():
    assert kvlease.kv_bytes_per_token(LLAMA_70B, 2) == 2 * 80 * 8 * 128 * 2
    tiny = json.loads((HOPS.parent / "tiny_model_config.json").read_text())
    assert kvlease.kv_bytes_per_token(tiny, 4) == 2048  # what the live run moved a token
    assert kvlease.kv_bytes_per_token({**LLAMA_70B, "kv_lora_rank": 512}, 2) is None
    assert kvlease.kv_bytes_per_token({}, 2) is None


def _topo(tmp_path: Path, lease: int | None, max_len: int | None = 131072, device: str = "cuda"):
    model = tmp_path / "m70b"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(LLAMA_70B))
    data = {
        "deployment": "t",
        "model": {"name": str(model), **({"max_model_len": max_len} if max_len else {})},
        "prefill": [{"host": "10.0.0.1", "device": device, "port": 8100}],
        "decode": [{"host": "10.0.0.2", "device": "cuda", "port": 8200}],
        "router": {"host": "10.0.0.3"},
        "kv_connector": {"kind": "nixl", **({"kv_lease_duration": lease} if lease else {})},
    }
    topo, source = load_text(yaml.safe_dump(data), "t.yaml")
    return [f for f in validate(topo, source) if f.rule == "kv-lease-budget"]


def test_validate_warns_when_the_lease_cannot_cover_the_longest_prompt(tmp_path: Path):
    # 131072 tokens x 327680 bytes = 42.9 GB; at the assumed 1 GB/s: 43 s, 2x = 86 s > 30 s
    (f,) = _topo(tmp_path, None)
    assert f.severity == "warning" and f.field == ("kv_connector", "kv_lease_duration")
    assert "assumed 1 GB/s" in f.message and "30 s" in f.message
    assert "at least 86" in f.fix
    assert _topo(tmp_path, 90) == []  # covers it
    assert _topo(tmp_path, 60) != []
    assert _topo(tmp_path, None, 4096) == []  # short prompts fit the default
    assert _topo(tmp_path, None, None) == []  # no max_model_len: nothing to judge


def test_a_cpu_engine_in_the_pair_takes_the_slower_assumed_rate(tmp_path: Path):
    # 42.9 GB at 0.02 GB/s (NIXL over loopback measured 0.029-0.044 GB/s here): 2147 s
    (f,) = _topo(tmp_path, 600, device="cpu")
    assert "assumed 0.02 GB/s" in f.message and "cpu/cuda" in f.message
    assert "at least 4295" in f.fix


def test_validate_is_quiet_without_a_readable_model_config(tmp_path: Path):
    data = yaml.safe_load((ROOT / "topologies" / "local-cpu.yaml").read_text())
    data["model"]["name"] = str(tmp_path / "absent")
    topo, source = load_text(yaml.safe_dump(data), "t.yaml")
    assert not [f for f in validate(topo, source) if f.rule == "kv-lease-budget"]
