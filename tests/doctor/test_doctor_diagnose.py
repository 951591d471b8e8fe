"""The matcher over whole logs (line numbers, repeat counts, superseding, roles), the metrics
checks over real Prometheus text (written by prometheus_client, as vLLM writes it), and the
plan-aware keep-alive check."""

from __future__ import annotations

from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, Counter, generate_latest

from pdlaunch.doctor import match
from pdlaunch.doctor.diagnose import (
    MAX_LINE,
    ROUTER_POOL_IDLE_S,
    Finding,
    diagnose_evidence,
    metrics_findings,
    plan_findings,
)
from pdlaunch.doctor.evidence import Evidence, ProcessEvidence
from pdlaunch.plan.build import build_plan
from pdlaunch.spec.load import load_text

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "doctor"
LINES = yaml.safe_load((FIXTURES / "lines.yaml").read_text())


def log(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


def summary(findings: list[Finding]) -> list[tuple]:
    return [(f.id, f.severity, f.line_no, f.count, f.last_line_no) for f in findings]


def test_decode_log_findings_with_line_numbers_and_counts():
    found = match(log("decode-0.log"), "decode", "decode-0", "10.0.0.1")
    assert summary(found) == [
        ("ucx-transport-unavailable", "warning", 2, 1, 2),
        ("kv-block-size-divisibility", "error", 6, 3, 11),
        ("kv-load-recomputed", "warning", 9, 2, 12),
    ]
    block = found[1]
    assert block.process == "decode-0" and block.host == "10.0.0.1"
    assert block.where == "decode-0@10.0.0.1:6"
    assert block.what.endswith(
        "local KV block size 16 is not a multiple of the remote block size 32."
    )
    assert block.line == log("decode-0.log")[5]
    assert "vllm-project/vllm#42895" in block.cause
    assert block.source == "vllm/distributed/kv_transfer/kv_connector/utils.py:517"


def test_generic_handshake_failure_is_superseded_by_its_cause():
    lines = log("decode-0.log")
    assert "nixl-handshake-failed" not in {f.id for f in match(lines, "decode", "d")}
    # Control: the handshake header alone is reported as the generic failure.
    alone = [x for x in lines if "AssertionError" not in x]
    generic = match(alone, "decode", "d")
    assert [(f.id, f.line_no, f.count) for f in generic if f.id.startswith("nixl")] == [
        ("nixl-handshake-failed", 5, 3)
    ]
    assert generic[1].what == (
        "A NIXL handshake with a peer engine failed (handshake_failed); its requests cannot "
        "load KV."
    )


def test_prefill_log_ignores_decode_only_messages():
    found = match(log("prefill-0.log"), "prefill", "prefill-0", "10.0.0.2")
    assert summary(found) == [
        ("kv-lease-expired", "warning", 3, 2, 6),
        ("kv-read-after-expiry", "error", 5, 1, 5),
    ]
    # The same log read as a decode's: only the decode-only line (7) is recognised.
    assert [(f.id, f.line_no) for f in match(log("prefill-0.log"), "decode", "x")] == [
        ("kv-load-recomputed", 7)
    ]


def test_router_log_colour_codes_are_removed():
    found = match(log("router.log"), "router", "router", "10.0.0.3")
    assert summary(found) == [
        ("router-no-kv-transfer-params", "warning", 3, 1, 3),
        ("router-upstream-closed", "warning", 4, 2, 5),
        ("router-upstream-reset", "error", 6, 1, 6),
    ]
    assert "\x1b" in log("router.log")[2] and "\x1b" not in found[0].line
    assert found[0].what == (
        "Prefill http://127.0.0.1:18100 answered without kv_transfer_params: decode recomputes "
        "the prompt itself."
    )


def test_a_huge_line_is_trimmed_and_an_empty_log_finds_nothing():
    line = LINES["kv-load-failed"]["real"][0] + " " + "x" * 50_000
    (f,) = match([line], "decode", "d")
    assert len(f.line) == MAX_LINE and f.line.endswith("…")
    assert match([], "decode", "d") == []
    assert match(["", "   "], "decode", "d") == []


# -- metrics ------------------------------------------------------------------------------------
def prom(tokens: dict[str, float] | None = None, **counters: float) -> str:
    """/metrics text as vLLM's prometheus_client counters expose it."""
    reg = CollectorRegistry()
    if tokens is not None:
        c = Counter(
            "vllm:prompt_tokens_by_source",
            "Prompt tokens by source",
            ["model_name", "engine", "source"],
            registry=reg,
        )
        for source, value in tokens.items():
            c.labels("tiny", "0", source).inc(value)
    for name, value in counters.items():
        Counter(f"vllm:{name}", name, ["model_name", "engine"], registry=reg).labels(
            "tiny", "0"
        ).inc(value)
    return generate_latest(reg).decode()


def ids(findings: list[Finding]) -> list[str]:
    return [f.id for f in findings]


def test_decode_that_recomputes_between_two_snapshots():
    before = prom({"local_compute": 10, "external_kv_transfer": 900, "local_cache_hit": 0})
    recomputing = prom({"local_compute": 410, "external_kv_transfer": 900, "local_cache_hit": 0})
    (f,) = metrics_findings("decode-0", "decode", "h", before, recomputing, 5.0)
    assert f.id == "decode-recomputes" and f.kind == "metrics" and f.severity == "error"
    assert f.what.startswith("Decode computed 400 prompt tokens itself in 5 s and loaded none")
    loading = prom({"local_compute": 12, "external_kv_transfer": 1500, "local_cache_hit": 0})
    assert metrics_findings("decode-0", "decode", "h", before, loading, 5.0) == []


def test_decode_that_never_loaded_kv_since_start():
    never = prom({"local_compute": 500, "external_kv_transfer": 0})
    assert ids(metrics_findings("d", "decode", "h", never)) == ["decode-recomputes"]
    # One local token per request is what a disaggregated decode computes itself.
    assert (
        metrics_findings("d", "decode", "h", prom({"local_compute": 3, "external_kv_transfer": 90}))
        == []
    )
    assert metrics_findings("d", "decode", "h", prom()) == []  # no such metric: no verdict
    assert metrics_findings("p", "prefill", "h", never) == []  # prefill computes by design


def test_nixl_counters_by_role():
    text = prom(nixl_num_kv_expired_reqs=3, nixl_num_notifications_after_expiry=2,
                nixl_num_failed_transfers=0)  # fmt: skip
    found = metrics_findings("prefill-0", "prefill", "h", text)
    assert ids(found) == ["kv-expired-requests", "notifications-after-expiry"]
    assert found[0].what == "3 request(s) with expired KV since start."
    assert metrics_findings("decode-0", "decode", "h", text) == []  # counted on prefill only
    failed = prom(nixl_num_failed_transfers=7)
    after = prom(nixl_num_failed_transfers=9)
    (f,) = metrics_findings("decode-0", "decode", "h", failed, after, 2)
    assert (
        f.id == "nixl-failed-transfers"
        and f.what == "9 failed NIXL transfer(s) since start (+2 in 2 s)."
    )


# -- a deployment -----------------------------------------------------------------------------
def test_diagnose_evidence_orders_errors_first_and_reports_collection_failures():
    ev = Evidence(
        "dep",
        [
            ProcessEvidence("prefill-0", "prefill", "h1", log=log("prefill-0.log"),
                            metrics_error="http://h1:8100/metrics: Connection refused"),
            ProcessEvidence("decode-0", "decode", "h2", log=log("decode-0.log"),
                            metrics=prom({"local_compute": 500, "external_kv_transfer": 0})),
            ProcessEvidence("router", "router", "h3", log_error="h3: cannot read router.log"),
        ],
    )  # fmt: skip
    found = diagnose_evidence(ev)
    assert [(f.id, f.process) for f in found] == [
        ("kv-read-after-expiry", "prefill-0"),
        ("kv-block-size-divisibility", "decode-0"),
        ("decode-recomputes", "decode-0"),
        ("kv-lease-expired", "prefill-0"),
        ("metrics-unreachable", "prefill-0"),
        ("ucx-transport-unavailable", "decode-0"),
        ("kv-load-recomputed", "decode-0"),
        ("log-unreadable", "router"),
    ]
    assert found[4].what == "http://h1:8100/metrics: Connection refused"


# -- plan ---------------------------------------------------------------------------------------
def local_plan(extra_env: str = ""):
    text = (ROOT / "topologies" / "local-cpu.yaml").read_text()
    if extra_env:
        text = text.replace('    VLLM_CPU_KVCACHE_SPACE: "1"\n',
                            f'    VLLM_CPU_KVCACHE_SPACE: "1"\n{extra_env}')  # fmt: skip
    topo, _ = load_text(text, "local-cpu.yaml")
    return build_plan(topo)


def test_keepalive_mismatch_names_engines_when_the_router_saw_closed_connections():
    closed = match(log("router.log"), "router", "router", "127.0.0.1")
    (f,) = plan_findings(closed, local_plan())
    assert f.id == "keepalive-mismatch" and f.process == "router" and f.kind == "plan"
    assert f.what == (
        "Engines close idle connections after prefill-0 (5 s), decode-0 (5 s); vllm-router "
        f"keeps them {ROUTER_POOL_IDLE_S} s."
    )
    longer = local_plan('    VLLM_HTTP_TIMEOUT_KEEP_ALIVE: "75"\n')
    assert plan_findings(closed, longer) == []
    # No closed connection in the router log: no keep-alive finding.
    assert plan_findings(match(log("decode-0.log"), "decode", "d"), local_plan()) == []
