"""A real NIXL transfer (UCX, loopback/shared memory, CPU tensors).

Agent "prefill" holds a block-128 NHD cache, re-blocks the request's pages and
advertises the sub-block geometry exactly as the connector does.  Agent
"decode" (stock vLLM 0.32 receive arithmetic, block 16, HND) pulls the
request's sub-blocks with a NIXL READ.  The pulled KV must equal the truth
token by token; a deliberately wrong geometry must not.
"""

from __future__ import annotations

import math
import time
import uuid

import pytest
import torch
from kv_sim import DecodeSim, descs_array, make_prefill
from nixl._api import nixl_agent, nixl_agent_config

from pdlaunch.kv import blocks as kb
from pdlaunch.kv.connector import rewrite_agent_metadata

B, AGREED, HEADS, C, T = 128, 16, 4, 16, 333
PREFILL_BLOCKS = [9, 2, 5]


def _regions(caches):
    storages = {c.untyped_storage().data_ptr(): c.untyped_storage().nbytes() for c in caches}
    return [(addr, n, 0, "") for addr, n in storages.items()]


class NixlPair:
    """Two in-process NIXL agents; ``read`` moves bytes remote → local by READ."""

    def __init__(self, prefill_caches, decode_caches):
        cfg = nixl_agent_config(backends=["UCX"])
        suffix = uuid.uuid4().hex[:8]
        self.prefill = nixl_agent(f"prefill-{suffix}", cfg)
        self.decode = nixl_agent(f"decode-{suffix}", cfg)
        # Register whole storages as (addr, len, dev, tag), as vLLM's worker does.
        self.prefill.register_memory(self.prefill.get_reg_descs(_regions(prefill_caches), "DRAM"))
        self.decode.register_memory(self.decode.get_reg_descs(_regions(decode_caches), "DRAM"))
        self.remote_name = self.decode.add_remote_agent(self.prefill.get_agent_metadata())
        self.prefill.add_remote_agent(self.decode.get_agent_metadata())
        self.reads = 0

    def read(self, moves):
        local = self.decode.get_xfer_descs(descs_array([(d, n) for d, _, n in moves]), "DRAM")
        remote = self.decode.get_xfer_descs(descs_array([(s, n) for _, s, n in moves]), "DRAM")
        handle = self.decode.initialize_xfer("READ", local, remote, self.remote_name, b"req-0:1")
        state = self.decode.transfer(handle)
        assert state != "ERR"
        deadline = time.monotonic() + 30
        while (state := self.decode.check_xfer_state(handle)) not in ("DONE", "ERR"):
            assert time.monotonic() < deadline, "NIXL READ timed out"
            time.sleep(0.001)
        assert state == "DONE"
        self.decode.release_xfer_handle(handle)
        self.reads += 1
        # The producer is told which request was read (how P frees its blocks).
        deadline = time.monotonic() + 30
        notifs = {}
        while not notifs:
            notifs = self.prefill.get_new_notifs()
            assert time.monotonic() < deadline, "no NIXL notification"
            time.sleep(0.001)
        assert b"req-0:1" in [m for msgs in notifs.values() for m in msgs]


def run_transfer(*, reblock: bool, stride_ratio: int | None = None, src_layout: str = "NHD"):
    prefill = make_prefill(
        num_layers=2,
        num_blocks=12,
        block_size=B,
        heads=HEADS,
        c=C,
        layout="NHD",
        dtype=torch.bfloat16,
        block_ids=PREFILL_BLOCKS,
        num_tokens=T,
        seed=7,
    )
    r = B // AGREED
    if reblock:
        for cache in prefill.caches:
            kb.reblock_(
                cache,
                PREFILL_BLOCKS,
                block_size=B,
                num_heads=HEADS,
                agreed=AGREED,
                src_layout=src_layout,
            )
    meta = rewrite_agent_metadata(prefill.agent_metadata(), ratio=r, agreed=AGREED, layout="HND")
    if stride_ratio is not None:  # wrong geometry: strides not rescaled consistently
        meta.block_strides = [s * r // stride_ratio for s in meta.block_strides]
    decode = DecodeSim(
        num_layers=2,
        num_blocks=64,
        block_size=AGREED,
        heads=HEADS,
        c=C,
        layout="HND",
        dtype=torch.bfloat16,
        enable_permute_local_kv=True,
    )
    pair = NixlPair(prefill.caches, decode.caches.values())
    sub_ids = kb.sub_block_ids(PREFILL_BLOCKS, T, B, AGREED)
    assert len(sub_ids) == math.ceil(T / AGREED)
    local = [40 - i for i in range(math.ceil(T / AGREED))]
    decode.pull(meta, sub_ids, local, mover=pair.read)
    assert pair.reads == 1
    got = [decode.read_tokens(layer, local, T) for layer in range(2)]
    return prefill, got


def test_nixl_pull_of_reblocked_subblocks_equals_truth():
    prefill, got = run_transfer(reblock=True)
    for layer in range(2):
        for t in range(T):  # token by token, for a readable failure
            assert torch.equal(got[layer][t], prefill.truth[layer][t]), (layer, t)


@pytest.mark.parametrize(
    "wrong",
    [
        dict(reblock=False),  # advertised sub-blocks, pages never converted
        dict(reblock=True, src_layout="HND"),  # pages re-blocked as if they were HND
    ],
    ids=["no-reblock", "wrong-source-layout"],
)
def test_wrong_geometry_fails(wrong):
    prefill, got = run_transfer(**wrong)
    mismatched = sum(
        not torch.equal(got[layer][t], prefill.truth[layer][t])
        for layer in range(2)
        for t in range(T)
    )
    assert mismatched > T // 2


def test_wrong_stride_is_rejected_by_nixl():
    """Strides divided by 4 instead of 8 point past the registered memory."""
    from nixl._bindings import nixlNotFoundError

    with pytest.raises(nixlNotFoundError):
        run_transfer(reblock=True, stride_ratio=4)
