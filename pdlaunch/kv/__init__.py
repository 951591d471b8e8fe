"""KV connector extension: prefill-side re-blocking and NHD→HND over NIXL.

This package root is safe to import on the control host: it imports neither
torch, vLLM nor nixl.  ``pdlaunch.kv.blocks`` (torch) and
``pdlaunch.kv.connector`` (torch + vLLM 0.32 + nixl) are only imported on
prefill nodes, by vLLM itself through ``kv_connector_module_path``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

#: Value for ``kv_connector_module_path`` in ``--kv-transfer-config``.
CONNECTOR_MODULE_PATH = "pdlaunch.kv.connector"
#: Value for ``kv_connector`` in ``--kv-transfer-config``.
CONNECTOR_CLASS = "PdlaunchNixlConnector"

#: ``kv_connector_extra_config`` keys read by the connector.
KEY_AGREED_BLOCK_SIZE = "agreed_block_size"
KEY_DECODE_BLOCK_SIZES = "decode_block_sizes"
KEY_DECODE_KV_LAYOUT = "decode_kv_layout"

#: vLLM versions the connector was built and tested against.
TESTED_VLLM_VERSIONS = ("0.32.0",)


def agreed_block_size(sizes: Iterable[int]) -> int:
    """The block size every prefill and decode block is a multiple of: their GCD.

    The one definition for the control host (pdlaunch.plan.kv_geometry) and the connector inside
    vLLM (which derives it when the config leaves it out), so the two cannot disagree.
    """
    values = [int(s) for s in sizes]
    if not values:
        raise ValueError("no block sizes to agree on")
    if any(s <= 0 for s in values):
        raise ValueError(f"block sizes must be positive, got {values}")
    return math.gcd(*values)


def prefill_kv_transfer_config(
    *,
    agreed_block_size: int,
    decode_block_sizes: list[int] | tuple[int, ...] | int,
    decode_kv_layout: str = "HND",
    kv_role: str = "kv_producer",
    kv_buffer_device: str | None = None,
    load_failure_policy: str | None = None,
    enable_permute_local_kv: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``--kv-transfer-config`` dict for a prefill instance using the extension: the one
    builder, called by the launcher's plan on the control host (pure Python, no torch/vLLM).
    """
    sizes = (
        [decode_block_sizes] if isinstance(decode_block_sizes, int) else list(decode_block_sizes)
    )
    extra_config: dict[str, Any] = dict(extra or {})
    extra_config.update(
        {
            KEY_AGREED_BLOCK_SIZE: int(agreed_block_size),
            KEY_DECODE_BLOCK_SIZES: [int(s) for s in sizes],
            KEY_DECODE_KV_LAYOUT: decode_kv_layout,
        }
    )
    config: dict[str, Any] = {"kv_connector": CONNECTOR_CLASS, "kv_role": kv_role}
    if kv_buffer_device is not None:
        config["kv_buffer_device"] = kv_buffer_device
    config["kv_connector_module_path"] = CONNECTOR_MODULE_PATH
    if load_failure_policy:
        config["kv_load_failure_policy"] = load_failure_policy
    if enable_permute_local_kv:
        config["enable_permute_local_kv"] = True
    config["kv_connector_extra_config"] = extra_config
    return config


__all__ = [
    "CONNECTOR_CLASS",
    "CONNECTOR_MODULE_PATH",
    "KEY_AGREED_BLOCK_SIZE",
    "KEY_DECODE_BLOCK_SIZES",
    "KEY_DECODE_KV_LAYOUT",
    "TESTED_VLLM_VERSIONS",
    "agreed_block_size",
    "prefill_kv_transfer_config",
]
