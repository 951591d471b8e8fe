"""Re-blocked prefill pages through stock vLLM 0.32's receive side.

The decode worker's own code computes everything: handshake validation of the
rewritten metadata, remote/local descriptors, block-id mapping for a larger
decode block, desc ids, and the receive post-process (merge of sub-blocks,
HND → NHD permute).  Only the byte mover is ours (memmove == NIXL READ).
"""

from __future__ import annotations

import dataclasses
import math

import msgspec
import pytest
import torch
from kv_sim import DecodeSim, make_prefill
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    NixlAgentMetadata,
    NixlHandshakePayload,
)

from pdlaunch.kv import blocks as kb
from pdlaunch.kv.connector import (
    rewrite_agent_metadata,
    rewrite_handshake_payload,
    target_layout,
)

CASES = [
    # prefill layout, prefill block, agreed, decode block, decode layout, tokens, dtype
    ("NHD", 128, 16, 16, "HND", 300, torch.float16),  # Gaudi → CUDA, decode == agreed
    ("NHD", 128, 16, 32, "HND", 257, torch.bfloat16),  # decode 2× agreed
    ("NHD", 128, 16, 64, "HND", 128, torch.float32),  # decode 4× agreed, exact block
    ("NHD", 128, 16, 16, "NHD", 300, torch.float16),  # alias mode: no movement at all
    ("NHD", 128, 16, 48, "NHD", 200, torch.float16),  # alias mode, decode 3× agreed
    ("NHD", 64, 16, 32, "NHD-permute", 100, torch.float16),  # HND adv., decode NHD permute
    ("HND", 128, 32, 32, "HND", 17, torch.float16),  # HND prefill re-blocked to HND subs
    ("NHD", 16, 16, 16, "HND", 40, torch.float16),  # ratio 1: pure NHD → HND
]


def _advertise(prefill, agreed, dec_layout):
    r = prefill.block_size // agreed
    layout = target_layout(prefill.layout, dec_layout)
    for cache in prefill.caches:
        kb.reblock_(
            cache,
            prefill.block_ids,
            block_size=prefill.block_size,
            num_heads=prefill.heads,
            agreed=agreed,
            src_layout=prefill.layout,
            dst_layout=layout,
        )
    # Through the wire format, as the handshake does.
    payload = NixlHandshakePayload(
        compatibility_hash="h",
        agent_metadata_bytes=msgspec.msgpack.Encoder().encode(prefill.agent_metadata()),
    )
    payload = rewrite_handshake_payload(payload, ratio=r, agreed=agreed, layout=layout)
    return msgspec.msgpack.decode(payload.agent_metadata_bytes, type=NixlAgentMetadata)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}{c[1]}-{c[4]}{c[3]}" for c in CASES])
def test_stock_decode_reads_truth(case):
    p_layout, B, agreed, bd, d_layout, T, dtype = case
    permute = d_layout == "NHD-permute"
    d_layout = "NHD" if permute else d_layout
    heads, c = 2, 8
    pids = [7, 2, 9, 4][: math.ceil(T / B)]
    prefill = make_prefill(
        num_layers=2,
        num_blocks=12,
        block_size=B,
        heads=heads,
        c=c,
        layout=p_layout,
        dtype=dtype,
        block_ids=pids,
        num_tokens=T,
    )
    adv_layout = "HND" if permute else d_layout
    meta = _advertise(prefill, agreed, adv_layout)
    sub_ids = kb.sub_block_ids(pids, T, B, agreed)
    decode = DecodeSim(
        num_layers=2,
        num_blocks=128,
        block_size=bd,
        heads=heads,
        c=c,
        layout=d_layout,
        dtype=dtype,
        enable_permute_local_kv=permute or meta.kv_cache_layout != (kb.VLLM_LAYOUT_NAMES[d_layout]),
    )
    local = [30 + 3 * i for i in range(math.ceil(T / bd))][::-1]
    decode.pull(meta, sub_ids, local)
    for layer in range(2):
        got = decode.read_tokens(layer, local, T)
        assert torch.equal(got, prefill.truth[layer]), f"layer {layer}"


def test_without_reblocking_stock_decode_reads_garbage():
    """The advertised geometry alone is not enough: skipping the re-block fails."""
    B, agreed, T = 128, 16, 200
    prefill = make_prefill(
        num_layers=1,
        num_blocks=6,
        block_size=B,
        heads=2,
        c=8,
        layout="NHD",
        dtype=torch.float16,
        block_ids=[3, 1],
        num_tokens=T,
    )
    meta = rewrite_agent_metadata(
        prefill.agent_metadata(), ratio=B // agreed, agreed=agreed, layout="HND"
    )
    decode = DecodeSim(
        num_layers=1, num_blocks=32, block_size=16, heads=2, c=8, layout="HND", dtype=torch.float16
    )
    local = list(range(math.ceil(T / 16)))
    decode.pull(meta, kb.sub_block_ids([3, 1], T, B, agreed), local)
    assert not torch.equal(decode.read_tokens(0, local, T), prefill.truth[0])


def test_rewrite_agent_metadata_fields():
    prefill = make_prefill(
        num_layers=3,
        num_blocks=5,
        block_size=128,
        heads=2,
        c=8,
        layout="NHD",
        dtype=torch.float16,
        block_ids=[0],
        num_tokens=1,
    )
    meta = prefill.agent_metadata()
    new = rewrite_agent_metadata(meta, ratio=8, agreed=16, layout="HND")
    assert new.block_size == 16
    assert new.kv_cache_layout == "LBHNC"
    assert new.num_blocks == 40
    assert new.block_lens == [n // 8 for n in meta.block_lens]
    assert new.block_strides == [n // 8 for n in meta.block_strides]
    assert new.region_num_blocks == [40, 40, 40]
    assert new.physical_blocks_per_logical_kv_block == 1
    assert new.kv_caches_base_addr == meta.kv_caches_base_addr
    assert new.region_names == meta.region_names
    alias = rewrite_agent_metadata(meta, ratio=8, agreed=16, layout="NHD")
    assert alias.kv_cache_layout == "LBNHC"


def test_rewrite_refuses_padded_pages_and_wrong_ratio():
    prefill = make_prefill(
        num_layers=1,
        num_blocks=2,
        block_size=64,
        heads=2,
        c=8,
        layout="NHD",
        dtype=torch.float16,
        block_ids=[0],
        num_tokens=1,
    )
    meta = prefill.agent_metadata()
    with pytest.raises(ValueError, match="agreed"):
        rewrite_agent_metadata(meta, ratio=8, agreed=16, layout="HND")
    padded = dataclasses.replace(meta, block_strides=[meta.block_lens[0] + 64])
    with pytest.raises(ValueError, match="stride"):
        rewrite_agent_metadata(padded, ratio=4, agreed=16, layout="HND")
