"""Wall time of `pdlaunch up --no-canary` until every process is healthy, for 1, 8 and 32
network-namespace hosts behind an injected round-trip time; goal (issue 12): wall(32) /
wall(1) <= 1.3.

What is simulated, and why it measures pdlaunch rather than this machine:

* Hosts: ``tests/support/netns/`` namespaces ``pdl-hN`` (10.231.k.(10+N)), each with its own sshd,
  network stack and work dir, one CPU prefill and one CPU decode per host (2N engines), the
  router on host 1: 2N+1 processes.
* Latency: the kernel here has no sch_netem, so ``benchmarks/netns_relay.py`` (its own
  process) relays each host's SSH with RTT/2 per direction (default RTT 50 ms) and one RTT
  before the first byte; the measured SSH round trip is printed before the runs. Health
  probes go straight to the namespace addresses (no delay).
* Engines: a stand-in that sleeps ``--engine-start-s`` (default 1 s) in nanosleep, then
  answers every HTTP request with 200 (``/health`` is all `up --no-canary` needs): a 30-line C
  program built here with ``cc`` (about 0.6 ms CPU per start on this VM), else the same in
  ``python3 -S`` with only ``socket`` (about 10 ms); the script prints which and its measured
  CPU per start. tests/support/fake_vllm.py costs about 22 ms per start and is not needed
  without the canary. So 65 "starting" engines cost almost no CPU, as on a real cluster where
  each host brings its own.
* Like the CLI's `up`, the fast preflight check (check --fast) runs inside `up` unless
  ``--skip-check``.

Reported per N (medians of ``--repeat``, runs interleaved 1, 8, 32, 1, ...): ``healthy_s``
(start of `up` until the router answered /health), ``up_s`` (the whole call), ``preflight_s``,
``down_s``, pdlaunch's own CPU (getrusage of this process during `up`; the relay and the
hosts run elsewhere) in all and per host, the simulated hosts' CPU (their sshd and what it
reaped), and the SSH connections and commands per host per `up`, by kind. Needs root, iproute2,
util-linux and OpenSSH's server (scripts/install.sh).

    sudo .venv/bin/python benchmarks/bench_up.py [--hosts 1,8,32] [--repeat 3] [--rtt-ms 50]
        [--engine-start-s 1] [--skip-check] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
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

from pdlaunch.backends.ssh.runtime import SshRuntime  # noqa: E402
from pdlaunch.check.results import Status  # noqa: E402
from pdlaunch.check.runner import CheckOptions, run_check  # noqa: E402
from pdlaunch.hosts import ConnectOptions  # noqa: E402
from pdlaunch.runtime import lifecycle as launch  # noqa: E402

GOAL = 1.3

STANDIN_C = r"""
/* engine/router stand-in: sleep STANDIN_START_S, then answer every request with 200 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    const char *host = "0.0.0.0"; int port = 0, one = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--host") && i + 1 < argc) host = argv[++i];
        else if (!strcmp(argv[i], "--port") && i + 1 < argc) port = atoi(argv[++i]);
    }
    const char *d = getenv("STANDIN_START_S");
    if (d) {
        double s = atof(d);
        struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
        while (nanosleep(&ts, &ts)) {}
    }
    signal(SIGPIPE, SIG_IGN);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET; a.sin_port = htons(port);
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) return 2;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 128)) return 3;
    static const char r[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                            "Content-Length: 3\r\nConnection: close\r\n\r\nok\n";
    char buf[4096];
    for (;;) {
        int c = accept(fd, 0, 0);
        if (c < 0) continue;
        ssize_t n; size_t got = 0;
        while (got < sizeof buf - 1 && (n = read(c, buf + got, sizeof buf - 1 - got)) > 0) {
            got += n; buf[got] = 0;
            if (strstr(buf, "\r\n\r\n")) break;
        }
        (void)!write(c, r, sizeof r - 1);
        close(c);
    }
}
"""

STANDIN_PY = """\
import os, socket, sys, time
a = sys.argv
host, port = a[a.index("--host") + 1], int(a[a.index("--port") + 1])
time.sleep(float(os.environ.get("STANDIN_START_S", "0")))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port))
s.listen(128)
while True:
    c, _ = s.accept()
    c.recv(4096)
    c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 3\\r\\nConnection: close\\r\\n\\r\\nok\\n")
    c.close()
"""


def build_standin(dest: Path) -> tuple[str, str]:
    """The cheapest stand-in this machine can make: (path, what it is)."""
    dest.mkdir(parents=True, exist_ok=True)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is not None:
        src = dest / "standin.c"
        src.write_text(STANDIN_C)
        exe = dest / "standin"
        res = subprocess.run([cc, "-O2", "-o", str(exe), str(src)], capture_output=True)
        if res.returncode == 0:
            return str(exe), f"C responder ({Path(cc).name})"
    python = shutil.which("python3") or sys.executable
    exe = dest / "standin.py"
    exe.write_text(f"#!{python} -S\n{STANDIN_PY}")
    exe.chmod(0o755)
    return str(exe), f"python3 -S responder ({python})"


def standin_cpu_ms(exe: str, samples: int = 5) -> float:
    """Median CPU (ms) of one stand-in start that answers one /health, measured here."""
    cpu = []
    for _ in range(samples):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(
            [exe, "serve", "m", "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "STANDIN_START_S": "0"},
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    r.read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise SystemExit(f"the stand-in {exe} never answered /health") from None
                time.sleep(0.005)
        os.kill(proc.pid, signal.SIGTERM)
        _, _, ru = os.wait4(proc.pid, 0)
        proc.returncode = 0  # reaped by wait4: keep Popen from waiting again
        cpu.append((ru.ru_utime + ru.ru_stime) * 1000)
    return statistics.median(cpu)


# `up`'s steps (its Reporter messages, by prefix) -> phase names in the report
PHASES = (
    ("checking what already runs", "survey"),
    ("preflight check", "preflight"),
    ("connecting", "connect"),
    ("uploading", "upload"),
    ("starting 1 router", "router"),  # the lifecycle's stages: "starting N <stage> ..."
    ("waiting for router", "router"),
    ("starting", "start"),
    ("waiting", "health"),
)


class StepTimer(launch.Reporter):
    """Times `up`'s steps: each lasts until the next one starts (the last until `up` ends)."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, str]] = []

    def step(self, message: str) -> None:
        name = next((p for prefix, p in PHASES if message.startswith(prefix)), message)
        self.marks.append((time.perf_counter(), name))

    def phases(self, end: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for (t, name), (t_next, _) in zip(self.marks, [*self.marks[1:], (end, "")], strict=True):
            out[name] = out.get(name, 0.0) + t_next - t
        return out


def preflight(plan, connect: ConnectOptions):
    """What the CLI's `up` runs before starting anything (cli/launch.py ``_preflight``): the
    fast check on `up`'s own connected hosts."""

    def run(launch_) -> None:  # the SSH runtime's Launch: its pool is connected
        report = run_check(plan, CheckOptions(fast=True, connect=connect), pool=launch_.pool)
        if report.failed:
            bad = [
                f"{r.probe} {r.target}: {r.message}"
                for r in report.results
                if r.status == Status.FAIL
            ]
            raise launch.LaunchError("preflight check failed: " + "; ".join(bad[:5]))

    return run


def run_one(path: Path, cluster: RelayedCluster, check: bool) -> dict[str, float]:
    plan = load_plan(path)
    steps = StepTimer()
    connect = ConnectOptions(
        known_hosts=str(cluster.known_hosts), ssh_config=str(cluster.ssh_config)
    )
    opts = launch.UpOptions(
        timeout=300,
        canary=False,
        connect=connect,
        stop_grace=5,
        preflight=preflight(plan, connect) if check else None,
    )
    n = len({p.host for p in plan.processes})
    time.sleep(0.3)  # let the sshd reap the previous run's connections (not this run's CPU)
    hosts0, relay0 = cluster.hosts_cpu(n), cluster.relay_cpu()
    with count_ssh() as counts:
        t0, cpu0 = time.perf_counter(), own_cpu()
        result = launch.up(SshRuntime(connect), plan, opts, steps)
        end, cpu_s = time.perf_counter(), own_cpu() - cpu0
        up_s = end - t0
    if not result.changed:
        raise SystemExit(f"up did not start anything: {result.message}")
    time.sleep(0.3)  # let each sshd reap its finished sessions (cutime)
    hosts_cpu = cluster.hosts_cpu(n) - hosts0
    relay_cpu = cluster.relay_cpu() - relay0
    t1 = time.perf_counter()
    launch.down(SshRuntime(connect), plan.deployment, grace=5)  # raises if something is left
    down_s = time.perf_counter() - t1
    return {
        "healthy_s": result.healthy_s,
        "up_s": up_s,
        "down_s": down_s,
        "pdlaunch_cpu_s": cpu_s,
        "pdlaunch_cpu_per_host_s": cpu_s / n,
        "hosts_cpu_s": hosts_cpu,
        "relay_cpu_s": relay_cpu,
        **{f"ssh_{k}_per_host": v for k, v in counts.per_host().items()},
        **{f"phase:{k}_s": v for k, v in steps.phases(end).items()},
    }


def summarize(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    keys = sorted({k for r in runs for k in r})
    return {
        k: {
            "median": statistics.median(r.get(k, 0.0) for r in runs),
            "min": min(r.get(k, 0.0) for r in runs),
            "max": max(r.get(k, 0.0) for r in runs),
        }
        for k in keys
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="1,8,32", help="comma-separated host counts")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float, default=50.0, help="injected round-trip time")
    ap.add_argument("--engine-start-s", type=float, default=1.0, help="stand-in start time")
    ap.add_argument("--skip-check", action="store_true", help="no preflight (up --skip-check)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    say = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr))
    with tempfile.TemporaryDirectory(prefix="bench-up-") as tmp_s:
        tmp = Path(tmp_s)
        os.environ["PDLAUNCH_STATE_DIR"] = str(tmp / "state")
        standin, kind = build_standin(tmp / "bin")
        standin_ms = standin_cpu_ms(standin)
        say(f"stand-in: {kind}, {standin_ms:.1f} ms CPU per start (incl. one /health)")
        python = probe_python(tmp / "py")
        t0 = time.perf_counter()
        with RelayedCluster(max(counts), args.rtt_ms, tmp / "ssh") as cluster:
            say(f"started {max(counts)} namespace hosts in {time.perf_counter() - t0:.1f}s")
            rtt = cluster.measure_rtt()
            for line in rtt_lines(rtt, args.rtt_ms):
                say(line)
            paths = {}
            for n in counts:
                paths[n] = tmp / f"bench-{n}.yaml"
                topo = fanout_topology(
                    n,
                    cluster,
                    tmp,
                    vllm_bin=standin,
                    router_bin=standin,
                    python=python,
                    start_s=args.engine_start_s,
                )
                paths[n].write_text(yaml.safe_dump(topo, sort_keys=False))
            run_one(paths[counts[0]], cluster, not args.skip_check)  # warm-up: imports, caches
            runs: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
            for _ in range(args.repeat):  # interleaved: load from elsewhere hits every N alike
                for n in counts:
                    runs[n].append(run_one(paths[n], cluster, not args.skip_check))
                    r = runs[n][-1]
                    say(f"  {n:3d} host(s): healthy {r['healthy_s']:.2f}s up {r['up_s']:.2f}s")
    results = {n: summarize(runs[n]) for n in counts}
    base = counts[0]

    def med(n: int, key: str) -> float:
        return results[n][key]["median"]

    start_s = args.engine_start_s
    ratios = {
        key: {str(n): med(n, key) / med(base, key) for n in counts} for key in ("healthy_s", "up_s")
    }
    overhead = {
        str(n): (med(n, "healthy_s") - start_s) / (med(base, "healthy_s") - start_s) for n in counts
    }
    report = {
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "repeat": args.repeat,
        "rtt_ms": args.rtt_ms,
        "rtt_measured": rtt,
        "engine_start_s": start_s,
        "preflight": not args.skip_check,
        "standin": {"kind": kind, "cpu_ms_per_start": standin_ms},
        "results": {str(n): results[n] for n in counts},
        "ratios": ratios,
        "ratio_healthy_minus_engine_start": overhead,
        "goal": GOAL,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"\n{'hosts':>5} {'procs':>5} {'healthy s':>16} {'up s':>6} {'check s':>7} "
        f"{'down s':>6} {'pdl CPU s':>9} {'/host':>6} {'hosts CPU':>9} {'floor s':>7} "
        f"{'conn/h':>6} {'cmd/h':>6}"
    )
    for n in counts:
        r = results[n]
        print(
            f"{n:5d} {2 * n + 1:5d} {med(n, 'healthy_s'):6.2f} "
            f"({r['healthy_s']['min']:.2f}-{r['healthy_s']['max']:.2f}) "
            f"{med(n, 'up_s'):6.2f} {med(n, 'phase:preflight_s'):7.2f} {med(n, 'down_s'):6.2f} "
            f"{med(n, 'pdlaunch_cpu_s'):9.2f} {med(n, 'pdlaunch_cpu_per_host_s'):6.3f} "
            f"{med(n, 'hosts_cpu_s'):9.2f} {med(n, 'hosts_cpu_s') / (os.cpu_count() or 1):7.2f} "
            f"{med(n, 'ssh_connections_per_host'):6.1f} "
            f"{med(n, 'ssh_commands_per_host'):6.1f}"
        )
    for n in counts[1:]:
        h, u = ratios["healthy_s"][str(n)], ratios["up_s"][str(n)]
        verdict = "OK" if h <= GOAL else f"ABOVE {GOAL}"
        print(
            f"wall({n})/wall({base}): healthy {h:.2f} ({verdict}, goal <= {GOAL}), up {u:.2f}; "
            f"without the {start_s:g}s engine start: {overhead[str(n)]:.2f}"
        )
    for n in counts:
        phases = {
            k.removeprefix("phase:").removesuffix("_s"): v["median"]
            for k, v in results[n].items()
            if k.startswith("phase:")
        }
        order = ["survey", "preflight", "connect", "upload", "start", "health", "router"]
        print(
            f"phases of up, N={n} (s, medians): "
            + ", ".join(
                f"{k} {v:.2f}"
                for k, v in sorted(phases.items(), key=lambda kv: [*order, kv[0]].index(kv[0]))
            )
        )
    for n in (counts[0], counts[-1]):
        kinds = {
            k.removeprefix("ssh_cmd:").removesuffix("_per_host"): v["median"]
            for k, v in results[n].items()
            if k.startswith("ssh_cmd:")
        }
        print(
            f"SSH commands per host per up, N={n} (mean over hosts; router on host 1): "
            + ", ".join(f"{k} {v:.2f}" for k, v in kinds.items())
        )
    la = os.getloadavg()
    print(
        f"engine stand-in: {kind}, {standin_ms:.1f} ms CPU per start; relay CPU "
        f"{med(counts[-1], 'relay_cpu_s'):.2f}s per up at N={counts[-1]}; {os.cpu_count()} CPUs, "
        f"load average {la[0]:.1f} {la[1]:.1f} {la[2]:.1f}"
    )


if __name__ == "__main__":
    main()
