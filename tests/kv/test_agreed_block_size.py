"""The agreed block size (the GCD of every block size) and the re-blocking prefill's
--kv-transfer-config, as the plan derives them on the control host. That the connector inside
vLLM reads the same values from what the plan renders: tests/kv/test_kv_connector.py
(test_derived_agreed_is_the_plans, test_the_plans_reblocking_config_is_what_the_connector_reads)."""

from __future__ import annotations

import json

import pytest
import yaml

from pdlaunch import kv as kv_extension
from pdlaunch.plan import kv_geometry as kvgeometry
from pdlaunch.plan.build import build_plan
from pdlaunch.rules import validate
from pdlaunch.spec.load import load_text

# --- agreed block size ----------------------------------------------------------------------


def test_agreed_block_size_is_the_gcd_of_positive_sizes():
    assert kv_extension.agreed_block_size([128, 16, 32]) == 16
    assert kv_extension.agreed_block_size(iter([96, 64])) == 32
    assert kv_extension.agreed_block_size([48]) == 48
    for bad in ([], [16, 0], [-16]):
        with pytest.raises(ValueError):
            kv_extension.agreed_block_size(bad)


@pytest.mark.parametrize(
    ("prefill", "decodes", "agreed"), [(128, [16], 16), (128, [64, 96], 32), (48, [32], 16)]
)
def test_plan_agreed_is_the_helper_over_every_block(prefill, decodes, agreed):
    data = {
        "deployment": "t",
        "model": {"name": "m"},
        "prefill": [{"host": "a", "device": "hpu", "block_size": prefill}],
        "decode": [
            {"host": f"d{i}", "device": "cuda", "block_size": b} for i, b in enumerate(decodes)
        ],
        "router": {"host": "r"},
    }
    topo, _ = load_text(yaml.safe_dump(data), "t.yaml")
    assert kvgeometry.agreed_block_size(topo) == agreed
    assert kv_extension.agreed_block_size([prefill, *decodes]) == agreed


# --- the re-blocking prefill's --kv-transfer-config -----------------------------------------

REBLOCK = {
    "deployment": "t",
    "model": {"name": "m"},
    # A CUDA prefill: the extension re-blocks 4-D CUDA caches (Gaudi converts natively).
    "prefill": [{"host": "10.0.0.1", "device": "cuda", "block_size": 128, "kv_layout": "NHD"}],
    "decode": [
        {"host": "10.0.0.2", "device": "cuda", "block_size": 16},
        {"host": "10.0.0.3", "device": "cuda", "block_size": 32},
    ],
    "kv_connector": {"kind": "nixl", "load_failure_policy": "recompute", "kv_lease_duration": 90},
    "router": {"host": "r"},
}


def test_plan_config_for_a_reblocking_prefill_is_the_builders():
    topo, source = load_text(yaml.safe_dump(REBLOCK), "t.yaml")
    assert [f for f in validate(topo, source) if f.severity == "error"] == []
    prefill = build_plan(topo).by_role("prefill")[0]
    expected = kv_extension.prefill_kv_transfer_config(
        agreed_block_size=16,
        decode_block_sizes=[16, 32],
        decode_kv_layout="HND",
        kv_role="kv_producer",
        kv_buffer_device="cuda",
        load_failure_policy="recompute",
        enable_permute_local_kv=True,
        extra={"kv_lease_duration": 90},
    )
    # Exactly, key order included: the rendered script prints this JSON.
    assert list(prefill.kv_transfer_config.items()) == list(expected.items())
    argv_json = prefill.argv[prefill.argv.index("--kv-transfer-config") + 1]
    assert argv_json == json.dumps(expected)
    assert expected["kv_connector"] == kv_extension.CONNECTOR_CLASS
