"""Wall time of `pdlaunch up` until every process is healthy, for 1, 8 and 32 simulated hosts
reached through real sshd; target (issue 3): wall(32) / wall(1) <= 1.5.

Each simulated host is its own sshd on its own loopback address (127.0.0.2, 127.0.0.3, ...:
all of 127.0.0.0/8 is loopback on Linux), forced over SSH in the topology
(``hosts: {ADDR: {local: false, ssh: {...}}}``), and runs one prefill and one decode of the
fake engine (tests/launch/fake_vllm.py), so N hosts = N prefill + N decode processes; the
router (tests/launch/fake_router.py, same flags as vllm-router) runs on the control host.
Needs OpenSSH's server (``apt-get install openssh-server``).

    python benchmarks/bench_up.py [--hosts 1,8,32] [--repeat 3] [--canary] [--json]

Reported per N: the median (and min/max) of the time from the start of `up` until the last
process (router included) answered /health (``healthy_s``) and of the whole `up` call
(``up_s``: + canary when ``--canary``), `down` time, and pdlaunch's own CPU time during `up`
(``control_cpu_s``: what grows with N on a real cluster, where each host brings its own CPUs;
here every simulated host's sshd and engines share this machine's CPUs). Each run is followed
by a `down`.
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

import yaml  # noqa: E402

from pdlaunch import launch  # noqa: E402
from pdlaunch.load import load  # noqa: E402
from pdlaunch.plan import build_plan  # noqa: E402
from pdlaunch.rules import has_errors, validate  # noqa: E402
from tests.sshd import SshdCluster, SshdHost, free_port  # noqa: E402

FAKES = ROOT / "tests" / "launch"


class LoopbackCluster(SshdCluster):
    """SshdCluster whose host i listens on 127.0.0.(i+2) instead of 127.0.0.1, so that
    hosts have distinct addresses (the topology keys hosts by address)."""

    def _prepare(self, index: int) -> SshdHost:
        h = super()._prepare(index)
        h.host = f"127.0.0.{index + 2}"
        h.port = free_port(h.host)
        self._write_config(h)
        return h


def install_fake(src: Path, dest: Path) -> str:
    body = src.read_text().split("\n", 1)[1]
    dest.write_text(f"#!{sys.executable} -S\n{body}")  # -S: no site-packages, faster
    dest.chmod(0o755)
    return str(dest)


def topology(n: int, cluster: LoopbackCluster, tmp: Path, bins: dict[str, str]) -> dict:
    hosts = cluster.hosts[:n]
    router_port = free_port()

    # Distinct ports although the addresses differ: the port-conflict rule treats every
    # loopback address as one machine ("localhost"), as it must for bind 0.0.0.0.
    def inst(h: SshdHost, port: int, side: int) -> dict:
        return {
            "host": h.host,
            "device": "cpu",
            "port": port,
            "bind": h.host,
            "side_channel_port": side,
        }

    return {
        "deployment": f"bench-up-{n}",
        "model": {"name": "fake-model"},
        "defaults": {"work_dir": str(tmp / "work"), "vllm_bin": bins["vllm"]},
        "hosts": {
            h.host: {
                "local": False,
                "ssh": {"user": cluster.user, "port": h.port, "key": str(cluster.key_file)},
            }
            for h in hosts
        },
        "prefill": [inst(h, 20100 + i, 22100 + i) for i, h in enumerate(hosts)],
        "decode": [inst(h, 21100 + i, 23100 + i) for i, h in enumerate(hosts)],
        "router": {
            "host": "127.0.0.1",
            "bind": "127.0.0.1",
            "port": router_port,
            "binary": bins["router"],
        },
    }


def run_one(path: Path, known_hosts: str, canary: bool) -> dict[str, float]:
    topo, source = load(path)
    findings = validate(topo, source)
    assert not has_errors(findings), [f.message for f in findings if f.severity == "error"]
    plan = build_plan(topo)
    opts = launch.UpOptions(timeout=300, canary=canary, known_hosts=known_hosts, stop_grace=5)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    result = launch.up(plan, opts)
    up_s = time.perf_counter() - t0
    control_cpu_s = time.process_time() - cpu0  # pdlaunch's own CPU (all threads)
    assert result.changed, result.message
    t1 = time.perf_counter()
    launch.down(plan.deployment, known_hosts=known_hosts, grace=5)
    down_s = time.perf_counter() - t1
    return {
        "healthy_s": result.healthy_s,
        "up_s": up_s,
        "down_s": down_s,
        "control_cpu_s": control_cpu_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="1,8,32", help="comma-separated host counts")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--canary", action="store_true", help="include the canary in up_s")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    results: dict[int, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-up-") as tmp_s:
        tmp = Path(tmp_s)
        os.environ["PDLAUNCH_STATE_DIR"] = str(tmp / "state")
        bins = {
            "vllm": install_fake(FAKES / "fake_vllm.py", tmp / "fake-vllm"),
            "router": install_fake(FAKES / "fake_router.py", tmp / "fake-router"),
        }
        with LoopbackCluster(tmp / "sshd") as cluster:
            t0 = time.perf_counter()
            cluster.start(max(counts))
            if not args.json:
                print(
                    f"started {max(counts)} sshd in {time.perf_counter() - t0:.1f}s",
                    file=sys.stderr,
                )
            for n in counts:
                path = tmp / f"bench-{n}.yaml"
                path.write_text(yaml.safe_dump(topology(n, cluster, tmp, bins), sort_keys=False))
                runs = [
                    run_one(path, str(cluster.known_hosts), args.canary) for _ in range(args.repeat)
                ]
                results[n] = {
                    key: {
                        "median": statistics.median(r[key] for r in runs),
                        "min": min(r[key] for r in runs),
                        "max": max(r[key] for r in runs),
                    }
                    for key in runs[0]
                }
                if not args.json:
                    r = results[n]
                    print(
                        f"{n:3d} host(s), {2 * n + 1:3d} processes: healthy "
                        f"{r['healthy_s']['median']:.2f}s (min {r['healthy_s']['min']:.2f}, "
                        f"max {r['healthy_s']['max']:.2f})  up {r['up_s']['median']:.2f}s  "
                        f"down {r['down_s']['median']:.2f}s  "
                        f"pdlaunch cpu {r['control_cpu_s']['median']:.2f}s",
                        file=sys.stderr,
                    )
    base = results[counts[0]]["healthy_s"]["median"]
    ratios = {n: results[n]["healthy_s"]["median"] / base for n in counts}
    report = {
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "repeat": args.repeat,
        "canary": args.canary,
        "results": {str(n): results[n] for n in counts},
        "ratio_healthy_vs_first": {str(n): round(r, 3) for n, r in ratios.items()},
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for n in counts[1:]:
            print(f"wall({n})/wall({counts[0]}) = {ratios[n]:.2f}")
        la = os.getloadavg()
        print(
            f"({os.cpu_count()} CPUs, load average {la[0]:.1f} {la[1]:.1f} {la[2]:.1f}: every "
            "simulated host's sshd and engines share them)"
        )


if __name__ == "__main__":
    main()
