"""Wall time of `pdlaunch check --fast` over 1, 8 and 32 network-namespace hosts behind an
injected round-trip time; goal (issue 12): wall(32) / wall(1) <= 1.3.

The hosts, the relay (RTT/2 per direction, default RTT 50 ms, in user space: this kernel has
no sch_netem) and the topology are those of bench_up.py (``benchmarks/netns_relay.py``): N
hosts with one CPU prefill and one CPU decode each, the router on host 1, so the reachability
pairs grow as N^2 (every decode host dials every prefill side channel, the router every HTTP
port). Each run is one whole check (connect, one batch of probes per host, cluster
comparison) through :func:`pdlaunch.check.runner.run_check`, as the CLI's `check --fast`
and `up`'s preflight run it. The version and reachability probes run a Python without
site-packages that sees vLLM 0.32.0 and NIXL metadata only (``probe_python``).

Reported per N (medians of ``--repeat``, runs interleaved 1, 8, 32, 1, ...): wall time,
pdlaunch's own CPU (getrusage of this process during the check; the relay and the hosts
run elsewhere) in all and per host, the simulated hosts' CPU (each sshd and what it reaped:
sessions, probe commands; on 2 shared cores no run can be faster than half of it), and SSH
connections and commands per host. Needs root, iproute2, util-linux and OpenSSH's server.

    sudo .venv/bin/python benchmarks/bench_check.py [--hosts 1,8,32] [--repeat 3]
        [--rtt-ms 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import yaml  # noqa: E402
from netns_relay import (  # noqa: E402
    RelayedCluster,
    count_ssh,
    fanout_topology,
    load_plan,
    own_cpu,
    probe_python,
    rtt_lines,
)

from pdlaunch.check.runner import CheckOptions, CheckReport, run_check  # noqa: E402
from pdlaunch.hosts import ConnectOptions  # noqa: E402

GOAL = 1.3


def run_one(plan, opts: CheckOptions, cluster: RelayedCluster) -> tuple[dict, CheckReport]:
    n = len({p.host for p in plan.processes})
    time.sleep(0.3)  # let the sshd reap the previous run's connections (not this run's CPU)
    hosts0 = cluster.hosts_cpu(n)
    with count_ssh() as counts:
        t0, cpu0 = time.perf_counter(), own_cpu()
        report = run_check(plan, opts)
        wall, cpu = time.perf_counter() - t0, own_cpu() - cpu0
    time.sleep(0.3)  # let each sshd reap its finished sessions (cutime)
    return {
        "wall_s": wall,
        "pdlaunch_cpu_s": cpu,
        "pdlaunch_cpu_per_host_s": cpu / n,
        "hosts_cpu_s": cluster.hosts_cpu(n) - hosts0,
        **{f"ssh_{k}_per_host": v for k, v in counts.per_host().items()},
    }, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="1,8,32", help="comma-separated host counts")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float, default=50.0, help="injected round-trip time")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr))
    runs: dict[int, list[dict]] = {n: [] for n in counts}
    reports: dict[int, CheckReport] = {}
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp_s:
        tmp = Path(tmp_s)
        python = probe_python(tmp / "py")
        t0 = time.perf_counter()
        with RelayedCluster(max(counts), args.rtt_ms, tmp / "ssh") as cluster:
            say(f"started {max(counts)} namespace hosts in {time.perf_counter() - t0:.1f}s")
            rtt = cluster.measure_rtt()
            for line in rtt_lines(rtt, args.rtt_ms):
                say(line)
            plans = {}
            for n in counts:
                path = tmp / f"check-{n}.yaml"
                topo = fanout_topology(
                    n,
                    cluster,
                    tmp,
                    vllm_bin="vllm",
                    router_bin="vllm-router",
                    python=python,
                    start_s=0,
                )
                path.write_text(yaml.safe_dump(topo, sort_keys=False))
                plans[n] = load_plan(path)
            connect = ConnectOptions(
                known_hosts=str(cluster.known_hosts), ssh_config=str(cluster.ssh_config)
            )
            opts = CheckOptions(fast=True, connect=connect)
            for n in counts:
                run_one(plans[n], opts, cluster)  # warm-up: imports, page cache, first forks
            for _ in range(args.repeat):  # interleaved: load from elsewhere hits every N alike
                for n in counts:
                    r, reports[n] = run_one(plans[n], opts, cluster)
                    runs[n].append(r)
                    say(f"  {n:3d} host(s): {r['wall_s']:.2f}s")
    for n in counts:
        bad = [h.label for h in reports[n].hosts if not h.reachable]
        if bad:
            raise SystemExit(f"unreachable namespace hosts: {bad}")

    def med(n: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[n])

    base = counts[0]
    ratios = {str(n): med(n, "wall_s") / med(base, "wall_s") for n in counts}
    results = {
        str(n): {
            "hosts": len(reports[n].hosts),
            "pairs": len(reports[n].pairs),
            "rows": len(reports[n].results),
            "counts": reports[n].counts(),
            "walls_s": [r["wall_s"] for r in runs[n]],
            **{k: med(n, k) for k in runs[n][0]},
        }
        for n in counts
    }
    report = {
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "repeat": args.repeat,
        "rtt_ms": args.rtt_ms,
        "rtt_measured": rtt,
        "results": results,
        "ratio_wall_vs_first": ratios,
        "goal": GOAL,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"\n{'hosts':>5} {'pairs':>5} {'rows':>5} {'wall s':>16} {'pdl CPU s':>9} "
        f"{'/host':>6} {'hosts CPU':>9} {'floor s':>7} {'conn/h':>6} {'cmd/h':>6}  result"
    )
    for n in counts:
        r, walls, c = results[str(n)], [x["wall_s"] for x in runs[n]], reports[n].counts()
        print(
            f"{n:5d} {r['pairs']:5d} {r['rows']:5d} {r['wall_s']:6.2f} "
            f"({min(walls):.2f}-{max(walls):.2f}) {r['pdlaunch_cpu_s']:9.2f} "
            f"{r['pdlaunch_cpu_per_host_s']:6.3f} {r['hosts_cpu_s']:9.2f} "
            f"{r['hosts_cpu_s'] / (os.cpu_count() or 1):7.2f} "
            f"{r['ssh_connections_per_host']:6.1f} {r['ssh_commands_per_host']:6.1f}  "
            f"{c['OK']} OK, {c['WARN']} WARN, {c['FAIL']} FAIL, {c['SKIP']} SKIP"
        )
    for n in counts[1:]:
        verdict = "OK" if ratios[str(n)] <= GOAL else f"ABOVE {GOAL}"
        print(f"wall({n})/wall({base}) = {ratios[str(n)]:.2f} ({verdict}, goal <= {GOAL})")
    la = os.getloadavg()
    print(
        f"floor: the simulated hosts' CPU over {os.cpu_count()} shared CPUs; load average "
        f"{la[0]:.1f} {la[1]:.1f} {la[2]:.1f}"
    )


if __name__ == "__main__":
    main()
