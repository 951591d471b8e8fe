"""The per-pair canary (pdlaunch/observe/canary.py): its verdict on counter deltas, and every
pair of a 2 prefills x 2 decodes set of fake engines (tests/support/fake_vllm.py's Engine, served
in-process over real HTTP on loopback) asked directly, a broken pair named."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from pdlaunch.observe import canary
from pdlaunch.observe.health import CanaryResult
from pdlaunch.observe.watch import Counters
from tests.support.fake_vllm import Engine as FakeEngine
from tests.support.fake_vllm_http import serve

MODEL = "fake-model"


# -- the verdict ---------------------------------------------------------------------------------
def test_a_pair_that_moved_its_kv_and_answers_right_passes() -> None:
    ok, msg = canary.judge(57, Counters(requests=1, local=1, external=56), " a b", " a b")
    assert ok is True and "56 of 57" in msg
    # vLLM 0.32 counts the whole prompt as transferred
    assert canary.judge(57, Counters(requests=1, external=57), "x", "x")[0] is True


@pytest.mark.parametrize(
    ("delta", "pd", "alone", "expect"),
    [
        (Counters(requests=1, local=57), "x", "x", "the KV did not move"),
        (Counters(requests=1, local=30, external=27), "x", "x", "only 27 of 57"),
        (Counters(requests=1, external=57, failed=2), "x", "x", "2 NIXL transfer(s)"),
        (Counters(requests=1, external=57), " garbage", " tok", "cannot use correctly"),
        (Counters(requests=-3, local=-100), "x", "x", "restarted"),
    ],
)
def test_a_broken_pair_fails_with_the_reason(delta, pd, alone, expect) -> None:
    ok, msg = canary.judge(57, delta, pd, alone)
    assert ok is False and expect in msg, msg


def test_other_traffic_on_the_decode_makes_the_pair_unattributable() -> None:
    ok, msg = canary.judge(57, Counters(requests=3, local=2, external=170), "x", "x")
    assert ok is None and "other requests" in msg
    assert canary.judge(None, Counters(requests=1, external=57), "x", "x")[0] is False


# -- fake engines over HTTP ----------------------------------------------------------------------
def fake(no_kv: bool = False, corrupt: bool = False, ranks: list[int] | None = None) -> FakeEngine:
    e = FakeEngine(MODEL, "127.0.0.1", 0, no_kv=no_kv, unhealthy=False, ranks=ranks)
    e.corrupt_kv = corrupt
    return e


def test_every_pair_of_2x2_is_asked_and_the_broken_one_named() -> None:
    with (
        serve(fake()) as p0,
        serve(fake()) as p1,
        serve(fake()) as d0,
        serve(fake(no_kv=True)) as d1,  # ignores kv_transfer_params: recomputes every prompt
    ):
        prefills = [canary.Engine("prefill-0", p0.url), canary.Engine("prefill-1", p1.url)]
        decodes = [canary.Engine("decode-0", d0.url), canary.Engine("decode-1", d1.url)]
        yielded = list(canary.iter_pairs(prefills, decodes, MODEL, timeout=10, settle=0.5))
        seen = [r.pair for r in yielded]
        results = canary.in_pair_order(yielded, prefills, decodes)
    assert [r.pair for r in results] == [
        "prefill-0 → decode-0",
        "prefill-0 → decode-1",
        "prefill-1 → decode-0",
        "prefill-1 → decode-1",
    ]
    assert sorted(seen) == sorted(r.pair for r in results)
    verdict = {r.pair: r.ok for r in results}
    assert verdict == {
        "prefill-0 → decode-0": True,
        "prefill-0 → decode-1": False,
        "prefill-1 → decode-0": True,
        "prefill-1 → decode-1": False,
    }
    bad = results[1]
    assert "the KV did not move" in bad.message, bad.message
    assert bad.to_dict()["decode_external_kv_transfer_tokens"] == 0
    # Each decode got one direct request per prefill, carrying that prefill's KV handle;
    # each prefill one remote-decode request per decode, and one alone to compare with.
    for d in (d0, d1):
        engines = sorted(p["kv_transfer_params"]["remote_engine_id"] for p in d.posts)
        assert engines == sorted([f"fake-{p0.engine.port}", f"fake-{p1.engine.port}"])
    for p in (p0, p1):
        remote = [x for x in p.posts if x.get("kv_transfer_params")]
        alone = [x for x in p.posts if not x.get("kv_transfer_params")]
        assert len(remote) == 2 and len(alone) == 2
        assert all(x["kv_transfer_params"]["do_remote_decode"] for x in remote)
        assert all(x["max_tokens"] == 1 for x in remote)
    # every pair had a prompt of its own (a repeated one would hit decode's prefix cache)
    prompts = [x["prompt"] for d in (d0, d1) for x in d.posts]
    assert len(set(prompts)) == 4
    summary = canary.summarize(results, None)
    assert not summary.ok
    assert summary.message.startswith("2 of 4 prefill → decode pair(s) failed: ")
    assert "prefill-1 → decode-1: the KV did not move" in summary.message


def test_wrong_answer_and_missing_kv_handle_and_dead_decode() -> None:
    with serve(fake()) as p0, serve(fake(no_kv=True)) as p_nokv, serve(fake(corrupt=True)) as d:
        r = canary.check_pair(
            canary.Engine("prefill-0", p0.url), canary.Engine("decode-0", d.url), MODEL,
            timeout=10, settle=0.5,
        )  # fmt: skip
        assert not r.ok and "cannot use correctly" in r.message and "garbage" in r.message
        r = canary.check_pair(
            canary.Engine("prefill-1", p_nokv.url), canary.Engine("decode-0", d.url), MODEL,
            timeout=10, settle=0.5,
        )  # fmt: skip
        assert not r.ok and "prefill-1 returned no kv_transfer_params" in r.message
        dead = canary.Engine("decode-9", "http://127.0.0.1:9")  # nothing listens on port 9
        r = canary.check_pair(canary.Engine("prefill-0", p0.url), dead, MODEL, timeout=3)
        assert not r.ok and "decode-9" in r.message and "/metrics" in r.message


def test_a_busy_decode_is_retried_with_a_fresh_prompt() -> None:
    with serve(fake()) as p0, serve(fake(), extra_requests=1) as d:
        r = canary.check_pair(
            canary.Engine("prefill-0", p0.url), canary.Engine("decode-0", d.url), MODEL,
            timeout=10, settle=0.5,
        )  # fmt: skip
        assert r.ok and r.attempts == 2, r
        assert len({x["prompt"] for x in d.posts}) == 2
    with serve(fake()) as p0, serve(fake(), extra_requests=10) as d:
        r = canary.check_pair(
            canary.Engine("prefill-0", p0.url), canary.Engine("decode-0", d.url), MODEL,
            timeout=10, settle=0.2, attempts=2,
        )  # fmt: skip
        assert not r.ok and r.message.startswith("not proven: ") and r.attempts == 2


# -- data-parallel engines: every rank an end of its own -------------------------------------------
def test_each_decode_dp_rank_is_pinned_and_proven_and_the_broken_rank_named() -> None:
    decode = fake(ranks=[0, 1])
    decode.no_kv_ranks = {1}  # rank 1 cannot reach prefill's KV: it recomputes
    with serve(fake()) as p0, serve(decode) as d:
        prefills = [canary.Engine("prefill-0", p0.url)]
        decodes = [canary.Engine("decode-0", d.url, (0, 1))]
        assert canary.pair_count(prefills, decodes) == 2
        results = canary.in_pair_order(
            canary.iter_pairs(prefills, decodes, MODEL, timeout=10, settle=0.5),
            prefills,
            decodes,
        )
    assert [(r.pair, r.ok) for r in results] == [
        ("prefill-0 → decode-0 (DP rank 0)", True),
        ("prefill-0 → decode-0 (DP rank 1)", False),
    ]
    assert "the KV did not move" in results[1].message, results[1].message
    # judged on the rank's own counters: rank 0's KV is not credited to rank 1
    assert results[0].delta.external > 0 and results[1].delta.external == 0
    assert [r.to_dict()["decode_dp_rank"] for r in results] == [0, 1]
    assert d.rank_headers == ["0", "1"]  # each decode request pinned; prefill's not
    assert set(p0.rank_headers) == {None}


def test_each_prefill_dp_rank_hands_out_its_own_kv() -> None:
    # hybrid load balancing: this API server fronts global ranks 2 and 3, header index 0, 1
    with serve(fake(ranks=[2, 3])) as p, serve(fake()) as d:
        prefills = [canary.Engine("prefill-0-node1", p.url, (2, 3))]
        decodes = [canary.Engine("decode-0", d.url)]
        results = canary.check_pairs(prefills, decodes, MODEL, timeout=10, settle=0.5)
    assert [(r.pair, r.ok) for r in results] == [
        ("prefill-0-node1 (DP rank 2) → decode-0", True),
        ("prefill-0-node1 (DP rank 3) → decode-0", True),
    ], results
    # decode pulled from each prefill rank's own engine, and prefill alone ran on it too
    pulled = [x["kv_transfer_params"]["remote_engine_id"] for x in d.posts]
    assert pulled == [f"fake-{p.engine.port}-dp2", f"fake-{p.engine.port}-dp3"]
    assert p.rank_headers == ["0", "0", "1", "1"]


def test_a_release_that_ignores_the_rank_header_is_judged_as_one_engine() -> None:
    decode = fake(ranks=[0, 1])
    decode.ignore_rank_header = True
    decode.next_rank = 1  # its own balancer picks rank 1 for the request pinned to rank 0
    with serve(fake()) as p0, serve(decode) as d:
        r = canary.check_pair(
            canary.Engine("prefill-0", p0.url), canary.Engine("decode-0", d.url, (0, 1)), MODEL,
            timeout=10, settle=0.5, decode_rank=0,
        )  # fmt: skip
    assert r.ok, r
    assert r.message.startswith("DP rank 0 not proven on its own: vLLM ran the request on"), r
    assert "KV moved" in r.message and r.delta.external > 0


def test_a_rank_out_of_the_servers_range_is_refused_by_the_engine() -> None:
    with serve(fake()) as p0, serve(fake(ranks=[0, 1])) as d:
        r = canary.check_pair(
            canary.Engine("prefill-0", p0.url), canary.Engine("decode-0", d.url, (0, 1, 2)),
            MODEL, timeout=10, settle=0.5, decode_rank=2,
        )  # fmt: skip
    assert not r.ok and "decode-0 (DP rank 2) answered HTTP 400" in r.message, r


@dataclass
class F:
    id: str
    severity: str
    process: str
    what: str


def test_findings_of_the_pair_explain_it_decode_first() -> None:
    bad = canary.PairResult("prefill-1", "decode-0", False, "the KV did not move")
    good = canary.PairResult("prefill-0", "decode-1", True, "ok")
    findings = [
        F("nixl-handshake", "error", "prefill-1", "handshake refused"),
        F("decode-recomputes", "error", "decode-0", "computed 57 tokens"),
        F("keepalive", "warning", "decode-0", "short keep-alive"),
        F("other", "error", "decode-1", "not this pair"),
    ]
    canary.attach_findings([bad, good], findings)
    assert bad.findings == [
        "decode-recomputes on decode-0: computed 57 tokens",
        "nixl-handshake on prefill-1: handshake refused",
    ]
    assert good.findings == []
    assert bad.describe() == (
        "prefill-1 → decode-0: the KV did not move (doctor: decode-recomputes on decode-0: "
        "computed 57 tokens; nixl-handshake on prefill-1: handshake refused)"
    )


def test_summary_keeps_the_router_fields_and_adds_pairs() -> None:
    router = CanaryResult(True, "served disaggregated", {"latency_s": 0.1, "prompt_tokens": 9})
    ok = canary.PairResult("prefill-0", "decode-0", True, "ok", latency_s=0.5)
    s = canary.summarize([ok], router)
    assert s.ok and s.details["latency_s"] == 0.1 and s.details["prompt_tokens"] == 9
    assert s.details["pairs"][0]["pair"] == "prefill-0 → decode-0"
    assert s.details["router"] == {"ok": True, "message": "served disaggregated"}
    assert "all 1 prefill → decode pair(s)" in s.message and "router: served" in s.message
    assert not canary.summarize([ok], CanaryResult(False, "no")).ok


def test_pairs_are_yielded_as_they_finish_and_a_thread_error_reaches_the_caller(
    monkeypatch,
) -> None:
    """iter_pairs reports a fast decode's pair before a slow decode's is done (progress while
    waiting), and an exception inside a decode's thread is raised in the caller's thread."""
    slow_done = threading.Event()

    def fake_check(prefill, decode, model, **kw):
        if decode.name == "decode-slow":
            assert slow_done.wait(10)
            if prefill.name == "prefill-boom":
                raise RuntimeError("decode thread failed")
        return canary.PairResult(prefill.name, decode.name, ok=True, message="ok")

    monkeypatch.setattr(canary, "check_pair", fake_check)
    prefills = [canary.Engine("prefill-0", "http://x")]
    decodes = [canary.Engine("decode-slow", "http://s"), canary.Engine("decode-fast", "http://f")]
    it = canary.iter_pairs(prefills, decodes, MODEL)
    first = next(it)  # would block forever if results came only once every decode finished
    assert first.decode == "decode-fast"
    slow_done.set()
    assert [r.decode for r in it] == ["decode-slow"]

    slow_done.clear()
    boom = [canary.Engine("prefill-boom", "http://b")]
    it = canary.iter_pairs(boom, decodes, MODEL)
    assert next(it).decode == "decode-fast"
    slow_done.set()
    with pytest.raises(RuntimeError, match="decode thread failed"):
        list(it)
