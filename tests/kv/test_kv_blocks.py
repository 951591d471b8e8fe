"""Property tests for pdlaunch.kv.blocks against a slow, obviously-correct reference."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pdlaunch.kv import blocks as kb

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def raw_bytes(t: torch.Tensor) -> bytes:
    """The whole underlying storage, byte for byte."""
    return bytes(t.untyped_storage())


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The bytes of exactly the elements of ``t``."""
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def reference_reblock(
    pages: torch.Tensor, ids, B: int, H: int, agreed: int, src: str, dst: str
) -> torch.Tensor:
    """Token-by-token: where every (token, head) ends up, from the docstring formula.

    ``pages`` is a contiguous ``[nb, P]`` copy; returns the expected ``[nb, P]``.
    """
    out = pages.clone()
    C = pages.shape[1] // (B * H)
    b = agreed
    for blk in set(ids):
        page = pages[blk]
        new = out[blk]
        for p in range(B):
            for h in range(H):
                s_off = (p * H + h) * C if src == "NHD" else (h * B + p) * C
                j, off = divmod(p, b)
                if dst == "HND":
                    d_off = j * H * b * C + (h * b + off) * C
                else:
                    d_off = j * b * H * C + (off * H + h) * C
                new[d_off : d_off + C] = page[s_off : s_off + C]
    return out


@st.composite
def cases(draw):
    ratio = draw(st.integers(1, 8))
    agreed = draw(st.sampled_from([1, 2, 4]))
    B = agreed * ratio
    H = draw(st.integers(1, 3))
    C = draw(st.integers(1, 5))
    nb = draw(st.integers(1, 12))
    ids = draw(st.lists(st.integers(0, nb - 1), max_size=2 * nb))
    src = draw(st.sampled_from(["NHD", "HND"]))
    dst = draw(st.sampled_from(["NHD", "HND"]))
    dtype = draw(st.sampled_from(DTYPES))
    logical_view = draw(st.booleans())  # vLLM's permuted [nb, H, B, C] view
    pad_front = draw(st.integers(0, 7))  # cache is a view at an offset in a bigger storage
    scratch_pages = draw(st.sampled_from([1, 2, 3, 1000]))
    return ratio, agreed, B, H, C, nb, ids, src, dst, dtype, logical_view, pad_front, scratch_pages


def make_cache(nb, B, H, C, layout, dtype, logical_view, pad_front, seed=0):
    g = torch.Generator().manual_seed(seed)
    page = B * H * C
    storage = torch.randn(pad_front + nb * page + 3, generator=g).to(dtype)
    flat = storage[pad_front : pad_front + nb * page]
    phys = flat.view(nb, B, H, C) if layout == "NHD" else flat.view(nb, H, B, C)
    if logical_view:
        return storage, (phys.permute(0, 2, 1, 3) if layout == "NHD" else phys)
    return storage, phys


@settings(max_examples=80, deadline=None)
@given(cases())
def test_reblock_matches_reference(case):
    ratio, agreed, B, H, C, nb, ids, src, dst, dtype, logical, pad, scratch_pages = case
    storage, cache = make_cache(nb, B, H, C, src, dtype, logical, pad)
    before = kb.page_view(cache).clone()
    before_raw = raw_bytes(storage)
    expected = reference_reblock(before, ids, B, H, agreed, src, dst)
    page_bytes = before.shape[1] * before.element_size()
    moved = kb.reblock_(
        cache,
        ids,
        block_size=B,
        num_heads=H,
        agreed=agreed,
        src_layout=src,
        dst_layout=dst,
        scratch_bytes=scratch_pages * page_bytes,
    )
    after = kb.page_view(cache)
    assert torch.equal(after, expected)
    # Blocks not in the request: byte-identical (the reference guarantees it too,
    # but check against the original bytes, not the reference).
    for blk in set(range(nb)) - set(ids):
        assert tensor_bytes(after[blk]) == tensor_bytes(before[blk])
    # Bytes outside the cache view are untouched; the raw storage really changed
    # whenever the conversion is not the identity.
    after_raw = raw_bytes(storage)
    es = storage.element_size()
    assert after_raw[: pad * es] == before_raw[: pad * es]
    assert after_raw[(pad + nb * B * H * C) * es :] == before_raw[(pad + nb * B * H * C) * es :]
    identity = torch.equal(expected, before)
    assert (after_raw != before_raw) == (not identity)
    if kb.is_alias(src, dst, ratio):
        assert moved == 0
    else:
        assert moved == len(set(ids))


