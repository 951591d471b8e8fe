"""What the engine tests (tests/system/engines/test_cpu_pd.py,
tests/system/netns/test_netns_pd.py, tests/system/slurm/test_slurm_cpu_pd.py) send to a vLLM
deployment of the tiny model and read back: token-id prompts, greedy completion requests,
vLLM's prompt-token counters, and the KV-lease hazard lines of prefill's log
(docs/cpu-pd-recipe.md, gotcha 7)."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

import pytest

from pdlaunch.observe.health import get_text, metric_sum, post_json, probe

SERVED = "tiny"
MAX_TOKENS = 16
REQUEST_TIMEOUT = 180.0  # a PD request can stall for tens of seconds on a loaded 2-core box
METRICS_TIMEOUT = 30.0

# vLLM's prompt tokens by where they came from: decode of a disaggregated request counts them
# as external_kv_transfer, an engine that computed them as local_compute.
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
EXT = "external_kv_transfer"
LOCAL = "local_compute"
XFER_COUNT = "vllm:nixl_xfer_time_seconds_count"
XFER_BYTES = "vllm:nixl_bytes_transferred_sum"

BAD_KV_LINES = ("Potentially invalid KV blocks", "Releasing expired KV blocks")
# Blocks that expire never read were recomputed by decode (vllm-router 0.1.17 sometimes
# streams a request to decode without prefill's kv_transfer_params): harmless.
_NEVER_READ = "retrieved by 0 remote worker(s)"


def make_prompts(seed: int, lengths: Sequence[int]) -> list[list[int]]:
    """One prompt of random token ids per length, the same for a seed on every run."""
    rng = random.Random(seed)
    # Ids 4.. avoid the tokenizer's special tokens (<unk> <s> </s> <pad>).
    return [[rng.randrange(4, 2048) for _ in range(n)] for n in lengths]


# The prompts of the loopback deployments (tests/system/engines/test_cpu_pd.py,
# tests/system/slurm/test_slurm_cpu_pd.py): lengths on both sides of 32-token block boundaries.
CPU_PD_PROMPT_LENS = (10, 31, 33, 64, 100, 129, 200, 250)
CPU_PD_PROMPTS = make_prompts(20260, CPU_PD_PROMPT_LENS)


def body(prompt: list[int], **extra: Any) -> dict[str, Any]:
    """A greedy completion of exactly MAX_TOKENS tokens that returns their ids."""
    return {
        "model": SERVED,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
    }


def token_ids(status: int, resp: Any, where: str) -> list[int]:
    assert status == 200 and isinstance(resp, dict), f"{where}: HTTP {status}: {str(resp)[:500]}"
    ids = resp["choices"][0].get("token_ids")
    assert isinstance(ids, list) and len(ids) == MAX_TOKENS, f"{where}: token_ids {ids!r}"
    return ids


# vllm-router 0.1.17 answers this when it has taken every decode (or prefill) out of its pool:
# its health check (every 60 s, 5 s timeout, 3 failures) or circuit breaker saw a worker that
# a starved 2-core box kept from answering (docs/cpu-pd-recipe.md, gotcha 7). It re-admits the
# worker at a later check: the router's availability verdict, not an answer of the deployment.
ROUTER_NO_WORKERS = "No available workers"
READMIT_WAIT = 150.0


def complete(base: str, prompt: list[int], where: str, **extra: Any) -> list[int]:
    """POST ``body(prompt, **extra)`` to ``base``/v1/completions; the generated token ids. A
    router that has no worker of a role left is asked again, loudly, every 10 s for up to
    READMIT_WAIT s; any other answer counts as it is."""
    deadline = time.monotonic() + READMIT_WAIT
    while True:
        status, resp = post_json(
            base + "/v1/completions", body(prompt, **extra), timeout=REQUEST_TIMEOUT
        )
        if status != 503 or ROUTER_NO_WORKERS not in str(resp) or time.monotonic() > deadline:
            return token_ids(status, resp, where)
        print(f"\n[engine-requests] {where}: router answered 503 {str(resp)[:120]!r}; asking again")
        time.sleep(10)


def wait_healthy(url: str, where: str, wait: float = 120.0, context: str = "") -> float:
    """Seconds until ``url``/health answered 200; fails after ``wait``. A dead process never
    answers; a live API server starved on 2 cores (docs/cpu-pd-recipe.md, gotcha 7) may answer
    late, which is printed. ``context`` (e.g. a log digest) goes into the failure."""
    t0 = time.monotonic()
    while not (last := probe(url + "/health", timeout=10)).ok:
        if time.monotonic() - t0 > wait:
            pytest.fail(f"{where}: {url} not healthy within {wait:g}s: {last.error or last.status}"
                        f"\n{context}")  # fmt: skip
        time.sleep(2)
    took = time.monotonic() - t0
    if took > 10:
        print(f"\n[e2e] {where}: {url}/health answered after {took:.0f}s")
    return took


def metrics(base: str) -> str:
    return get_text(base + "/metrics", timeout=METRICS_TIMEOUT)


def grew(before: str, after: str, name: str, **labels: str) -> float:
    """How much counter ``name`` (summed over series matching ``labels``) grew."""
    return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)


def metrics_grown(
    base: str, before: str, name: str, at_least: float, wait: float = 15.0, **labels: str
) -> str:
    """``base``'s /metrics once counter ``name`` (its series matching ``labels``) has grown by
    ``at_least`` since ``before``, or after ``wait`` s: vLLM counts a request when the
    engine's stats reach the API server, which may be after the answer."""
    deadline = time.monotonic() + wait
    while True:
        page = metrics(base)
        if grew(before, page, name, **labels) >= at_least or time.monotonic() > deadline:
            return page
        time.sleep(0.5)


def settled_metrics(
    decode: str, prefill: str, decode_before: str, tokens: int, wait: float = 15.0
) -> tuple[str, str]:
    """Decode's and prefill's /metrics once decode's external_kv_transfer count has grown by
    ``tokens`` (:func:`metrics_grown`), prefill's read right after."""
    d1 = metrics_grown(decode, decode_before, BY_SOURCE, tokens, wait, source=EXT)
    return d1, metrics(prefill)


def pd_token_counts(d0: str, d1: str, p0: str, p1: str) -> dict[str, float]:
    """Prompt tokens decode loaded by KV transfer or computed itself, and prefill computed,
    between two scrapes of each."""
    return {
        "decode_external": grew(d0, d1, BY_SOURCE, source=EXT),
        "decode_local": grew(d0, d1, BY_SOURCE, source=LOCAL),
        "prefill_local": grew(p0, p1, BY_SOURCE, source=LOCAL),
    }


def kv_lease_problems(log_text: str) -> list[str]:
    """Lines of a prefill log that say decode read KV blocks whose lease had expired."""
    return [
        line
        for line in log_text.splitlines()
        if _NEVER_READ not in line and any(bad in line for bad in BAD_KV_LINES)
    ]


def fail_on_kv_lease_problem(log_text: str) -> None:
    problems = kv_lease_problems(log_text)
    if problems:
        pytest.fail(
            "prefill logged a KV lease problem (decode read blocks after prefill's "
            "lease on them expired: a stall in the router or a NIXL read outlasted "
            f"kv_lease_duration; the output cannot be trusted): {problems[0].strip()}"
        )
