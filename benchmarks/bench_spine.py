"""Validate and render a generated topology of N instances; print the wall time of each
stage. Target (issue 2): N=1000 under 1 s on the 2-core CI machine.

    python benchmarks/bench_spine.py [--instances 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

from pdlaunch.load import load
from pdlaunch.plan import build_plan
from pdlaunch.render import render_plan, write_files
from pdlaunch.rules import has_errors, validate


def generate(instances: int) -> dict:
    """Half prefill, half decode; 8 GPUs per host, TP 2 -> 4 instances per host."""

    def inst(i: int) -> dict:
        host, slot = divmod(i, 4)
        return {
            "host": f"10.{host // 250}.{host % 250}.1",
            "device": "cuda",
            "port": 8000 + slot,
            "tp": 2,
            "devices": [2 * slot, 2 * slot + 1],
            # Every instance's flags and env go through the parser facts (unknown-flag,
            # managed-flag, flag-override, managed-env, unknown-env).
            "extra_args": ["--max-num-seqs=8", "--max-num-batched-tokens", "16384"],
            "env": {"NCCL_SOCKET_IFNAME": "eth0", "VLLM_USE_NCCL_SYMM_MEM": "1"},
        }

    half = instances // 2
    return {
        "deployment": "bench",
        "model": {"name": "Qwen/Qwen3-0.6B"},
        "defaults": {
            "extra_args": [
                "--enable-expert-parallel",
                "--no-enable-chunked-prefill",
                "--compilation_config.pass_config.fuse_allreduce_rms=true",
                "--async-scheduling",
            ],
            "env": {"NCCL_TIMEOUT": "1800", "VLLM_SKIP_P2P_CHECK": "1"},
        },
        "prefill": [inst(i) for i in range(half)],
        "decode": [inst(i) for i in range(half, instances)],
        "router": {"host": "10.255.255.1"},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.yaml"
        path.write_text(yaml.safe_dump(generate(args.instances), sort_keys=False))
        t0 = time.perf_counter()
        topo, source = load(path)
        t1 = time.perf_counter()
        findings = validate(topo, source)
        assert not has_errors(findings), findings[:3]
        t2 = time.perf_counter()
        plan = build_plan(topo)
        t3 = time.perf_counter()
        files = render_plan(plan)
        write_files(files, Path(tmp) / "out")
        t4 = time.perf_counter()
    result = {
        "instances": args.instances,
        "load_s": round(t1 - t0, 3),
        "validate_s": round(t2 - t1, 3),
        "plan_s": round(t3 - t2, 3),
        "render_s": round(t4 - t3, 3),
        "total_s": round(t4 - t0, 3),
        "files": len(files),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:12} {value}")


if __name__ == "__main__":
    main()
