"""The KV lease budget: how long prefill keeps a finished request's KV blocks for decode to
read, against how long decode takes to come and read them. Pure but for
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

The gap that must fit in the lease runs from prefill finishing the request to decode starting
its read (or its first heartbeat). No runtime timestamps both ends (benchhops.py): decode's
``request_queue_time_seconds`` covers the decode side (arrival in its engine -> scheduled
after the blocks arrived: the handshake, the wait for a read and the read itself), an upper
bound of that part; the router's hand-off before it is known only as a mean (benchhops'
derived row). ``gap = decode queue quantile + hand-off mean`` is therefore an estimate,
marked as such wherever it is shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pdlaunch.observe import metrics as promhist

DEFAULT_LEASE_S = 30  # base_scheduler.py:82-86 (vLLM 0.22-0.33)
ASSUMED_ABORT_TIMEOUT_S = 120  # vllm/envs.py: 120 where introduced, 480 later; the smaller
ABORT_TIMEOUT = "VLLM_NIXL_ABORT_REQUEST_TIMEOUT"
# Warn when the p99 gap reaches this share of the lease: expiries start at 1.0, and a tail
# that grows with load crosses the rest of the way between two looks.
WARN_FRACTION = 0.5
DECODE_QUEUE = "vllm:request_queue_time_seconds"


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


@dataclass(frozen=True)
class Gap:
    """Prefill finished -> decode read, for one decode (estimated; see the module doc)."""

    decode: str
    count: float
    p50_s: float | None
    p99_s: float | None
    p99_bound: str = ""  # "<=" / ">=": the p99 fell in the first / last histogram bucket
    p50_bound: str = ""
    handoff_mean_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "decode": self.decode,
            "requests": self.count,
            "gap_p50_s": self.p50_s,
            "gap_p99_s": self.p99_s,
            "p99_bound": self.p99_bound,
            "p50_bound": self.p50_bound,
            "handoff_mean_s": self.handoff_mean_s,
            "measured": "decode request_queue_time_seconds quantiles (histogram)",
            "derived": "plus the mean router/HTTP hand-off (difference of means), when known",
        }


def gap(decode: str, queue: promhist.Histogram | None, handoff_mean_s: float = 0.0) -> Gap:
    """The gap for ``decode`` from its queue-time histogram (over a run or a window)."""
    add = max(0.0, handoff_mean_s)
    if queue is None or queue.count <= 0:
        return Gap(decode, 0.0, None, None, "", "", add)
    p50, p99 = promhist.quantile(queue, 0.5), promhist.quantile(queue, 0.99)
    return Gap(
        decode,
        queue.count,
        p50.value + add if p50 else None,
        p99.value + add if p99 else None,
        _bound(p99),
        _bound(p50),
        add,
    )


def _bound(q: promhist.Quantile | None) -> str:
    return (">=" if q.above else "<=" if q.below else "") if q else ""


def gap_from_metrics(
    decode: str, before: str | None, after: str, handoff_mean_s: float = 0.0
) -> Gap:
    """:func:`gap` from decode's /metrics: the window between two reads (``before`` None:
    since the engine started)."""
    h = promhist.parse(after, DECODE_QUEUE)
    if h is not None and before is not None:
        b = promhist.parse(before, DECODE_QUEUE)
        if b is not None:
            h = h - b
            if h.went_back():
                h = promhist.parse(after, DECODE_QUEUE)  # restarted: its totals since then
    return gap(decode, h, handoff_mean_s)


def _delta(metric: str, before: str | None, after: str) -> promhist.Histogram | None:
    h = promhist.parse(after, metric)
    if h is not None and before is not None:
        b = promhist.parse(before, metric)
        if b is not None and not (h - b).went_back():
            return h - b
    return h


def frontend_mean_s(before: str | None, after: str) -> float:
    """Decode's own hand-off, from its /metrics alone: TTFT (from HTTP arrival) minus queue
    time minus first step, as means (0 when unknown). Requests sit there after prefill
    finished and before decode's scheduler knows them (and heartbeats them)."""
    ttft = _delta("vllm:time_to_first_token_seconds", before, after)
    queue = _delta(DECODE_QUEUE, before, after)
    step = _delta("vllm:request_prefill_time_seconds", before, after)
    means = [h.mean if h is not None else None for h in (ttft, queue, step)]
    if any(m is None for m in means):
        return 0.0
    t, q, s = means
    assert t is not None and q is not None and s is not None
    return max(0.0, t - q - s)


def decode_gap(decode: str, before: str | None, after: str) -> Gap:
    """The gap as far as decode's /metrics tell (`status --watch`, `doctor`): its queue-time
    quantiles plus its frontend mean; the router's hand-off before that is not in them."""
    return gap_from_metrics(decode, before, after, frontend_mean_s(before, after))


def budget_warning(g: Gap, lease: Lease | None, fraction: float = WARN_FRACTION) -> str | None:
    """A warning when the p99 gap reaches ``fraction`` of the lease (before expiries start);
    a p99 that is only an upper bound ("<=") below the threshold says nothing."""
    if lease is None or g.p99_s is None or g.p99_s < fraction * lease.seconds:
        return None
    if g.p99_bound == "<=" and g.p99_s >= fraction * lease.seconds:
        # The whole first bucket is the answer: still at most that, and may be far less.
        qualifier = "up to "
    elif g.p99_bound == ">=":
        qualifier = "at least "
    else:
        qualifier = ""
    return (
        f"{g.decode}: p99 gap between prefill finishing and decode reading the KV is "
        f"{qualifier}{g.p99_s:.1f} s (estimated from decode's queue time over "
        f"{g.count:g} request(s)), {g.p99_s / lease.seconds:.0%} of the {lease.seconds:g} s "
        f"lease ({lease.source}): requests start expiring (prefill frees their blocks, "
        "decode recomputes or reads freed blocks) when it reaches 100%"
    )


# -- what a lease must cover (validate) ---------------------------------------------------------
DTYPE_BYTES = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}  # fmt: skip


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int) -> int | None:
    """K and V bytes one token takes across the model's layers (a standard multi-head or
    grouped-query attention config.json); None where the config does not say (MLA and
    other layouts are not estimated)."""
    cfg = config.get("text_config", config)
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if cfg.get("kv_lora_rank"):  # MLA: a latent cache, not K/V heads
        return None
    return 2 * layers * kv_heads * head_dim * dtype_bytes


@lru_cache(maxsize=64)
def model_kv_bytes_per_token(model_path: str, dtype: str, kv_cache_dtype: str) -> int | None:
    """:func:`kv_bytes_per_token` of a model directory on this host; None if it has no
    readable config.json (a hub id, or a path only the nodes have)."""
    try:
        config = json.loads((Path(model_path).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    name = kv_cache_dtype if kv_cache_dtype not in ("auto", "") else dtype
    if name in ("auto", ""):
        name = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return kv_bytes_per_token(config, DTYPE_BYTES.get(name, 2))


def needed_lease_s(prompt_tokens: int, bytes_per_token: int, gb_per_s: float) -> float:
    """Seconds one prompt's KV takes to read at ``gb_per_s`` (GB = 1e9 bytes): the least a
    lease must cover beyond the hand-off."""
    return prompt_tokens * bytes_per_token / (gb_per_s * 1e9)
