"""Facts that once had two copies now have one helper each (issue 10 item 4): the agreed
block size, the `file:line field` of a finding, and the re-blocking prefill's
--kv-transfer-config. Each test fails if a second copy comes back or the callers drift."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from pdlaunch import kv as kv_extension
from pdlaunch import kvgeometry
from pdlaunch.load import LoadError, Problem, dotted, load_text, where
from pdlaunch.plan import build_plan
from pdlaunch.rules import validate
from pdlaunch.rules.base import Finding

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pdlaunch"


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


# --- agreed block size ----------------------------------------------------------------------


def test_agreed_block_size_is_the_gcd_of_positive_sizes():
    assert kv_extension.agreed_block_size([128, 16, 32]) == 16
    assert kv_extension.agreed_block_size(iter([96, 64])) == 32
    assert kv_extension.agreed_block_size([48]) == 48
    for bad in ([], [16, 0], [-16]):
        with pytest.raises(ValueError):
            kv_extension.agreed_block_size(bad)


def test_gcd_is_computed_in_one_place():
    # kvgeometry (control host) and the connector (inside vLLM) both call
    # pdlaunch.kv.agreed_block_size; a gcd anywhere else is a second copy.
    users = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "id", None) or getattr(node, "attr", None)
            if name == "gcd":
                users.append(path.relative_to(ROOT).as_posix())
    assert set(users) == {"pdlaunch/kv/__init__.py"}


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


# --- where ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("file", "line", "field", "expected"),
    [
        ("t.yaml", 3, ("prefill", 0, "port"), "t.yaml:3 prefill[0].port"),
        ("t.yaml", None, ("router",), "t.yaml router"),
        ("t.yaml", 7, (), "t.yaml:7"),
        ("t.yaml", None, (), "t.yaml"),
    ],
)
def test_problems_and_findings_point_the_same_way(file, line, field, expected):
    assert where(file, line, dotted(field)) == expected
    assert Problem(file, line, dotted(field), "m").where() == expected
    finding = Finding("r", "error", field, "m", "f", "s", file=file, line=line)
    assert finding.where == expected


def test_load_problem_and_rule_finding_on_one_field_read_alike():
    text = (
        "deployment: t\nmodel: {name: m}\n"
        "prefill: [{host: a, device: cuda, port: 8100}]\n"
        "decode: [{host: a, device: cuda, port: 8100, devices: [1]}]\n"
        "router: {host: r}\n"
    )
    topo, source = load_text(text, "t.yaml")
    finding = next(f for f in validate(topo, source) if f.rule == "port-conflict")
    with pytest.raises(LoadError) as info:
        load_text(text.replace("port: 8100, devices", "port: 0, devices"), "t.yaml")
    (problem,) = info.value.problems
    assert finding.where == problem.where() == "t.yaml:4 decode[0].port"


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


def test_the_extension_config_is_built_in_one_place():
    # Only the builder names the extension's module path and its extra-config keys; the
    # connector reads the same constants. A literal elsewhere is a second builder.
    literals = {
        kv_extension.CONNECTOR_MODULE_PATH,
        kv_extension.KEY_DECODE_BLOCK_SIZES,
        kv_extension.KEY_DECODE_KV_LAYOUT,
    }
    found = [
        path.relative_to(ROOT).as_posix()
        for path in _sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in literals
    ]
    assert set(found) == {"pdlaunch/kv/__init__.py"}
