"""A stand-in for `vllm bench serve` (the benchmark client `pdlaunch bench` runs): it writes
the result file the real client writes (the keys parse_result needs), ``--num-prompts``
requests all completed, plus what it saw (offline/proxy env, cwd, argv); it chatters on
stdout, which must not end up in the result. ``$BENCH_RAN``, when set, is touched (so
loopback engines can serve "after" metrics once it ran); ``$FAKE_MODE`` makes it fail
(exit 3), write nothing, or hang."""

FAKE_VLLM = r"""#!/bin/sh
dir=""; n=0
for a in "$@"; do
  if [ "$prev" = "--result-dir" ]; then dir="$a"; fi
  if [ "$prev" = "--num-prompts" ]; then n="$a"; fi
  prev="$a"
done
echo "fake vllm: $*"
case "$FAKE_MODE" in
  fail) echo "boom: the router said no" >&2; exit 3 ;;
  silent) exit 0 ;;
  slow) sleep 30 ;;
esac
if [ -n "$BENCH_RAN" ]; then touch "$BENCH_RAN"; fi
cat > "$dir/bench.json" <<EOF
{"completed": $n, "failed": 0, "duration": 1.5, "mean_ttft_ms": 10.0, "p99_ttft_ms": 20.0,
 "request_throughput": 2.0, "output_throughput": 30.0, "total_token_throughput": 90.0,
 "seen_offline": "${HF_HUB_OFFLINE-unset}", "seen_proxy": "${http_proxy-unset}",
 "seen_cwd": "$(pwd)", "seen_argv": "$*"}
EOF
"""
