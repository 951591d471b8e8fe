"""Pure tensor math for prefill-side KV re-blocking (torch only, no vLLM import).

A *page* is the memory of one KV cache block of one layer: ``B`` tokens ×
``H`` KV heads × ``C`` content elements (K and V packed into ``C``, as vLLM
0.32 does), laid out either

* ``NHD`` – token-major ``[B, H, C]`` (vLLM layout name ``LBNHC``), or
* ``HND`` – head-major ``[H, B, C]`` (vLLM layout name ``LBHNC``).

Re-blocking turns each page of a request, in place, into ``r = B // agreed``
*sub-pages* of ``agreed`` tokens laid end to end in the same page, each
sub-page in the target layout (``HND`` by default).  Token ``t`` of a
request whose blocks are ``blocks`` then lives in sub-block
``blocks[t // B] * r + (t % B) // agreed`` at offset ``t % agreed``, which is
exactly the geometry a stock vLLM decode instance with block size
``agreed`` (or a multiple of it) reads.

``NHD`` → ``NHD`` needs no data movement at all: an ``NHD`` page of ``B``
tokens already is ``r`` ``NHD`` sub-pages (alias mode).

All functions write through a view of the caller's storage; nothing is ever
written into a copy.  Shapes and dtypes are generic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

LAYOUTS: tuple[str, ...] = ("NHD", "HND")

# vLLM 0.32 spells the two per-layer layouts by their 5-D stride order.
VLLM_LAYOUT_NAMES: dict[str, str] = {"NHD": "LBNHC", "HND": "LBHNC"}
LAYOUT_FROM_VLLM: dict[str, str] = {v: k for k, v in VLLM_LAYOUT_NAMES.items()}

# Scratch budget per chunk: small enough to stay cache resident on a CPU,
# large enough to amortise kernel launches on a GPU.
_DEFAULT_SCRATCH_BYTES = {"cpu": 512 << 10, "cuda": 64 << 20}
# Average bytes per run of consecutive block ids below which ids are gathered
# and scattered by index instead of copied run by run.
_MIN_RUN_BYTES = {"cpu": 64 << 10, "cuda": 8 << 20}


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def reblock_ratio(block_size: int, agreed: int) -> int:
    """Sub-blocks per block, ``r = block_size // agreed`` (must divide)."""
    if block_size <= 0 or agreed <= 0:
        raise ValueError(f"block sizes must be positive (block {block_size}, agreed {agreed})")
    if block_size % agreed:
        raise ValueError(
            f"agreed block size {agreed} does not divide the cache block size {block_size}"
        )
    return block_size // agreed


def is_alias(src_layout: str, dst_layout: str, ratio: int) -> bool:
    """True when the source pages already are the target sub-pages."""
    _check_layout(src_layout)
    _check_layout(dst_layout)
    return src_layout == dst_layout and (src_layout == "NHD" or ratio == 1)


