"""TTFT through the router next to the same requests sent pair by pair directly.

For each request (random token ids, fixed seed, so both paths see the same prompts):
- router: POST /v1/completions to the router, streamed; TTFT = first streamed token.
- direct: POST to the prefill with `kv_transfer_params: {"do_remote_decode": true}` and
  `max_tokens: 1` (what vllm-router 0.1.17 and vLLM's toy proxy send), then POST the
  returned `kv_transfer_params` to the decode, streamed; TTFT = first token from decode,
  counted from the start of the prefill request. Decodes are used round-robin.

The two paths alternate request by request so that a change of machine load hits both.
Prints one JSON object: p50/p90/p99/max TTFT (ms) per path, failures, load average.

    python benchmarks/pd_direct.py --router http://127.0.0.1:8123 \
        --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 -n 100 -c 1
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from itertools import cycle
from threading import Lock

from pdlaunch.observe.canary import prefill_body


def _post(url: str, body: dict, timeout: float):
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    return urllib.request.urlopen(req, timeout=timeout)


def _first_token(resp) -> float:
    """Read an SSE stream; return the time the first chunk with text arrived."""
    first = None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        if first is None and json.loads(line[5:])["choices"][0].get("text") is not None:
            first = time.perf_counter()
    if first is None:
        raise RuntimeError("no token streamed")
    return first


def via_router(base: str, model: str, prompt: list[int], out_len: int, timeout: float) -> float:
    t0 = time.perf_counter()
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": out_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with _post(f"{base}/v1/completions", body, timeout) as resp:
        return _first_token(resp) - t0


def direct(
    prefill: str, decode: str, model: str, prompt: list[int], out_len: int, timeout: float
) -> float:
    t0 = time.perf_counter()
    # What the router sends prefill (max_tokens 1, do_remote_decode): the same request the
    # per-pair canary makes (pdlaunch/observe/canary.py).
    body = prefill_body({"model": model, "prompt": prompt, "temperature": 0, "ignore_eos": True})
    with _post(f"{prefill}/v1/completions", body, timeout) as resp:
        params = json.loads(resp.read())["kv_transfer_params"]
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": out_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "kv_transfer_params": params,
    }
    with _post(f"{decode}/v1/completions", body, timeout) as resp:
        return _first_token(resp) - t0


def _loadavg() -> list[str]:
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--router", required=True)
    ap.add_argument("--prefill", required=True)
    ap.add_argument("--decode", required=True, action="append")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("-n", "--num-prompts", type=int, default=100)
    ap.add_argument("-c", "--concurrency", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    rng = random.Random(0)
    prompts = [
        [rng.randrange(10, a.vocab) for _ in range(a.input_len)] for _ in range(a.num_prompts)
    ]
    decodes = cycle(a.decode)
    lock = Lock()
    ttft: dict[str, list[float]] = {"router": [], "direct": []}
    failed = {"router": 0, "direct": 0}

    def one(i: int) -> None:
        prompt = prompts[i // 2]
        path = "router" if i % 2 == 0 else "direct"
        try:
            if path == "router":
                t = via_router(a.router, a.model, prompt, a.output_len, a.timeout)
            else:
                with lock:
                    dec = next(decodes)
                t = direct(a.prefill, dec, a.model, prompt, a.output_len, a.timeout)
        except Exception:  # counted; the run goes on
            with lock:
                failed[path] += 1
            return
        with lock:
            ttft[path].append(t * 1000)

    load0 = _loadavg()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.concurrency) as pool:
        list(pool.map(one, range(2 * a.num_prompts)))
    out: dict = {
        "num_prompts": a.num_prompts,
        "concurrency": a.concurrency,
        "duration_s": round(time.perf_counter() - t0, 2),
        "loadavg_before": load0,
        "loadavg_after": _loadavg(),
    }
    for path, vals in ttft.items():
        out[path] = {"ok": len(vals), "failed": failed[path]}
        if vals:
            out[path].update({f"p{p}_ttft_ms": round(_pct(vals, p), 1) for p in (50, 90, 99)})
            out[path]["max_ttft_ms"] = round(max(vals), 1)
            out[path]["mean_ttft_ms"] = round(statistics.fmean(vals), 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
