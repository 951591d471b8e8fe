"""The KV lease budget of a running deployment: how long decode takes to come and read a
finished request's KV blocks, from the engines' /metrics, against the lease prefill holds them
for (:mod:`pdlaunch.plan.lease`).

The gap that must fit in the lease runs from prefill finishing the request to decode starting
its read (or its first heartbeat). No runtime timestamps both ends (benchhops.py): decode's
``request_queue_time_seconds`` covers the decode side (arrival in its engine -> scheduled
after the blocks arrived: the handshake, the wait for a read and the read itself), an upper
bound of that part; the router's hand-off before it is known only as a mean (benchhops'
derived row). ``gap = decode queue quantile + hand-off mean`` is therefore an estimate,
marked as such wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdlaunch.observe import metrics as promhist
from pdlaunch.plan.lease import Lease

# Warn when the p99 gap reaches this share of the lease: expiries start at 1.0, and a tail
# that grows with load crosses the rest of the way between two looks.
WARN_FRACTION = 0.5
DECODE_QUEUE = "vllm:request_queue_time_seconds"


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
