"""The prefill configuration the re-blocking connector serves: the settings it reads from
``kv_connector_extra_config`` and every start-up refusal, listed at once.

Runs inside the vLLM engine (reads vLLM's config objects).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

from pdlaunch.kv import (
    CONNECTOR_CLASS,
    KEY_AGREED_BLOCK_SIZE,
    KEY_DECODE_BLOCK_SIZES,
    KEY_DECODE_KV_LAYOUT,
    agreed_block_size,
)
from pdlaunch.kv import blocks as kvblocks

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig


class PdlaunchKVConfigError(ValueError):
    """A configuration the re-blocking connector cannot serve."""


@dataclass(frozen=True)
class ReblockSettings:
    agreed_block_size: int
    decode_block_sizes: tuple[int, ...]
    decode_kv_layout: str  # "NHD" or "HND"


def _layout_arg(value: Any) -> str | None:
    if value is None:
        return "HND"
    text = str(value).upper()
    text = kvblocks.LAYOUT_FROM_VLLM.get(text, text)
    return text if text in kvblocks.LAYOUTS else None


def check_config(
    vllm_config: VllmConfig,
    role: KVConnectorRole | None = None,
    kv_cache_config: KVCacheConfig | None = None,
    device_type: str | None = None,
) -> ReblockSettings:
    """Validate a prefill configuration; raise one error listing every problem.

    ``device_type`` defaults to the current platform's.  Platform-dependent
    refusals (CPU attention) only apply to the worker role, which vLLM
    builds first at start-up.
    """
    if device_type is None:
        from vllm.platforms import current_platform

        device_type = current_platform.device_type
    errors: list[str] = []
    ktc = vllm_config.kv_transfer_config
    if ktc is None:
        raise PdlaunchKVConfigError(f"{CONNECTOR_CLASS} needs --kv-transfer-config")
    extra = dict(ktc.kv_connector_extra_config or {})

    if ktc.kv_role == "kv_consumer":
        errors.append(
            "kv_role is kv_consumer: this connector belongs on the prefill instance "
            "(kv_producer); run decode with the stock NixlConnector"
        )
    cache = vllm_config.cache_config
    if cache.enable_prefix_caching:
        errors.append(
            "prefix caching is on: in-place re-blocking would corrupt shared blocks; "
            "start the prefill with --no-enable-prefix-caching"
        )
    model_config = vllm_config.model_config
    if model_config is not None and getattr(model_config, "use_mla", False):
        errors.append("MLA models are not supported: use the stock NixlConnector")
    if vllm_config.speculative_config is not None:
        errors.append("speculative decoding is not supported on the prefill instance")
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size > 1:
        errors.append("pipeline parallelism is not supported: set --pipeline-parallel-size 1")
    if parallel.prefill_context_parallel_size > 1 or parallel.decode_context_parallel_size > 1:
        errors.append(
            "context parallelism is not supported: set prefill/decode context parallel size 1"
        )
    if extra.get("bidirectional_kv_xfer"):
        errors.append("bidirectional_kv_xfer is not supported: remove it from the extra config")
    if device_type != "cpu" and ktc.kv_buffer_device == "cpu":
        errors.append(
            "host buffer mode (kv_buffer_device=cpu on an accelerator) is not supported: "
            "set kv_buffer_device to the device so NIXL reads device memory"
        )
    # CPU attention is served by its own adapter; which ISA's tiles the cache holds is only
    # known once the engine registers it (PdlaunchNixlWorker.register_kv_caches).
    if kv_cache_config is not None:
        groups = kv_cache_config.kv_cache_groups
        specs = [g.kv_cache_spec for g in groups]
        if len(groups) != 1 or not all(
            isinstance(s, FullAttentionSpec)
            and not isinstance(s, MLAAttentionSpec)
            and getattr(s, "sliding_window", None) is None
            for s in specs
        ):
            errors.append(
                "only models with one full-attention KV cache group are supported "
                f"(found {[type(s).__name__ for s in specs]}): hybrid/sliding-window/"
                "Mamba models need the stock NixlConnector"
            )

    block_size = cache.block_size
    agreed = extra.get(KEY_AGREED_BLOCK_SIZE)
    raw_decode = extra.get(KEY_DECODE_BLOCK_SIZES)
    decode_sizes: tuple[int, ...] = ()
    try:
        if raw_decode is not None:
            decode_sizes = tuple(
                int(s) for s in ([raw_decode] if isinstance(raw_decode, int) else raw_decode)
            )
    except (TypeError, ValueError):
        errors.append(f"{KEY_DECODE_BLOCK_SIZES} must be a list of ints, got {raw_decode!r}")
    if not decode_sizes:
        errors.append(
            f"set kv_connector_extra_config.{KEY_DECODE_BLOCK_SIZES} to the decode block "
            "size(s) this prefill serves, so a mismatch is refused here and not later "
            "inside decode's handshake thread"
        )
    if block_size is None:
        errors.append("set --block-size explicitly on the prefill instance")
    elif agreed is None and decode_sizes:
        # Non-positive decode sizes are refused below, with the rest.
        agreed = agreed_block_size([int(block_size), *(s for s in decode_sizes if s > 0)])
    if agreed is None:
        errors.append(
            f"set kv_connector_extra_config.{KEY_AGREED_BLOCK_SIZE} (the GCD of the prefill "
            f"and decode block sizes) or {KEY_DECODE_BLOCK_SIZES}"
        )
    else:
        try:
            agreed = int(agreed)
        except (TypeError, ValueError):
            errors.append(f"{KEY_AGREED_BLOCK_SIZE} must be an int, got {agreed!r}")
            agreed = None
    if agreed is not None:
        if agreed <= 0:
            errors.append(f"{KEY_AGREED_BLOCK_SIZE} must be positive, got {agreed}")
        else:
            if block_size is not None and int(block_size) % agreed:
                errors.append(
                    f"{KEY_AGREED_BLOCK_SIZE}={agreed} does not divide the prefill "
                    f"--block-size {block_size}"
                )
            bad = [s for s in decode_sizes if s <= 0 or s % agreed]
            if bad:
                errors.append(
                    f"decode block size(s) {bad} are not multiples of "
                    f"{KEY_AGREED_BLOCK_SIZE}={agreed}: stock decode only merges "
                    f"sub-blocks into larger blocks; use {KEY_AGREED_BLOCK_SIZE}="
                    f"{agreed_block_size([agreed, *(s for s in bad if s > 0)])} or change the "
                    "decode --block-size"
                )
    layout = _layout_arg(extra.get(KEY_DECODE_KV_LAYOUT))
    if layout is None:
        errors.append(
            f"{KEY_DECODE_KV_LAYOUT} must be HND or NHD, got {extra.get(KEY_DECODE_KV_LAYOUT)!r}"
        )
    if errors:
        raise PdlaunchKVConfigError(
            f"{CONNECTOR_CLASS} cannot serve this prefill configuration:\n  - "
            + "\n  - ".join(errors)
        )
    assert agreed is not None and layout is not None
    return ReblockSettings(int(agreed), decode_sizes, layout)


def target_layout(prefill_layout: str, decode_layout: str) -> str:
    """Sub-page layout to advertise: NHD only when both sides are NHD (alias mode)."""
    return "NHD" if prefill_layout == "NHD" and decode_layout == "NHD" else "HND"
