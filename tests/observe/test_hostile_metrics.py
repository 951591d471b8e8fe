"""Proofs that a hostile /metrics page cannot fool (issue 32). Every verdict pdlaunch draws from
an engine's counters (the per-pair canary, the router canary's token counts, `status --watch`,
bench's) reads them through pdlaunch.observe.metrics, where a NaN, an infinity, a negative or
huge value, a line that does not parse or a series given twice is no evidence: the verdict
fails and names the series and the value, and no page gives a traceback.

The pages are served over real HTTP on loopback: a decode is tests/support/fake_vllm.py's
Engine, whose /metrics is rewritten once it has served a request (as a broken or hostile
exporter would answer)."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pdlaunch.fsutil import dumps_json_finite
from pdlaunch.observe import bench_hops, canary, health, hops_plot, metrics, watch
from tests.support.fake_vllm import Engine as FakeEngine
from tests.support.fake_vllm_http import serve as served

MODEL = "fake-model"
EXTERNAL = re.compile(
    r'^(vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"\}) \S+$', re.M
)
REQUESTS = re.compile(r"^(vllm:request_success_total\{[^}]*\}) \S+$", re.M)


def _set(pattern: re.Pattern[str], value: str) -> Callable[[str], str]:
    return lambda text: pattern.sub(lambda m: f"{m.group(1)} {value}", text)


def _duplicate(text: str) -> str:
    line = EXTERNAL.search(text)
    assert line is not None
    return text + line.group(0) + "\n"


def _unparseable(text: str) -> str:
    # the family's sample with its value cut off
    return text + 'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}\n'


# (name, rewrite of decode's page once it served, what the failure must name)
HOSTILE: list[tuple[str, Callable[[str], str], str]] = [
    ("nan", _set(EXTERNAL, "NaN"), 'source="external_kv_transfer"} = NaN: NaN'),
    ("+inf", _set(EXTERNAL, "+Inf"), "= +Inf: infinite"),
    ("negative", _set(REQUESTS, "-1"), "vllm:request_success_total{"),
    ("huge", _set(EXTERNAL, "1e300"), "= 1e300: beyond 2**53"),
    ("not-a-number", _set(EXTERNAL, "0x1p3"), "= 0x1p3: not a number"),
    ("duplicate", _duplicate, "appears twice on the page"),
    ("unparseable", _unparseable, "unreadable sample line"),
]


class HostileEngine(FakeEngine):
    """A fake vLLM engine whose /metrics is rewritten by ``rewrite`` once it served."""

    def __init__(self, rewrite: Callable[[str], str] | None = None) -> None:
        super().__init__(MODEL, "127.0.0.1", 0, no_kv=False, unhealthy=False)
        self.rewrite = rewrite

    def metrics(self) -> str:
        text = super().metrics()
        return self.rewrite(text) if self.rewrite and self.requests else text


@contextlib.contextmanager
def serve(engine: FakeEngine) -> Iterator[str]:
    with served(engine) as s:
        yield s.url


@contextlib.contextmanager
def page(text: str) -> Iterator[str]:
    """A /metrics URL answering ``text``."""
    body = text.encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def _pair(rewrite: Callable[[str], str] | None) -> canary.PairResult:
    with serve(HostileEngine()) as p, serve(HostileEngine(rewrite)) as d:
        return canary.check_pair(
            canary.Engine("prefill-0", p),
            canary.Engine("decode-0", d),
            MODEL,
            timeout=10,
            settle=0.3,
            attempts=1,
        )


# -- the per-pair canary ---------------------------------------------------------------------------
def test_an_honest_page_with_noise_around_it_still_proves_the_pair() -> None:
    noise = "\x00\xff}{garbage\n# HELP x\nvllm_other_total NaN\nvllm:prompt_tokens_by_sourceX 1\n"
    r = _pair(lambda text: noise + text + noise)
    assert r.ok, r.message


@pytest.mark.parametrize(("case", "rewrite", "named"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_decode_page_fails_the_pair_naming_series_and_value(
    case: str, rewrite: Callable[[str], str], named: str
) -> None:
    r = _pair(rewrite)
    assert r.ok is False, f"{case}: {r.message}"
    assert "/metrics is no evidence" in r.message and named in r.message, r.message
    assert "\n" not in r.message
    # the result's JSON (up --json, canary --json) is JSON
    json.loads(dumps_json_finite(r.to_dict()), parse_constant=_no_constant)


# -- the router canary's token counts --------------------------------------------------------------
@pytest.mark.parametrize("value", ["NaN", "+Inf", "-1"])
def test_the_router_canary_refuses_a_token_count_that_is_no_evidence(value: str) -> None:
    text = f'vllm:prompt_tokens_by_source_total{{source="external_kv_transfer"}} {value}\n'
    with page(text) as url, pytest.raises(health.NoEvidence, match=f"= {re.escape(value)}"):
        health.tokens_by_source([url.replace("/metrics", "/health")], "external_kv_transfer")


# -- status --watch --------------------------------------------------------------------------------
@pytest.mark.parametrize(("case", "rewrite", "named"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_watch_flags_a_hostile_page_instead_of_judging_it(
    case: str, rewrite: Callable[[str], str], named: str
) -> None:
    engine = HostileEngine()
    with serve(engine) as url:
        before = watch.Counters.parse(health.get_text(url + "/metrics"))
        engine.requests_of[0] += 2  # two requests served without any KV: not disaggregated
        engine.tokens["local_compute"] += 200
        engine.rewrite = rewrite
        now = watch.Counters.parse(health.get_text(url + "/metrics"))
    row = watch.judge("decode-0", "decode", before, now)
    assert not row.ok and named in row.flags[0] and "no evidence" in row.flags[0], row.flags


# -- bench's hops ----------------------------------------------------------------------------------
QUEUE = "vllm:request_queue_time_seconds"


def _queue_page(bucket: str, total: str, count: str, le: str = "0.3") -> str:
    return (
        f'{QUEUE}_bucket{{engine="0",le="{le}"}} {bucket}\n'
        f'{QUEUE}_bucket{{engine="0",le="+Inf"}} {count}\n'
        f'{QUEUE}_sum{{engine="0"}} {total}\n'
        f'{QUEUE}_count{{engine="0"}} {count}\n'
    )


@pytest.mark.parametrize(
    ("after", "named"),
    [
        (_queue_page("20", "+Inf", "20"), '_sum{engine="0"} = +Inf: infinite'),
        (_queue_page("20", "NaN", "20"), "= NaN: NaN"),
        (_queue_page("20", "1.5", "-20"), "= -20: negative"),
        (_queue_page("20", "1.5", "20", le="abc"), "its le is not a bound"),
        (_queue_page("20", "1.5", "20") + f'{QUEUE}_count{{engine="0"}} 20\n', "appears twice"),
        (
            _queue_page("20", "1e308", "20") * 1
            + _queue_page("1", "1e308", "1").replace('engine="0"', 'engine="1"'),
            "overflows",
        ),
    ],
)
def test_a_hostile_histogram_is_a_problem_and_the_plot_still_draws(after: str, named: str) -> None:
    before = _queue_page("0", "0", "0")
    with page(before) as b_url, page(after) as a_url:
        b, a = health.get_text(b_url), health.get_text(a_url)
    roles = {"decode-0": "decode"}
    hops = bench_hops.breakdown(roles, {"decode-0": b}, {"decode-0": a}, client_ttft_mean_s=1.0)
    assert any(named in p for p in hops.problems), hops.problems
    wait = hops.hop("decode_kv_wait")
    assert wait is not None and wait.count == 0 and wait.mean_s is None
    assert hops_plot.svg(hops, "hostile").startswith("<svg")
    json.loads(dumps_json_finite(hops.to_dict()), parse_constant=_no_constant)


def test_the_plot_skips_values_no_axis_can_place() -> None:
    # A derived row is a difference of means: it can be anything a page's numbers make it.
    hop = bench_hops.HopStat("x", "x", "s", 1.0, float("inf"), float("nan"), 1e300)
    other = bench_hops.HopStat("y", "y", "s", 1.0, 0.5, 0.4, 0.9)
    svg = hops_plot.svg(bench_hops.Breakdown((hop, other), None), "t")
    assert svg.startswith("<svg") and "inf" not in svg and "nan" not in svg


# -- the one place a sample becomes evidence -------------------------------------------------------
def test_counter_sums_label_sets_and_names_what_is_no_evidence() -> None:
    text = (
        'c_total{engine="0"} 3\n'
        'c_total{engine="1"} 4\n'
        'c_total{engine="2"} NaN\n'
        "c_total_created 1.7e9\n"
    )
    r = metrics.counter(text, "c_total")
    assert r.value == 7 and r.problems == ('c_total{engine="2"} = NaN: NaN',)
    assert metrics.counter(text, "c_total", engine="1") == metrics.Reading(4.0)
    assert metrics.counter("", "c_total") == metrics.Reading(0.0)
    # two series each below 2**53 whose sum is not: the delta of one token would be rounding
    huge = 'c_total{engine="0"} 6e15\nc_total{engine="1"} 6e15\n'
    assert "beyond 2**53" in metrics.counter(huge, "c_total").problems[0]


def test_json_output_holds_null_for_non_finite_values() -> None:
    doc = {"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "c": (2, "NaN")}
    text = dumps_json_finite(doc)
    assert json.loads(text, parse_constant=_no_constant) == {
        "a": None,
        "b": [None, None, 1.5],
        "c": [2, "NaN"],
    }


def _no_constant(name: str) -> object:
    raise AssertionError(f"{name} is not JSON")
