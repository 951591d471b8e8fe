"""What the prefill advertises in its NIXL handshake once its pages are re-blocked: the
sub-block geometry (block size, counts, lengths, strides, layout), and which kernel blocks
hold a request's tokens.

Runs inside the vLLM engine (vLLM's NIXL metadata types).
"""

from __future__ import annotations

import dataclasses

import msgspec
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    NixlAgentMetadata,
    NixlHandshakePayload,
)

from pdlaunch.kv import blocks as kvblocks
from pdlaunch.kv.settings import PdlaunchKVConfigError


def rewrite_agent_metadata(
    meta: NixlAgentMetadata, *, ratio: int, agreed: int, layout: str
) -> NixlAgentMetadata:
    """Advertise ``ratio`` sub-blocks of ``agreed`` tokens per registered block.

    ``layout`` is the sub-page layout (``NHD``/``HND``).  Block counts ×ratio,
    block lengths and strides ÷ratio, one logical block per physical one.
    """
    if meta.block_size != agreed * ratio:
        raise PdlaunchKVConfigError(
            f"registered block size {meta.block_size} != agreed {agreed} × ratio {ratio}"
        )
    for i, (length, stride) in enumerate(zip(meta.block_lens, meta.block_strides, strict=True)):
        if length != stride:
            raise PdlaunchKVConfigError(
                f"region {i}: block stride {stride} != block length {length} "
                "(padded or interleaved pages cannot be split into sub-blocks)"
            )
        if length % ratio:
            raise PdlaunchKVConfigError(
                f"region {i}: block length {length} not divisible by {ratio}"
            )
    return dataclasses.replace(
        meta,
        block_size=agreed,
        kv_cache_layout=kvblocks.VLLM_LAYOUT_NAMES[layout],
        num_blocks=meta.num_blocks * ratio,
        block_lens=[n // ratio for n in meta.block_lens],
        block_strides=[n // ratio for n in meta.block_strides],
        region_num_blocks=(
            None if meta.region_num_blocks is None else [n * ratio for n in meta.region_num_blocks]
        ),
        physical_blocks_per_logical_kv_block=1,
    )


def rewrite_handshake_payload(
    payload: NixlHandshakePayload, *, ratio: int, agreed: int, layout: str
) -> NixlHandshakePayload:
    meta = msgspec.msgpack.decode(payload.agent_metadata_bytes, type=NixlAgentMetadata)
    new = rewrite_agent_metadata(meta, ratio=ratio, agreed=agreed, layout=layout)
    return NixlHandshakePayload(
        compatibility_hash=payload.compatibility_hash,
        agent_metadata_bytes=msgspec.msgpack.Encoder().encode(new),
    )


def logical_to_kernel_ids(
    logical_ids: list[int], num_tokens: int, kernel_block_size: int, per_logical: int
) -> list[int]:
    """Kernel (physical) block ids holding tokens ``0 .. num_tokens - 1``."""
    n = -(-num_tokens // kernel_block_size)
    return [logical_ids[i // per_logical] * per_logical + i % per_logical for i in range(n)]
