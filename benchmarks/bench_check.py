"""`pdlaunch check` over 1 and 16 simulated hosts (real sshd processes on loopback).

    python benchmarks/bench_check.py [--hosts 1,16] [--repeat 5] [--python system|bare]

Each simulated host is its own sshd (tests/sshd.py), with its own host key and home, all on
127.0.0.1. The topology: N=1 puts prefill, decode and router on one host; N>1 puts N/2 CPU
prefill instances and N/2 CPU decode instances on their own hosts (router on the first), so
the pair probes grow with N (every decode host reaches every prefill side channel). Each run
is a whole `pdlaunch check` (connect, every probe, every pair, cluster comparison) through
:func:`pdlaunch.check.runner.run_check`, exactly what the CLI does. Runs are interleaved
(1, 16, 1, 16, ...); prints median and best wall time per N and wall(N_max)/wall(1);
the issue asks for wall(16)/wall(1) <= 1.5.

The simulation shares this machine's CPUs between all "hosts" (real hosts bring their own), so
CPU-heavy per-host work shows up here and not in a real cluster. ``--python bare`` (default)
runs the version probe with an interpreter that skips site-packages (the probe needs only the
stdlib plus the package metadata it reads); ``--python system`` uses this interpreter with
its full site-packages.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pdlaunch.check.runner import CheckOptions, run_check  # noqa: E402
from pdlaunch.load import load  # noqa: E402
from pdlaunch.plan import build_plan  # noqa: E402
from pdlaunch.rules import has_errors, validate  # noqa: E402
from tests.sshd import SshdCluster, free_port  # noqa: E402

_USED: set[int] = set()


def new_port() -> int:
    """A free port not handed out before in this run."""
    while True:
        port = free_port()
        if port not in _USED:
            _USED.add(port)
            return port


def make_python(root: Path, mode: str) -> str:
    if mode == "system":
        return sys.executable
    site = root / "site"
    for dist, ver in (("vllm", "0.32.0"), ("nixl", "0.7.1")):
        info = site / f"{dist}-{ver}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {ver}\n")
    py = root / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    py.chmod(0o755)
    return str(py)


def hosts_cpu(cluster: SshdCluster) -> float:
    """CPU seconds used so far by the simulated hosts: each sshd and everything it reaped
    (connections, sessions, the probe commands)."""
    total = 0
    for h in cluster.hosts:
        with open(f"/proc/{h.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def topology(n: int, hosts, cluster: SshdCluster, model: Path, python: str) -> dict:
    def ssh(h) -> dict:
        return {"port": h.port, "user": cluster.user, "key": str(cluster.key_file)}

    def inst(h) -> dict:
        return {
            "host": "127.0.0.1",
            "device": "cpu",
            "port": new_port(),
            "side_channel_port": new_port(),
            "ssh": ssh(h),
        }

    if n == 1:
        prefill, decode = [inst(hosts[0])], [inst(hosts[0])]
    else:
        half = n // 2
        prefill = [inst(h) for h in hosts[:half]]
        decode = [inst(h) for h in hosts[half:n]]
    # one instance per host needs its own cores for the CPU binding rule
    for i, x in enumerate(prefill + decode):
        x["devices"] = [i % (os.cpu_count() or 1)]
    return {
        "deployment": f"bench-check-{n}",
        "model": {"name": str(model)},
        "hosts": {"127.0.0.1": {"local": False}},
        "defaults": {"ssh": ssh(hosts[0]), "env": {"PDLAUNCH_PYTHON": python}},
        "prefill": prefill,
        "decode": decode,
        "router": {"host": "127.0.0.1", "port": new_port()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="1,16", help="comma separated host counts")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--python", choices=("bare", "system"), default="bare")
    args = ap.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    print(f"cpus: {os.cpu_count()}, python for the versions probe: {args.python}")
    with (
        tempfile.TemporaryDirectory(prefix="pdl-bench-check-") as tmp,
        SshdCluster(Path(tmp) / "sshd") as cluster,
    ):
        root = Path(tmp)
        model = root / "model"
        model.mkdir()
        (model / "config.json").write_text("{}")
        python = make_python(root / "py", args.python)
        t = time.monotonic()
        hosts = cluster.start(max(counts))
        print(f"started {len(hosts)} sshd hosts in {time.monotonic() - t:.1f}s")
        plans = {}
        for n in counts:
            path = root / f"topology-{n}.yaml"
            path.write_text(yaml.safe_dump(topology(n, hosts, cluster, model, python)))
            topo, source = load(path)
            findings = validate(topo, source)
            if has_errors(findings):
                raise SystemExit("\n".join(f.message for f in findings))
            plans[n] = build_plan(topo)
        opts = CheckOptions(known_hosts=str(cluster.known_hosts))
        walls: dict[int, list[float]] = {n: [] for n in counts}
        cpu: dict[int, list[float]] = {n: [] for n in counts}
        reports = {}
        for n in counts:
            run_check(plans[n], opts)  # warm-up (imports, page cache, sshd first fork)
        # interleaved, so that load from elsewhere on the machine hits every N alike
        for _ in range(args.repeat):
            for n in counts:
                c0, t = hosts_cpu(cluster), time.monotonic()
                reports[n] = run_check(plans[n], opts)
                walls[n].append(time.monotonic() - t)
                time.sleep(0.5)  # let each sshd reap its finished connections (cutime)
                cpu[n].append(hosts_cpu(cluster) - c0)
        for n in counts:
            report, c = reports[n], reports[n].counts()
            unreachable = [h.label for h in report.hosts if not h.reachable]
            if unreachable:
                raise SystemExit(f"unreachable simulated hosts: {unreachable}")
            print(
                f"N={n:>2}: hosts={len(report.hosts):>2} pairs={len(report.pairs):>3} "
                f"rows={len(report.results):>4} ({c['OK']} OK, {c['WARN']} WARN, "
                f"{c['FAIL']} FAIL, {c['SKIP']} SKIP)  wall median "
                f"{statistics.median(walls[n]):.3f}s min {min(walls[n]):.3f}s "
                f"[{', '.join(f'{w:.2f}' for w in walls[n])}]"
            )
            hc = statistics.median(cpu[n])
            print(
                f"      simulated hosts' CPU per run {hc:.2f}s ({hc / n:.3f}s per host): "
                f"on {os.cpu_count()} shared core(s) no run can finish in less than "
                f"{hc / (os.cpu_count() or 1):.2f}s"
            )
        if len(counts) > 1:
            lo, hi = min(counts), max(counts)
            med = statistics.median(walls[hi]) / statistics.median(walls[lo])
            best = min(walls[hi]) / min(walls[lo])
            verdict = "OK" if med <= 1.5 else "ABOVE 1.5"
            print(
                f"wall({hi})/wall({lo}) = {med:.2f} (medians; {verdict}, target <= 1.5), "
                f"{best:.2f} (best runs)"
            )
        print(f"load average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