def sub_block_ids(
    block_ids: Sequence[int], num_tokens: int, block_size: int, agreed: int
) -> list[int]:
    """Sub-block ids that hold tokens ``0 .. num_tokens - 1``.

    Exactly ``ceil(num_tokens / agreed)`` ids, anchored at token 0 (sub-block
    ``i`` holds tokens ``i * agreed ..``).
    """
    r = reblock_ratio(block_size, agreed)
    if num_tokens < 0:
        raise ValueError("num_tokens must be >= 0")
    n_sub = -(-num_tokens // agreed)
    needed = -(-num_tokens // block_size)
    if len(block_ids) < needed:
        raise ValueError(
            f"{num_tokens} tokens need {needed} blocks of {block_size}, got {len(block_ids)}"
        )
    return [int(block_ids[i // r]) * r + i % r for i in range(n_sub)]


def token_location(
    t: int, block_ids: Sequence[int], block_size: int, agreed: int
) -> tuple[int, int]:
    """``(sub_block_id, offset)`` of token ``t`` after re-blocking."""
    r = reblock_ratio(block_size, agreed)
    return int(block_ids[t // block_size]) * r + (t % block_size) // agreed, t % agreed


# ---------------------------------------------------------------------------
# Page views
# ---------------------------------------------------------------------------


def page_view(cache: torch.Tensor) -> torch.Tensor:
    """``[num_blocks, page_elems]`` view of ``cache`` on the same storage.

    ``cache`` is any tensor whose dim 0 indexes blocks and whose per-block
    elements form one dense run (e.g. a physical ``[nb, B, H, C]`` tensor,
    or vLLM's logical ``[nb, H, B, C]`` view with permuted strides).
    """
    if cache.dim() < 2:
        raise ValueError("cache must have a block dimension and page dimensions")
    sizes = list(cache.shape[1:])
    strides = list(cache.stride()[1:])
    page = math.prod(sizes)
    expected = 1
    for size, stride in sorted(zip(sizes, strides, strict=True), key=lambda p: p[1]):
        if size != 1 and stride != expected:
            raise ValueError(
                f"cache pages are not dense (shape {tuple(cache.shape)}, "
                f"stride {tuple(cache.stride())})"
            )
        expected *= size
    if cache.shape[0] > 1 and cache.stride(0) < page:
        raise ValueError("cache pages overlap (block stride smaller than the page)")
    return cache.as_strided((cache.shape[0], page), (cache.stride(0), 1), cache.storage_offset())


def _tok_view(x: torch.Tensor, fmt: str, r: int, b: int, h: int) -> torch.Tensor:
    """View ``[n, P]`` pages as ``[n, r, b, h, c]`` (sub-block, token, head, content).

    ``fmt``: ``NHD``/``HND`` (a whole ``B``-token page) or ``HND_SUB`` (``r``
    head-major sub-pages).  ``NHD`` sub-pages equal an ``NHD`` page.
    """
    n = x.shape[0]
    if fmt == "NHD":  # [B, H, C] == [r, b, H, C]
        return x.view(n, r, b, h, -1)
    if fmt == "HND":  # [H, B, C] == [H, r, b, C]
        return x.view(n, h, r, b, -1).permute(0, 2, 3, 1, 4)
    if fmt == "HND_SUB":  # [r, H, b, C]
        return x.view(n, r, h, b, -1).permute(0, 1, 3, 2, 4)
    raise ValueError(fmt)


def _sub_fmt(layout: str) -> str:
    return "HND_SUB" if layout == "HND" else "NHD"


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted unique ids → maximal ``(start, length)`` runs of consecutive ids."""
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def _normalise_ids(block_ids: Iterable[int] | torch.Tensor, num_blocks: int) -> list[int]:
    if isinstance(block_ids, torch.Tensor):
        block_ids = block_ids.tolist()
    ids = sorted({int(i) for i in block_ids})
    if ids and (ids[0] < 0 or ids[-1] >= num_blocks):
        raise IndexError(f"block id out of range [0, {num_blocks}): {ids[0]}..{ids[-1]}")
    return ids


def _convert_flat_(
    flat: torch.Tensor,
    runs: list[tuple[int, int]],
    n_ids: int,
    idx_all: torch.Tensor | None,
    *,
    r: int,
    agreed: int,
    num_heads: int,
    src_fmt: str,
    dst_fmt: str,
    scratch_bytes: int | None,
) -> None:
    """Convert the pages of ``flat`` ([n, P] view) listed by ``runs`` in place."""
    page = flat.shape[1]
    if scratch_bytes is None:
        scratch_bytes = _DEFAULT_SCRATCH_BYTES.get(flat.device.type, 16 << 20)
    cap = max(1, scratch_bytes // (page * flat.element_size()))
    scratch = torch.empty((min(cap, n_ids), page), dtype=flat.dtype, device=flat.device)

    def convert(dst_pages: torch.Tensor, src_pages: torch.Tensor) -> None:
        _tok_view(dst_pages, dst_fmt, r, agreed, num_heads).copy_(
            _tok_view(src_pages, src_fmt, r, agreed, num_heads)
        )

    if idx_all is None:
        # Few runs: slice-copy each run into scratch, permute-copy it back.
        for start, length in runs:
            for off in range(0, length, cap):
                n = min(cap, length - off)
                dst = flat[start + off : start + off + n]
                scratch[:n].copy_(dst)
                convert(dst, scratch[:n])
    else:
        # Fragmented ids: gather a chunk, permute it in scratch, scatter back.
        tmp = torch.empty_like(scratch)
        for off in range(0, n_ids, cap):
            idx = idx_all[off : off + cap]
            n = idx.numel()
            torch.index_select(flat, 0, idx, out=scratch[:n])
            convert(tmp[:n], scratch[:n])
            flat.index_copy_(0, idx, tmp[:n])


def _convert_(
    caches: Sequence[torch.Tensor],
    block_ids: Iterable[int] | torch.Tensor,
    *,
    block_size: int,
    num_heads: int,
    agreed: int,
    src_fmt: str,
    dst_fmt: str,
    scratch_bytes: int | None,
) -> int:
    flats = [page_view(c) for c in caches]
    if not flats:
        return 0
    num_blocks = flats[0].shape[0]
    if any(f.shape[0] != num_blocks for f in flats):
        raise ValueError("all caches must have the same number of blocks")
    r = reblock_ratio(block_size, agreed)
    for f in flats:
        if f.shape[1] % (block_size * num_heads):
            raise ValueError(
                f"page of {f.shape[1]} elements is not {block_size} tokens × {num_heads} heads × C"
            )
    # The id plan is computed once for every layer.
    ids = _normalise_ids(block_ids, num_blocks)
    if not ids:
        return 0
    runs = _runs(ids)
    # Slice-copy per run unless runs are so short that per-op overhead (a kernel
    # launch on a GPU) outweighs the bytes: then gather/scatter by index.
    run_bytes = len(ids) * flats[0].shape[1] * flats[0].element_size() / len(runs)
    min_run = _MIN_RUN_BYTES.get(flats[0].device.type, 1 << 20)
    fragmented = len(runs) > 8 and run_bytes < min_run
    sub_local = r > 1 and {src_fmt, dst_fmt} == {"NHD", "HND_SUB"}
    idx_cache: dict[tuple[torch.device, bool], torch.Tensor] = {}

    def index(device: torch.device, expand: bool) -> torch.Tensor | None:
        if not fragmented:
            return None
        if (device, expand) not in idx_cache:
            idx = torch.tensor(ids, dtype=torch.long, device=device)
            if expand:
                idx = (idx[:, None] * r + torch.arange(r, device=device)).reshape(-1)
            idx_cache[(device, expand)] = idx
        return idx_cache[(device, expand)]

    for flat in flats:
        page = flat.shape[1]
        if sub_local and flat.stride(0) == page:
            # An NHD page is r token-major sub-blocks, so NHD <-> HND sub-pages
            # converts each sub-block on its own: work on sub-pages, which lets
            # the scratch stay small and cache-resident.
            _convert_flat_(
                flat.view(num_blocks * r, page // r),
                [(s * r, n * r) for s, n in runs],
                len(ids) * r,
                index(flat.device, True),
                r=1,
                agreed=agreed,
                num_heads=num_heads,
                src_fmt=src_fmt,
                dst_fmt=dst_fmt,
                scratch_bytes=scratch_bytes,
            )
        else:
            _convert_flat_(
                flat,
                runs,
                len(ids),
                index(flat.device, False),
                r=r,
                agreed=agreed,
                num_heads=num_heads,
                src_fmt=src_fmt,
                dst_fmt=dst_fmt,
                scratch_bytes=scratch_bytes,
            )
    return len(ids)


def _as_list(cache: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [cache] if isinstance(cache, torch.Tensor) else list(cache)


def reblock_(
    cache: torch.Tensor | Sequence[torch.Tensor],
    block_ids: Iterable[int] | torch.Tensor,
    *,
    block_size: int,
    num_heads: int,
    agreed: int,
    src_layout: str = "NHD",
    dst_layout: str = "HND",
    scratch_bytes: int | None = None,
) -> int:
    """Re-block ``block_ids`` of ``cache`` in place into ``agreed``-token sub-pages.

    ``cache``: one layer's cache or a list of layers' caches (the id plan is
    then computed once); dim 0 indexes blocks, each page dense (see :func:`page_view`),
    ``block_size`` tokens × ``num_heads`` heads × C per page in ``src_layout``.
    Afterwards each listed page holds ``block_size // agreed`` sub-pages in
    ``dst_layout``.  Duplicate ids are converted once.  Returns the number of
    pages moved (0 in alias mode).
    """
    r = reblock_ratio(block_size, agreed)
    if is_alias(src_layout, dst_layout, r):
        for c in _as_list(cache):
            page_view(c)  # still validate the geometry
        return 0
    return _convert_(
        _as_list(cache),
        block_ids,
        block_size=block_size,
        num_heads=num_heads,
        agreed=agreed,
        src_fmt=src_layout,
        dst_fmt=_sub_fmt(dst_layout),
        scratch_bytes=scratch_bytes,
    )


def unreblock_(
    cache: torch.Tensor | Sequence[torch.Tensor],
    block_ids: Iterable[int] | torch.Tensor,
    *,
    block_size: int,
    num_heads: int,
    agreed: int,
    src_layout: str = "HND",
    dst_layout: str = "NHD",
    scratch_bytes: int | None = None,
) -> int:
    """Inverse of :func:`reblock_`: ``src_layout`` sub-pages → ``dst_layout`` pages.

    Here ``src_layout`` is the sub-page layout and ``dst_layout`` the layout
    of the whole ``block_size``-token page to restore.
    """
    r = reblock_ratio(block_size, agreed)
    if is_alias(dst_layout, src_layout, r):
        for c in _as_list(cache):
            page_view(c)
        return 0
    return _convert_(
        _as_list(cache),
        block_ids,
        block_size=block_size,
        num_heads=num_heads,
        agreed=agreed,
        src_fmt=_sub_fmt(src_layout),
        dst_fmt=dst_layout,
        scratch_bytes=scratch_bytes,
    )


def reblock_upstream_style_(
    cache: torch.Tensor,
    block_ids: Iterable[int] | torch.Tensor,
    *,
    block_size: int,
    num_heads: int,
    agreed: int,
    src_layout: str = "NHD",
    dst_layout: str = "HND",
) -> None:
    """Reference for the benchmark: index_select + permute + index_copy_ (PR 30448 style)."""
    flat = page_view(cache)
    r = reblock_ratio(block_size, agreed)
    ids = _normalise_ids(block_ids, flat.shape[0])
    idx = torch.tensor(ids, dtype=torch.long, device=flat.device)
    blocks = flat.index_select(0, idx)
    n = blocks.shape[0]
    out = torch.empty_like(blocks)
    _tok_view(out, _sub_fmt(dst_layout), r, agreed, num_heads).copy_(
        _tok_view(blocks, src_layout, r, agreed, num_heads)
    )
    flat.index_copy_(0, idx, out.reshape(n, -1))
