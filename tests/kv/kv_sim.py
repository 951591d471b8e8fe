"""Test helpers: prefill caches with known content, and a stock vLLM 0.32 decode
worker's receive path (descriptor arithmetic, block-id mapping, post-process),
driven without a model, distributed init or GPU.

The decode side is a ``NixlPullConnectorWorker`` built with ``__new__`` and
only the attributes its receive-side methods read; every computation that
matters (handshake validation, descriptors, id mapping, desc ids, receive
post-process) is vLLM's own code.
"""

from __future__ import annotations

import ctypes
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.utils import (
    EngineTransferInfo,
    TransferTopology,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlAgentMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
    NixlPullConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.tp_mapping import compute_tp_mapping
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)

from pdlaunch.kv import blocks as kvblocks


def alloc_cache(num_blocks: int, block_size: int, heads: int, c: int, layout: str, dtype):
    """vLLM-style logical ``[nb, H, N, C]`` view over a physical NHD/HND allocation."""
    if layout == "NHD":
        phys = torch.zeros(num_blocks, block_size, heads, c, dtype=dtype)
        return phys.permute(0, 2, 1, 3)
    return torch.zeros(num_blocks, heads, block_size, c, dtype=dtype)


@dataclass
class Prefill:
    caches: list[torch.Tensor]  # logical views, one per layer
    layout: str
    block_size: int
    heads: int
    truth: list[torch.Tensor]  # per layer [T, H, C]
    block_ids: list[int]
    num_tokens: int

    def agent_metadata(self, engine_id: str = "prefill-engine") -> NixlAgentMetadata:
        """What stock vLLM 0.32 registers for these caches (before the rewrite)."""
        nb = self.caches[0].shape[0]
        page = [kvblocks.page_view(c).shape[1] * c.element_size() for c in self.caches]
        n = len(self.caches)
        return NixlAgentMetadata(
            engine_id=engine_id,
            agent_metadata=b"",
            kv_caches_base_addr=[c.data_ptr() for c in self.caches],
            device_id=0,
            num_blocks=nb,
            block_lens=page,
            block_strides=[c.stride(0) * c.element_size() for c in self.caches],
            kv_cache_layout=kvblocks.VLLM_LAYOUT_NAMES[self.layout],
            block_size=self.block_size,
            ssm_sizes=(0, 0),
            attn_backend_name="FLASH_ATTN",
            physical_blocks_per_logical_kv_block=1,
            region_num_blocks=[nb] * n,
            region_group_ids=[0] * n,
            region_names=[f"model.layers.{i}.self_attn.attn" for i in range(n)],
            region_mem_types=["DRAM"] * n,
        )


