"""Who post-processes the KV cache of a prefill/decode pair: the one decision, native first.

When prefill and decode hold their KV pages differently (block size, layout), someone must
convert them. In order of preference:

1. the prefill plugin's own post-processing (vllm-gaudi's hetero_hpu_nixl_connector: prefill
   re-blocks to the agreed size and permutes NHD -> HND before decode pulls);
2. vLLM's own receive-side post-processing: decode merges remote blocks when its block is a
   multiple of prefill's (kv_connector/utils.py), and permutes remote HND into local NHD with
   enable_permute_local_kv; it cannot do the other directions (decode block smaller than
   prefill's, NHD pages into an HND decode);
3. pdlaunch's KV extension (pdlaunch/kv/), only for cache shapes it handles: a 4-D
   [blocks, heads, block, C] NIXL cache (CUDA), not Gaudi's flat per-K/per-V HPU cache nor
   the CPU backend's tiles.

A pair that decode can take with vLLM's receive side needs no conversion on prefill at all, so
the plugin (1) and the extension (3) are considered only for pages prefill must convert; no
profile records a decode-side conversion of a plugin's own. A pair none of them can serve is
refused. Pure functions over resolved values: kvgeometry
feeds them a topology's block sizes and layouts, and rules and plan both read the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pdlaunch.spec.plugins import PluginProfile, PostProcessing

PathKind = Literal["none", "plugin", "vllm", "extension", "refused"]
EXTENSION_SOURCE = "pdlaunch/kv/connector.py (register_kv_caches); docs/kv-extension.md"
VLLM_RECEIVE_SOURCE = (
    "vllm/distributed/kv_transfer/kv_connector/utils.py (local % remote == 0); "
    "nixl/base_worker.py (enable_permute_local_kv)"
)


@dataclass(frozen=True)
class PrefillSide:
    """One prefill instance's geometry and what can post-process its pages."""

    device: str
    block_size: int
    layout: str
    can_reblock: bool  # the device's cache is one pdlaunch's extension handles
    plugin: PluginProfile | None


@dataclass(frozen=True)
class PrefillPath:
    """What a prefill advertises to decode, and who makes its pages look like that."""

    kind: Literal["none", "plugin", "extension", "refused"]
    block_size: int  # advertised
    layout: str  # advertised
    why: str
    source: str
    # kind == "plugin" (left out of hashing: the profile's dicts are not hashable, and `why`
    # names the profile already)
    post: PostProcessing | None = field(default=None, compare=False)
    plugin_id: str | None = None

    @property
    def converts(self) -> bool:
        """Pages are converted on prefill (by the plugin or the extension)."""
        return self.kind in ("plugin", "extension")


def needs_prefill_side(block: int, layout: str, agreed: int, decode_layouts: set[str]) -> bool:
    """Stock decode handles decode block = k x prefill block and remote HND into local NHD;
    a larger prefill block, or NHD pages for an HND decode, must be converted on prefill
    (seed guide Case 2, PR 30448)."""
    return block > agreed or (layout == "NHD" and "HND" in decode_layouts)


def choose_prefill(p: PrefillSide, agreed: int, decode_layouts: set[str]) -> PrefillPath:
    """The post-processing path of one prefill instance feeding decodes of these layouts."""
    if not needs_prefill_side(p.block_size, p.layout, agreed, decode_layouts):
        return PrefillPath(
            "none", p.block_size, p.layout, "decode reads prefill's pages as they are", ""
        )
    need = (
        f"prefill block {p.block_size} {p.layout} must become {agreed} "
        f"{'HND' if 'HND' in decode_layouts else p.layout} before decode pulls it"
    )
    post = p.plugin.prefill_postprocess() if p.plugin else None
    if post is not None and (agreed <= p.block_size or not post.smaller_blocks_only):
        assert p.plugin is not None
        how = (
            f"done natively on {p.plugin.id}'s stack: {post.requires}"
            if post.requires
            else f"{p.plugin.id} does it natively"
        )
        return PrefillPath(
            "plugin",
            agreed,
            post.layout_on_save,
            f"{need}: {how}",
            post.source,
            post,
            p.plugin.id,
        )
    cache_ok = p.can_reblock and (p.plugin is None or p.plugin.extension_ok)
    if cache_ok:
        # NHD pages feeding only NHD decodes are already sub-pages (the extension's alias mode).
        alias = p.layout == "NHD" and decode_layouts == {"NHD"}
        return PrefillPath(
            "extension",
            agreed,
            "NHD" if alias else "HND",
            f"{need}: no plugin does it here and vLLM post-processes on receive only, so "
            "pdlaunch's KV extension re-blocks on prefill",
            EXTENSION_SOURCE,
        )
    if p.plugin is not None:
        plugin = f"{p.plugin.id} offers no prefill-side post-processing"
        cache = f"this {p.plugin.kv_cache_shape} cache ({p.plugin.extension_why})"
        source = f"{p.plugin.id} {p.plugin.kv_cache_source}"
    else:
        plugin = f"no plugin serves {p.device}"
        cache = f"the {p.device} KV cache"
        source = EXTENSION_SOURCE
    return PrefillPath(
        "refused",
        p.block_size,
        p.layout,
        f"{need}, and nothing can: {plugin}; vLLM post-processes on receive only (decode "
        "block a multiple of prefill's; HND into NHD); pdlaunch's KV extension handles "
        f"4-D [blocks, heads, block, C] caches, not {cache}",
        f"{source}; {VLLM_RECEIVE_SOURCE}",
    )


@dataclass(frozen=True)
class PairPath:
    prefill: str
    decode: str
    kind: PathKind
    why: str
    source: str


def choose_pair(
    prefill: str,
    decode: str,
    path: PrefillPath,
    decode_block: int,
    decode_layout: str,
) -> PairPath:
    """The path of one prefill -> decode pair, given the prefill's own path."""
    if path.kind != "none":
        return PairPath(prefill, decode, path.kind, path.why, path.source)
    same_block = decode_block == path.block_size
    if same_block and decode_layout == path.layout:
        return PairPath(prefill, decode, "none", "same block size and layout: no conversion", "")
    if decode_block % path.block_size or (path.layout == "NHD" and decode_layout == "HND"):
        return PairPath(
            prefill,
            decode,
            "refused",
            f"decode block {decode_block} {decode_layout} cannot take prefill's "
            f"{path.block_size} {path.layout} pages: vLLM merges only into a multiple of "
            "prefill's block and permutes only HND into NHD",
            VLLM_RECEIVE_SOURCE,
        )
    parts = []
    if not same_block:
        parts.append(f"merges {decode_block // path.block_size} remote blocks into one")
    if decode_layout != path.layout:
        parts.append("permutes HND into NHD (enable_permute_local_kv)")
    return PairPath(
        prefill,
        decode,
        "vllm",
        f"vLLM's own receive-side post-processing on decode {' and '.join(parts)}",
        VLLM_RECEIVE_SOURCE,
    )
