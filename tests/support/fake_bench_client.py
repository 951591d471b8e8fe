"""A stand-in for `vllm bench serve` (the benchmark client `pdlaunch bench` runs): it touches
``$BENCH_RAN`` (so loopback engines can serve "after" metrics once it ran) and writes the
result file the real client writes, ``--num-prompts`` requests all completed."""

FAKE_VLLM = r"""#!/bin/sh
dir=""; n=0
for a in "$@"; do
  if [ "$prev" = "--result-dir" ]; then dir="$a"; fi
  if [ "$prev" = "--num-prompts" ]; then n="$a"; fi
  prev="$a"
done
touch "$BENCH_RAN"
cat > "$dir/bench.json" <<EOF
{"completed": $n, "failed": 0, "duration": 1.5, "mean_ttft_ms": 10.0, "p99_ttft_ms": 20.0,
 "request_throughput": 2.0, "output_throughput": 30.0, "total_token_throughput": 90.0}
EOF
"""
