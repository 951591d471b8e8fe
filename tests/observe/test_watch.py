"""The running proof of disaggregation (pdlaunch.observe.watch): verdicts from two metric
snapshots."""

from __future__ import annotations

from pdlaunch.observe.watch import Counters, judge

# Prometheus text as vLLM 0.32 exposes it (counter names get `_total`).
TEXT = """# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} {req}
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} 1.0
vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="local_compute"}} {local}
vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="external_kv_transfer"}} {ext}
vllm:nixl_num_failed_transfers_total{{engine="0",model_name="m"}} {failed}
vllm:nixl_num_kv_expired_reqs_total{{engine="0",model_name="m"}} {expired}
"""


def counters(req=0.0, local=0.0, ext=0.0, failed=0.0, expired=0.0) -> Counters:
    return Counters.parse(
        TEXT.format(req=req, local=local, ext=ext, failed=failed, expired=expired)
    )


def test_parse_sums_labels_and_reads_the_total_suffix():
    c = counters(req=4, local=7, ext=300, failed=2, expired=1)
    assert c == Counters(requests=5, local=7, external=300, failed=2, expired=1)


def test_decode_loading_kv_is_ok():
    row = judge("decode-0", "decode", counters(req=1, local=1, ext=99), counters(3, 3, 300))
    assert row.ok and row.delta.external == 201 and row.delta.requests == 2


def test_decode_without_kv_is_flagged_not_disaggregated():
    row = judge("decode-0", "decode", counters(req=1, ext=99), counters(req=4, local=300, ext=99))
    assert not row.ok and "NOT DISAGGREGATED" in row.flags[0]


def test_decode_recomputing_prompts_is_flagged():
    row = judge("decode-0", "decode", counters(), counters(req=2, local=150, ext=10))
    assert any(f.startswith("recomputing") for f in row.flags)


def test_failures_and_expired_leases_are_flagged_on_any_role():
    row = judge("prefill-0", "prefill", counters(), counters(req=1, local=50, expired=2))
    assert row.flags and "lease expired" in row.flags[0]
    row = judge("decode-0", "decode", counters(), counters(req=1, local=1, ext=9, failed=1))
    assert row.flags == ["1 KV transfer(s) failed"]


def test_a_restarted_engine_is_named_not_judged():
    row = judge("decode-0", "decode", counters(req=9, ext=900), counters(req=1, ext=10))
    assert row.flags == ["counters went back: the engine restarted"]


def test_idle_decode_gets_no_verdict():
    assert judge("decode-0", "decode", counters(req=3), counters(req=3)).ok
