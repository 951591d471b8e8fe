"""Validate and render a generated topology of N instances; print the wall time of each
stage, and its CPU time (what to compare on a busy machine). Target (issues 2, 24): N=1000
under 1 s on the 2-core CI machine. With --repeat, each stage's minimum over the runs (each
run loads the file afresh in the same process).

    python benchmarks/bench_spine.py [--instances 1000] [--repeat 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

from pdlaunch.plan.build import build_plan
from pdlaunch.plan.render import render_plan, write_files
from pdlaunch.rules import has_errors, validate
from pdlaunch.spec.load import load


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


STAGES = ("load", "validate", "plan", "render")


def run_once(path: Path, out: Path) -> tuple[dict[str, float], dict[str, float], int]:
    """Wall and CPU seconds of each stage, and the number of files rendered."""
    marks = [(time.perf_counter(), time.process_time())]
    topo, source = load(path)
    marks.append((time.perf_counter(), time.process_time()))
    findings = validate(topo, source)
    assert not has_errors(findings), findings[:3]
    marks.append((time.perf_counter(), time.process_time()))
    plan = build_plan(topo)
    marks.append((time.perf_counter(), time.process_time()))
    files = render_plan(plan)
    write_files(files, out)
    marks.append((time.perf_counter(), time.process_time()))
    wall = {s: marks[i + 1][0] - marks[i][0] for i, s in enumerate(STAGES)}
    cpu = {s: marks[i + 1][1] - marks[i][1] for i, s in enumerate(STAGES)}
    return wall, cpu, len(files)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.yaml"
        path.write_text(yaml.safe_dump(generate(args.instances), sort_keys=False))
        for i in range(max(1, args.repeat)):
            runs.append(run_once(path, Path(tmp) / f"out{i}"))
    result: dict = {"instances": args.instances, "repeat": len(runs)}
    for key, which in (("", 0), ("cpu_", 1)):
        for stage in STAGES:
            result[f"{key}{stage}_s"] = round(min(r[which][stage] for r in runs), 3)
        result[f"{key}total_s"] = round(min(sum(r[which].values()) for r in runs), 3)
    result["files"] = runs[0][2]
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:14} {value}")


if __name__ == "__main__":
    main()