def make_prefill(
    *,
    num_layers: int,
    num_blocks: int,
    block_size: int,
    heads: int,
    c: int,
    layout: str,
    dtype,
    block_ids: list[int],
    num_tokens: int,
    seed: int = 0,
) -> Prefill:
    g = torch.Generator().manual_seed(seed)
    caches, truth = [], []
    for _ in range(num_layers):
        cache = alloc_cache(num_blocks, block_size, heads, c, layout, dtype)
        # Background noise everywhere, then the request's tokens.
        cache.copy_(torch.randn(cache.shape, generator=g).to(dtype))
        tr = torch.randn(num_tokens, heads, c, generator=g).to(dtype)
        for t in range(num_tokens):
            cache[block_ids[t // block_size], :, t % block_size, :] = tr[t]
        caches.append(cache)
        truth.append(tr)
    return Prefill(caches, layout, block_size, heads, truth, block_ids, num_tokens)


class DecodeSim:
    """A stock vLLM 0.32 pull worker's receive path on CPU tensors."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        heads: int,
        c: int,
        layout: str,
        dtype,
        enable_permute_local_kv: bool = False,
    ):
        names = [f"model.layers.{i}.self_attn.attn" for i in range(num_layers)]
        self.caches = {
            n: alloc_cache(num_blocks, block_size, heads, c, layout, dtype) for n in names
        }
        self.layout = layout
        self.block_size = block_size
        spec = FullAttentionSpec(
            block_size=block_size, num_kv_heads=heads, head_size=c // 2, dtype=dtype
        )
        w = NixlPullConnectorWorker.__new__(NixlPullConnectorWorker)
        w.engine_id = "decode-engine"
        w.tp_rank = 0
        w.device_id = 0
        w.block_size = block_size
        w.num_blocks = num_blocks
        w.dcp_size = 1
        w.use_mla = False
        w._has_mamba = False
        w._is_hma_required = False
        w.use_host_buffer = False
        w.kv_cache_layout = kvblocks.VLLM_LAYOUT_NAMES[layout]
        w.host_buffer_kv_cache_layout = w.kv_cache_layout
        w.kv_transfer_config = KVTransferConfig(
            kv_connector="NixlConnector",
            kv_role="kv_consumer",
            enable_permute_local_kv=enable_permute_local_kv,
        )
        w.enable_permute_local_kv = False
        w.enable_heterogeneous_attn_post_process = False
        w.backend_name = "FLASH_ATTN"
        w._physical_blocks_per_logical_kv_block = 1
        w._group_spec_types = (FullAttentionSpec,)
        w._transfer_layer_region_indices = ()
        w._transfer_layer_names = ()
        w._transfer_layer_group_ids = ()
        w._region_is_mla = [False] * num_layers
        w.block_len_per_layer = [
            kvblocks.page_view(t).shape[1] * t.element_size() for t in self.caches.values()
        ]
        w.block_stride_per_layer = [t.stride(0) * t.element_size() for t in self.caches.values()]
        w.region_group_ids = [0] * num_layers
        w._uses_region_group_mapping = False
        w.region_names = names
        w.region_num_blocks = [num_blocks] * num_layers
        w.num_regions = num_layers
        w.kv_caches_base_addr = defaultdict(dict)
        w.kv_caches_base_addr[w.engine_id][0] = [t.data_ptr() for t in self.caches.values()]
        w.dst_num_blocks = {w.engine_id: num_blocks}
        w.dst_region_num_blocks = {w.engine_id: w.region_num_blocks}
        w.dst_region_group_ids = {}
        w.device_kv_caches = self.caches
        w.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(names, spec)],
        )
        w.transfer_topo = TransferTopology(
            tp_rank=0,
            tp_size=1,
            block_size=block_size,
            engine_id=w.engine_id,
            is_mla=False,
            is_mamba=False,
            total_num_kv_heads=heads,
            attn_backends=[],
        )
        self.worker = w

    def pull(
        self,
        meta: NixlAgentMetadata,
        remote_block_ids: list[int],
        local_block_ids: list[int],
        mover: Callable[[list[tuple[int, int, int]]], None] | None = None,
    ) -> None:
        """Handshake with ``meta``, read ``remote_block_ids`` into ``local_block_ids``.

        ``mover`` gets ``[(local_addr, remote_addr, nbytes), ...]`` and moves the
        bytes (default: memmove, i.e. what a NIXL READ does).
        """
        w = self.worker
        topo = w.transfer_topo
        topo.register_remote_engine(
            meta.engine_id,
            EngineTransferInfo(
                remote_tp_size=1,
                remote_block_len=meta.block_lens[0],
                remote_block_size=meta.block_size,
                remote_physical_blocks_per_logical=meta.physical_blocks_per_logical_kv_block,
            ),
        )
        w.dst_num_blocks[meta.engine_id] = meta.num_blocks
        w.dst_region_group_ids[meta.engine_id] = meta.region_group_ids
        w._validate_remote_agent_handshake(meta, 1)
        plan = compute_tp_mapping(topo, 1, w._group_spec_types)
        bsr = topo.block_size_ratio(meta.block_size)
        remote_descs = w._build_fa_remote(plan, meta, bsr)
        local_descs = w._build_fa_local(w.kv_caches_base_addr[w.engine_id][0], bsr)

        local_ids: list[list[int]] = [list(local_block_ids)]
        remote_ids: list[list[int]] = [list(remote_block_ids)]
        if bsr > 1:
            local_ids, remote_ids = w._map_block_ids_for_block_size_ratio(
                local_ids, remote_ids, bsr
            )
        local_ids, remote_ids = w._apply_prefix_caching(local_ids, remote_ids, 1, 1)
        r_idx = w._compute_desc_ids(
            block_ids=remote_ids,
            dst_num_blocks=meta.num_blocks,
            block_size_ratio=None,
            physical_blocks_per_logical=meta.physical_blocks_per_logical_kv_block,
            region_num_blocks=meta.region_num_blocks,
            region_group_ids=meta.region_group_ids,
            uses_region_group_mapping=False,
        )
        l_idx = w._compute_desc_ids(
            block_ids=local_ids,
            dst_num_blocks=w.num_blocks,
            block_size_ratio=bsr,
            physical_blocks_per_logical=1,
            region_num_blocks=w.region_num_blocks,
            region_group_ids=w.region_group_ids,
            uses_region_group_mapping=False,
        )
        assert len(r_idx) == len(l_idx)
        moves = []
        for ri, li in zip(r_idx, l_idx, strict=True):
            r_addr, r_len, _ = (int(x) for x in remote_descs[ri])
            l_addr, l_len, _ = (int(x) for x in local_descs[li])
            assert r_len == l_len, (r_len, l_len)
            moves.append((l_addr, r_addr, r_len))
        (mover or memmove_all)(moves)

        # Receive-side post-process exactly as get_transfer_results schedules it.
        if bsr > 1 or w.enable_permute_local_kv:
            covered = min(len(local_block_ids) * bsr, len(remote_block_ids))
            w.post_process_device_kv_on_receive(
                bsr, [(0, list(local_block_ids), covered)], convert=True
            )

    def read_tokens(self, layer: int, local_block_ids: list[int], num_tokens: int) -> torch.Tensor:
        cache = list(self.caches.values())[layer]
        out = [
            cache[local_block_ids[t // self.block_size], :, t % self.block_size, :]
            for t in range(num_tokens)
        ]
        return torch.stack(out)


def memmove_all(moves: list[tuple[int, int, int]]) -> None:
    for dst, src, n in moves:
        ctypes.memmove(dst, src, n)


def descs_array(addr_len: list[tuple[int, int]]) -> np.ndarray:
    return np.array([[a, n, 0] for a, n in addr_len], dtype=np.uint64).reshape(-1, 3)
