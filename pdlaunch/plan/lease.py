"""The KV lease: how long prefill keeps a finished request's KV blocks for decode to read,
per release, and how long the longest prompt's read needs. Pure but for
:func:`model_kv_bytes_per_token` (reads the model's config.json).

The lease, per release (vLLM source):

- 0.22+ (facts: ``kv_lease_duration`` among the NIXL extra-config keys): prefill holds the
  blocks ``kv_lease_duration`` seconds, default 30 (0.32:
  distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py:82-86); decode renews it with
  heartbeats every lease // 6 s (:88), each extending it by 2/3 of the lease
  (base_worker.py:532, 3042-3061), but only for requests decode has received and only once
  its NIXL handshake with that prefill is done (``_send_heartbeats`` skips a pending
  handshake, base_worker.py:3179-3195). Expired leases are reaped on prefill
  (``_reap_expired_send_leases``, base_worker.py:3014-3040; counted as
  ``vllm:nixl_num_kv_expired_reqs``).
- Older releases: ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT`` (vllm/envs.py), a fixed timer with no
  heartbeat. Its default changed between releases (120 s where it was introduced, 480 s
  later) and pdlaunch's facts do not record it per release: pdlaunch assumes the smaller,
  120 s, and says so.

How long decode takes to come and read the blocks, against this lease, is measured from
the engines' metrics: :mod:`pdlaunch.observe.lease_budget`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pdlaunch.fsutil import ReadRefused, read_json_bounded

DEFAULT_LEASE_S = 30  # base_scheduler.py:82-86 (vLLM 0.22-0.33)
ASSUMED_ABORT_TIMEOUT_S = 120  # vllm/envs.py: 120 where introduced, 480 later; the smaller
ABORT_TIMEOUT = "VLLM_NIXL_ABORT_REQUEST_TIMEOUT"


@dataclass(frozen=True)
class Lease:
    seconds: float
    source: str  # where the value comes from, for a person


def lease_of(
    kv_transfer_config: dict[str, Any] | None,
    env: dict[str, str],
    reads_lease: bool,
) -> Lease | None:
    """The lease a prefill process runs with: its rendered kv_lease_duration, else the
    release's default (``reads_lease``: the node's vLLM reads kv_lease_duration), else its
    VLLM_NIXL_ABORT_REQUEST_TIMEOUT, else that variable's assumed default. None: no NIXL."""
    # Mooncake has no such lease; the re-blocking extension's connector is a NixlConnector.
    if not kv_transfer_config or "Mooncake" in str(kv_transfer_config.get("kv_connector")):
        return None
    extra = kv_transfer_config.get("kv_connector_extra_config") or {}
    if isinstance(extra, dict) and isinstance(extra.get("kv_lease_duration"), (int, float)):
        return Lease(float(extra["kv_lease_duration"]), "kv_connector.kv_lease_duration")
    if reads_lease:
        return Lease(float(DEFAULT_LEASE_S), "vLLM's default kv_lease_duration (30 s)")
    raw = env.get(ABORT_TIMEOUT)
    if raw is not None:
        try:
            return Lease(float(raw), ABORT_TIMEOUT)
        except ValueError:
            pass
    return Lease(
        float(ASSUMED_ABORT_TIMEOUT_S),
        f"{ABORT_TIMEOUT} default, assumed {ASSUMED_ABORT_TIMEOUT_S} s (120 or 480 by release)",
    )


def release_reads_lease(version: str) -> bool:
    """Whether vLLM ``version`` reads kv_lease_duration (facts); unknown releases: yes."""
    from pdlaunch.spec import facts

    try:
        vf = facts.vllm(version)
    except KeyError:
        return True
    return "kv_lease_duration" in vf.nixl.get("extra_config_keys", {"kv_lease_duration": 1})


def plan_lease(plan: Any) -> Lease | None:
    """The shortest lease any prefill of ``plan`` (a pdlaunch.plan.build.Plan) holds blocks for."""
    reads = release_reads_lease(plan.vllm_version)
    leases = [
        lease
        for p in plan.by_role("prefill")
        if (lease := lease_of(p.kv_transfer_config, p.env, reads)) is not None
    ]
    return min(leases, key=lambda x: x.seconds) if leases else None


# -- what a lease must cover (validate) ---------------------------------------------------------
DTYPE_BYTES = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}  # fmt: skip


# A model dimension beyond this is no real model's (the largest have ~100 layers, ~100 heads,
# head dims of a few hundred): the product would overflow the float math of the lease rule.
MAX_DIMENSION = 1 << 20
# config.json files are a few KB (those with big label maps a few hundred KB).
CONFIG_MAX_BYTES = 4 << 20


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int) -> int | None:
    """K and V bytes one token takes across the model's layers (a standard multi-head or
    grouped-query attention config.json); None where the config does not say (MLA and
    other layouts are not estimated) or says what no model is (a dimension below 1 or
    beyond MAX_DIMENSION)."""
    cfg = config.get("text_config", config)
    if not isinstance(cfg, dict):
        return None
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError):
        return None
    if not all(1 <= n <= MAX_DIMENSION for n in (layers, heads, kv_heads, head_dim)):
        return None
    if cfg.get("kv_lora_rank"):  # MLA: a latent cache, not K/V heads
        return None
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def read_model_config(model_path: str) -> dict[str, Any] | None:
    """The model's config.json on this host, read bounded (fsutil.read_json_bounded); None
    where there is none here (a hub id, or a path only the nodes have). A file that is there
    but is no config (a FIFO, a device, larger than CONFIG_MAX_BYTES, not JSON, nested too
    deep, numbers beyond a float) raises ReadRefused, whose message names it and the bound."""
    path = Path(model_path).expanduser() / "config.json"
    if not path.exists() and not path.is_symlink():
        return None
    config = read_json_bounded(path, CONFIG_MAX_BYTES, what="model config")
    if not isinstance(config, dict):
        raise ReadRefused(f"model config {str(path)!r} is not a JSON object")
    return config


@lru_cache(maxsize=64)
def model_kv_bytes_per_token(model_path: str, dtype: str, kv_cache_dtype: str) -> int | None:
    """:func:`kv_bytes_per_token` of a model directory on this host; None if it has no
    config.json here (a hub id, or a path only the nodes have). ReadRefused (not cached: the
    file may be fixed) when the file is there and cannot be a config."""
    config = read_model_config(model_path)
    if config is None:
        return None
    name = kv_cache_dtype if kv_cache_dtype not in ("auto", "") else dtype
    if name in ("auto", ""):
        name = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return kv_bytes_per_token(config, DTYPE_BYTES.get(name, 2))


def needed_lease_s(prompt_tokens: int, bytes_per_token: int, gb_per_s: float) -> float:
    """Seconds one prompt's KV takes to read at ``gb_per_s`` (GB = 1e9 bytes): the least a
    lease must cover beyond the hand-off."""
    return prompt_tokens * bytes_per_token / (gb_per_s * 1e9)
