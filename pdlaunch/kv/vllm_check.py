"""Import-time check that the installed vLLM has the private NIXL connector structures the
re-blocking connector (:mod:`pdlaunch.kv.connector`) relies on, and is a tested version.

Runs inside the vLLM engine (imports vLLM); :mod:`pdlaunch.kv.connector` calls
:func:`assert_supported_vllm` before it defines anything.
"""

from __future__ import annotations

import dataclasses
import inspect
import os

import vllm
from vllm.distributed.kv_transfer.kv_connector import utils as _kv_utils
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import connector as _nixl_connector
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

from pdlaunch.kv import TESTED_VLLM_VERSIONS

#: Set to 1 to run on a vLLM version the connector was not tested with
#: (the structural checks below still run).
ALLOW_UNTESTED_ENV = "PDLAUNCH_KV_ALLOW_UNTESTED_VLLM"


class PdlaunchVllmVersionError(RuntimeError):
    """The installed vLLM is not the one this connector was built for."""


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
