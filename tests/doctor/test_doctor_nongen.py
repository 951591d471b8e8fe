"""`vllm bench serve` calls /tokenize through the router; vllm-router sends it down the PD path
and warns `No kv_transfer_params for prefill ...`. The doctor must not report that as
router-no-kv-transfer-params; a warning no such call explains still is. Lines are from a
real run (tests/fixtures/doctor/SOURCES.md, "bench run")."""

from __future__ import annotations

from pathlib import Path

from pdlaunch.doctor.diagnose import diagnose_evidence
from pdlaunch.doctor.evidence import Evidence, ProcessEvidence
from pdlaunch.doctor.nongen import non_generation_posts

FX = Path(__file__).resolve().parents[1] / "fixtures" / "doctor"


def lines(name: str) -> list[str]:
    return (FX / name).read_text().splitlines()


def evidence(router: list[str], prefill: list[str]) -> Evidence:
    return Evidence(
        "d",
        [
            ProcessEvidence(
                "prefill-0", "prefill", "127.0.0.1", log=prefill,
                metrics_url=f"http://127.0.0.1:{PREFILL_PORT}/metrics",
            ),
            ProcessEvidence("router", "router", "127.0.0.1", log=router),
        ],
    )  # fmt: skip


ROUTER = lines("bench_router.log")
PREFILL = lines("bench_prefill.log")
PREFILL_PORT = next(
    line.split("for prefill http://127.0.0.1:")[1].split(",")[0]
    for line in ROUTER
    if "No kv_transfer_params" in line
)
WARNINGS = sum("No kv_transfer_params" in line for line in ROUTER)


def ids(found) -> list[str]:
    return [f.id for f in found]


def test_fixture_is_a_bench_run_with_tokenize_calls():
    assert WARNINGS >= 1
    assert non_generation_posts(PREFILL) == WARNINGS
    # Completions are generation: not counted.
    assert any('"POST /v1/completions HTTP/1.1" 200' in line for line in PREFILL)


def test_tokenize_calls_explain_the_router_warnings():
    assert "router-no-kv-transfer-params" not in ids(diagnose_evidence(evidence(ROUTER, PREFILL)))


def test_without_the_prefill_log_the_warning_stays():
    found = diagnose_evidence(evidence(ROUTER, []))
    (f,) = [f for f in found if f.id == "router-no-kv-transfer-params"]
    assert f.count == WARNINGS


def test_a_warning_no_tokenize_call_explains_is_reported_with_what_is_left():
    extra = [line for line in ROUTER if "No kv_transfer_params" in line][:1]
    found = diagnose_evidence(evidence(ROUTER + extra, PREFILL))
    (f,) = [f for f in found if f.id == "router-no-kv-transfer-params"]
    assert f.count == 1 and "not counted" in f.what
