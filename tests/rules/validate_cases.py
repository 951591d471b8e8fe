"""Shared helpers for the validate-holes tests: a valid two-node CUDA topology with slots,
and assertions that a finding names its rule, field, marked line and fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.load import load_text

ROOT = Path(__file__).resolve().parents[2]
PDLAUNCH = Path(sys.executable).parent / "pdlaunch"
MARK = "#<"

# A valid two-node CUDA topology; `{...}` slots take extra lines (already indented).
BASE = """\
deployment: t
model:
  name: m
{model}defaults:
  work_dir: /tmp/pd
{defaults}{hosts}prefill:
  - host: {p_host}
    device: {p_dev}
    port: 8100
{prefill}decode:
  - host: {d_host}
    device: {d_dev}
    port: 8200
{decode}kv_connector:
  kind: {kind}
{kv}router:
  host: {r_host}
{router}"""


def doc(**slots: str) -> str:
    values = {
        "model": "",
        "defaults": "",
        "hosts": "",
        "prefill": "",
        "decode": "",
        "kv": "",
        "router": "",
        "p_host": "10.0.0.1",
        "d_host": "10.0.0.2",
        "p_dev": "cuda",
        "d_dev": "cuda",
        "kind": "nixl",
        "r_host": "10.0.0.3",
    }
    values.update(slots)
    return BASE.format(**values)


def marked_line(text: str) -> int:
    lines = [n for n, line in enumerate(text.splitlines(), 1) if MARK in line]
    assert len(lines) == 1, f"exactly one {MARK} marker expected, got {lines}"
    return lines[0]


def run_rules(text: str):
    topo, source = load_text(text, "t.yaml")
    return topo, validate(topo, source)


def finding(text: str, rule: str, field: tuple, severity: str = "error"):
    """The finding of `rule` at `field`, checked against the marked line."""
    _, found = run_rules(text)
    hits = [f for f in found if f.rule == rule and f.field == field]
    assert hits, f"no {rule} at {field}; got {[(f.rule, f.field, f.message) for f in found]}"
    f = hits[0]
    assert f.severity == severity
    if severity == "error":
        assert has_errors(found)
    assert f.fix.strip(), f
    assert f.file == "t.yaml"
    assert f.line == marked_line(text), (f.line, f.where, text)
    return f


def no_errors(text: str) -> list:
    _, found = run_rules(text)
    assert not has_errors(found), [(f.rule, f.field, f.message) for f in found]
    return found


def args_block(words: list[str], mark: int, indent: int = 4) -> str:
    """An `extra_args:` block list, one JSON-quoted word per line, the `mark`-th one marked."""
    pad = " " * indent
    lines = [f"{pad}extra_args:\n"]
    for j, w in enumerate(words):
        lines.append(f"{pad}  - {json.dumps(w)}{'  ' + MARK if j == mark else ''}\n")
    return "".join(lines)


def env_block(env: dict[str, str], mark: str | None, indent: int = 4) -> str:
    pad = " " * indent
    lines = [f"{pad}env:\n"]
    for k, v in env.items():
        lines.append(f"{pad}  {k}: {json.dumps(v)}{'  ' + MARK if k == mark else ''}\n")
    return "".join(lines)


# Managed vLLM flags in spellings argparse/vLLM read as the managed flag.
MANAGED_SPELLINGS = [
    (["--block_size=32"], "block_size"),
    (["--block-size", "32"], "block_size"),
    (["--blo=32"], "block_size"),
    (["--tensor_parallel_size", "2"], "tensor_parallel_size"),
    (["-tp", "2"], "tensor_parallel_size"),
    (["-tp=2"], "tensor_parallel_size"),
    (["--no-enable-prefix-caching"], "enable_prefix_caching"),
    (["--kv_transfer_config={}"], "kv_transfer_config"),
    (["--kv-transfer-config.kv_role", "kv_both"], "kv_transfer_config"),
    # vLLM appends the merged dotted JSON as `--kv-transfer '{...}'`: a prefix, after ours.
    (["--kv_transfer.kv_role=kv_both"], "kv_transfer_config"),
    (["--no-enforce-eager"], "enforce_eager"),
    (["-dph"], "data_parallel_hybrid_lb"),
    (["--device-memory-utilization", "0.5"], "gpu_memory_utilization"),
    (["--port=9000"], "port"),
    (["--model", "x"], "model"),
    (["--served_model_name", "x"], "served_model_name"),
]


# Managed router flags; vllm-router is plain argparse (no '_' for '-').
ROUTER_MANAGED = [
    (["--port", "9000"], "port"),
    (["--port=9000"], "port"),
    (["--prometheus-port", "1"], "prometheus_port"),
    (["--prefill", "http://x:1"], "prefill"),
    (["--decode=http://x:1"], "decode"),
    (["--policy", "random"], "policy"),
    (["--max-concurrent-requests", "5"], "max_concurrent_requests"),
]


# A named node's KV address (side-channel-host): the names above stay for SSH and HTTP.
NODE1_ADDRESS = "hosts:\n  %s:\n    address: 10.0.0.9\n"
