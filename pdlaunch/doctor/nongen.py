"""Router warnings that requests which generate nothing explain.

vllm-router 0.1.17 in P/D mode sends every POST it does not know through the
prefill -> decode path, `/tokenize` too; prefill answers such a request without
`kv_transfer_params` (it generates nothing, so it hands out no KV), and the router logs
`No kv_transfer_params for prefill ..., decode will proceed without them`
(src/routers/http/vllm_pd_router.rs:1885). `vllm bench serve` calls `/tokenize` through the
router once per run to align prompts (vllm/benchmarks/serve.py:91), so that warning followed
every `pdlaunch bench`. The router's line does not name the path; the prefill's access log
does (`"POST /tokenize HTTP/1.1" 200 OK`). Each such POST at the prefill explains one router
warning naming that prefill.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import replace

from pdlaunch.doctor.evidence import ProcessEvidence

NO_KV_PARAMS = "router-no-kv-transfer-params"
# vLLM's endpoints that generate tokens (and so hand out KV on a prefill): vllm/entrypoints
# /openai (completions, chat, responses, messages) and /inference/v1/generate.
GENERATION_PATHS = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        "/inference/v1/generate",
    }
)
# uvicorn's access log line: `INFO:     127.0.0.1:42374 - "POST /tokenize HTTP/1.1" 200 OK`.
_ACCESS = re.compile(r'"POST (?P<path>/[^ ?"]*)[^ "]* HTTP/[\d.]+"')
_PREFILL = re.compile(r"No kv_transfer_params for prefill (?P<url>\S+?),? decode will")


def non_generation_posts(lines: Iterable[str]) -> int:
    """POSTs in an engine's access log to a path that generates nothing."""
    n = 0
    for line in lines:
        m = _ACCESS.search(line)
        if m and m.group("path").rstrip("/") not in GENERATION_PATHS:
            n += 1
    return n


def _address(url: str) -> str:
    """``http://127.0.0.1:8100/...`` -> ``127.0.0.1:8100``."""
    return url.split("//", 1)[-1].split("/", 1)[0]


def explain(findings: Sequence, processes: Sequence[ProcessEvidence]) -> list:
    """``findings`` with each router-no-kv-transfer-params finding reduced by the
    non-generation POSTs its prefill logged: dropped when they explain all its lines, else
    kept with the unexplained count."""
    by_address = {
        _address(p.metrics_url): p for p in processes if p.role == "prefill" and p.metrics_url
    }
    out = []
    for f in findings:
        m = _PREFILL.search(f.line) if f.id == NO_KV_PARAMS else None
        prefill = by_address.get(_address(m.group("url"))) if m else None
        if prefill is None or prefill.log is None:
            out.append(f)
            continue
        explained = non_generation_posts(prefill.log)
        if f.count <= explained:
            continue
        if explained:
            f = replace(
                f,
                count=f.count - explained,
                what=f"{f.what} ({explained} more such line(s) were /tokenize-like requests "
                f"that generate nothing, not counted)",
            )
        out.append(f)
    return out