@settings(max_examples=40, deadline=None)
@given(cases())
def test_unreblock_inverts_reblock(case):
    _ratio, agreed, B, H, C, nb, ids, src, dst, dtype, logical, pad, scratch_pages = case
    storage, cache = make_cache(nb, B, H, C, src, dtype, logical, pad, seed=1)
    orig = raw_bytes(storage)
    kw = dict(block_size=B, num_heads=H, agreed=agreed, scratch_bytes=scratch_pages * 64)
    kb.reblock_(cache, ids, src_layout=src, dst_layout=dst, **kw)
    kb.unreblock_(cache, ids, src_layout=dst, dst_layout=src, **kw)
    assert raw_bytes(storage) == orig


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8, 16]),
    st.integers(1, 8),
    st.integers(0, 1000),
    st.randoms(use_true_random=False),
)
def test_sub_block_ids(agreed, ratio, num_tokens, rnd):
    B = agreed * ratio
    n_blocks = math.ceil(num_tokens / B)
    block_ids = rnd.sample(range(10_000), n_blocks + rnd.randint(0, 2))
    ids = kb.sub_block_ids(block_ids, num_tokens, B, agreed)
    assert len(ids) == math.ceil(num_tokens / agreed)
    for t in range(0, num_tokens, max(1, num_tokens // 50)):
        sub, off = kb.token_location(t, block_ids, B, agreed)
        assert ids[t // agreed] == sub
        assert off == t % agreed
        # The sub-block lies inside its parent block's page.
        assert sub // ratio == block_ids[t // B]


def test_sub_block_ids_prompt_boundaries():
    # 17 tokens at agreed 16 need 2 sub-blocks (the PR 30448 formula gave 1).
    assert kb.sub_block_ids([3], 17, 128, 16) == [24, 25]
    assert kb.sub_block_ids([3], 16, 128, 16) == [24]
    assert kb.sub_block_ids([3, 9], 129, 128, 16) == [24, 25, 26, 27, 28, 29, 30, 31, 72]
    assert kb.sub_block_ids([3], 0, 128, 16) == []
    with pytest.raises(ValueError):
        kb.sub_block_ids([3], 129, 128, 16)
    with pytest.raises(ValueError):
        kb.reblock_ratio(128, 48)


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_level_hnd_subpages(dtype):
    """Gaudi-like case: block 128 NHD → 8 HND sub-pages of 16; read back token by token."""
    nb, B, H, C, agreed = 6, 128, 4, 32, 16
    cache = torch.randn(nb, B, H, C).to(dtype)
    truth = cache.clone()
    ids = [4, 1]
    kb.reblock_(cache, ids, block_size=B, num_heads=H, agreed=agreed)
    subs = cache.view(nb * (B // agreed), H, agreed, C)  # the decode's view of sub-blocks
    for blk in ids:
        for t in range(B):
            sub, off = kb.token_location(t, [blk], B, agreed)
            assert torch.equal(subs[sub][:, off], truth[blk, t])
    for blk in set(range(nb)) - set(ids):
        assert torch.equal(cache[blk], truth[blk])


def test_alias_nhd_to_nhd_moves_nothing():
    cache = torch.randn(4, 64, 2, 8)
    before = raw_bytes(cache)
    assert kb.is_alias("NHD", "NHD", 4)
    assert (
        kb.reblock_(
            cache,
            [0, 1, 2],
            block_size=64,
            num_heads=2,
            agreed=16,
            src_layout="NHD",
            dst_layout="NHD",
        )
        == 0
    )
    assert raw_bytes(cache) == before


def test_page_view_rejects_non_dense_pages():
    big = torch.zeros(4, 16, 2, 8)
    with pytest.raises(ValueError):
        kb.page_view(big[:, :, :1, :])  # a head slice: pages have holes
    with pytest.raises(ValueError):
        kb.page_view(torch.zeros(16))
    # Padded block stride is fine (pages dense, stride larger than the page).
    padded = torch.zeros(4, 300)[:, :256].view(4, 16, 2, 8)
    assert kb.page_view(padded).shape == (4, 256)


def test_reblock_rejects_bad_ids_and_geometry():
    cache = torch.zeros(4, 16, 2, 8)
    with pytest.raises(IndexError):
        kb.reblock_(cache, [4], block_size=16, num_heads=2, agreed=4)
    with pytest.raises(ValueError):
        kb.reblock_(cache, [0], block_size=16, num_heads=3, agreed=4)
    with pytest.raises(ValueError):
        kb.reblock_(cache, [0], block_size=16, num_heads=2, agreed=4, src_layout="XYZ")


def test_upstream_style_matches():
    cache = torch.randn(8, 32, 2, 4)
    other = cache.clone()
    kb.reblock_(cache, [1, 5, 6], block_size=32, num_heads=2, agreed=8)
    kb.reblock_upstream_style_(other, [1, 5, 6], block_size=32, num_heads=2, agreed=8)
    assert torch.equal(cache, other)


def test_package_root_does_not_import_torch():
    code = (
        "import sys, pdlaunch.kv as k; "
        "bad = [m for m in ('torch', 'vllm', 'nixl', 'nixl_cu12') if m in sys.modules]; "
        "assert not bad, bad; "
        "c = k.prefill_kv_transfer_config(agreed_block_size=16, decode_block_sizes=[16, 32]); "
        "assert c['kv_connector_module_path'] == 'pdlaunch.kv.connector', c"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("src", ["NHD", "HND"])
@pytest.mark.parametrize("scratch_pages", [1, 3, 1000])
def test_fragmented_ids_and_layer_lists(src, scratch_pages):
    """Many isolated ids take the gather/scatter path; a list of layers shares one plan."""
    nb, B, H, C, agreed = 48, 32, 2, 4, 8
    ids = [*range(3, nb, 2), 0]  # 23 isolated blocks + block 0
    layers = [make_cache(nb, B, H, C, src, torch.float16, True, 0, seed=s)[1] for s in (3, 4)]
    before = [kb.page_view(c).clone() for c in layers]
    page_bytes = before[0].shape[1] * 2
    moved = kb.reblock_(
        layers,
        ids,
        block_size=B,
        num_heads=H,
        agreed=agreed,
        src_layout=src,
        scratch_bytes=scratch_pages * page_bytes,
    )
    assert moved == len(ids)
    for cache, old in zip(layers, before, strict=True):
        expected = reference_reblock(old, ids, B, H, agreed, src, "HND")
        assert torch.equal(kb.page_view(cache), expected)
