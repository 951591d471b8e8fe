"""Network-namespace hosts behind a user-space latency relay, for the fan-out benchmarks.

This machine's kernel has no sch_netem (``# CONFIG_NET_SCH_NETEM is not set``: ``tc qdisc add
... netem`` fails), so nothing in the kernel can hold packets back. Latency is added in user
space instead: one asyncio TCP relay process listens, per namespace host, on the control
address (10.231.k.1:PORT) and forwards to that host's sshd (10.231.k.(10+N):22), delaying every
chunk by RTT/2 in each direction and the first byte by one RTT (the TCP handshake a real
connection pays before anything flows). The topology reaches each host's sshd through its
relay: the host's address stays the namespace address (engines bind it, health probes go to
it directly, without delay), and an ssh_config stanza ``Host 10.231.k.(10+N) / HostName
10.231.k.1 / Port PORT`` plus a known_hosts line ``[10.231.k.1]:PORT`` route SSH to the relay.

The relay is its own process, so its CPU never counts as the benchmark's (pdlaunch's) own::

    python benchmarks/netns_relay.py --delay-ms 25 --listen 10.231.0.1 10.231.0.11:22 ...

prints one JSON line ``{"ports": [...]}`` (one listening port per target, in order) once it
listens, and exits when its stdin closes or on SIGTERM. :class:`RelayedCluster` starts a
:class:`tests.support.netns.NetnsCluster` and the relay, writes the SSH files, measures the injected
round trip (:meth:`RelayedCluster.measure_rtt`) and reports the simulated hosts' CPU.
:func:`count_ssh` counts SSH connections and commands per host while pdlaunch runs.

One limit of the simulation is raised while a cluster lives, by tests/support/netns/: Linux has one
ARP table for all network namespaces together (``gc_thresh3`` 1024 by default), and 32 hosts
that all dial each other need ~1,056 entries, so without it `check` saw ~40 of the 1,024
side-channel pairs time out (see ``tests.support.netns.arp_limits_needed``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# ------------------------------------------------------------------------------ the relay


async def _forward(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay: float,
    peer: asyncio.StreamWriter,
) -> None:
    """Copy ``reader`` to ``writer``, each chunk (and the EOF) ``delay`` s after it arrived;
    order is kept, so a chunk never overtakes an earlier one. A reset on either side closes
    both (``peer`` is the writer back towards ``reader``), as a dropped connection would."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                break
        await sender
    except OSError:
        writer.close()
        peer.close()
    finally:
        sender.cancel()


def _nodelay(writer: asyncio.StreamWriter) -> None:
    # without it, Nagle + delayed ACKs would add up to 40 ms of their own to small SSH packets
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _relay(listen: str, targets: list[tuple[str, int]], delay: float) -> None:
    live: set[asyncio.Task] = set()  # asyncio holds tasks weakly: a reset one would vanish

    async def handle(
        target: tuple[str, int], c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter
    ) -> None:
        # the kernel completed the client's handshake at once: hold everything one RTT, as
        # a real SYN / SYN-ACK exchange would before the first byte
        await asyncio.sleep(2 * delay)
        try:
            u_reader, u_writer = await asyncio.open_connection(*target)
        except OSError:
            c_writer.close()
            return
        _nodelay(c_writer)
        _nodelay(u_writer)
        try:
            await asyncio.gather(
                _forward(c_reader, u_writer, delay, c_writer),
                _forward(u_reader, c_writer, delay, u_writer),
                return_exceptions=True,
            )
        finally:
            for w in (c_writer, u_writer):
                w.close()

    servers = []
    for target in targets:

        async def on_connect(r, w, target=target) -> None:
            task = asyncio.current_task()
            assert task is not None
            live.add(task)
            try:
                await handle(target, r, w)
            except asyncio.CancelledError:  # at shutdown
                pass
            finally:
                live.discard(task)

        servers.append(await asyncio.start_server(on_connect, listen, 0, backlog=512))
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    sys.stdout.write(json.dumps({"ports": ports}) + "\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))

    def on_stdin() -> None:
        # stdin closing means the benchmark is gone (even after a kill -9): stop with it
        if not os.read(0, 4096):
            loop.remove_reader(0)
            if not stop.done():
                stop.set_result(None)

    loop.add_reader(0, on_stdin)
    await stop
    for s in servers:
        s.close()


def relay_main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="TCP relay that delays each direction")
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way delay (RTT/2)")
    ap.add_argument("--listen", required=True, help="address to listen on (ephemeral ports)")
    ap.add_argument("targets", nargs="+", help="ADDRESS:PORT to forward to, one port each")
    args = ap.parse_args(argv)
    targets = [(t.rsplit(":", 1)[0], int(t.rsplit(":", 1)[1])) for t in args.targets]
    asyncio.run(_relay(args.listen, targets, args.delay_ms / 1000.0))


# ------------------------------------------------------------------------------ counting


@dataclass
class SshCounts:
    """SSH connections opened and commands run, per host address, while :func:`count_ssh`
    was active; a command is labelled with the Host method that ran it."""

    connections: collections.Counter = field(default_factory=collections.Counter)
    commands: dict[str, collections.Counter] = field(default_factory=dict)

    def per_host(self) -> dict[str, float]:
        """Mean connections and commands per host, and the mean per command kind."""
        hosts = sorted(set(self.connections) | set(self.commands)) or [""]
        n = len(hosts)
        kinds: collections.Counter = collections.Counter()
        for c in self.commands.values():
            kinds.update(c)
        out = {
            "connections": sum(self.connections.values()) / n,
            "commands": sum(kinds.values()) / n,
        }
        out.update({f"cmd:{k}": v / n for k, v in sorted(kinds.items())})
        return out


_INNER = {"_exec_start", "_proc_stat", "_exec"}
# what a Host method was called for, where the method name alone does not say
_LABELS = {
    "run<-run_jobs": "check-batch",
    "run<-release_one": "check-release-ports",
    "open_stream<-one": "check-hold-ports",
    "find_tracked": "survey",
}


@contextlib.contextmanager
def count_ssh() -> Iterator[SshCounts]:
    """Count what pdlaunch's SshHost does (its real methods still run; only a counter is
    added around ``_connect``, ``_exec``, through which every host command goes, and
    ``_open_stream``, which runs a command whose output is read as it comes)."""
    from pdlaunch.hosts.ssh import SshHost

    counts = SshCounts()
    lock = threading.Lock()
    real_exec, real_connect, real_stream = SshHost._exec, SshHost._connect, SshHost._open_stream

    def caller(depth: int) -> str:
        """The Host method ``depth`` frames up (past private helpers), with who called it
        where the method alone does not say what for."""
        f = sys._getframe(depth)
        while f is not None and f.f_code.co_name in _INNER:
            f = f.f_back
        if f is None:
            return "?"
        name = f.f_code.co_name
        if name in ("run", "open_stream") and f.f_back is not None:
            name = f"{name}<-{f.f_back.f_code.co_name}"
        return _LABELS.get(name, name)

    def exec_(self, command, **kw):
        label = caller(2)
        with lock:
            counts.commands.setdefault(self.name, collections.Counter())[label] += 1
        return real_exec(self, command, **kw)

    def stream_(self, command):
        label = caller(2)
        with lock:
            counts.commands.setdefault(self.name, collections.Counter())[label] += 1
        return real_stream(self, command)

    def connect_(self):
        with lock:
            counts.connections[self.name] += 1
        return real_connect(self)

    SshHost._exec, SshHost._connect, SshHost._open_stream = exec_, connect_, stream_
    try:
        yield counts
    finally:
        SshHost._exec, SshHost._connect, SshHost._open_stream = (
            real_exec,
            real_connect,
            real_stream,
        )


# ------------------------------------------------------------------------------ the topology


def probe_python(root: Path) -> str:
    """An interpreter for check's version/reach probes on the hosts: this Python without
    site-packages (a few ms, like a node's venv would take with a warm page cache) that sees
    only vLLM 0.32.0 and NIXL metadata, so the versions probe has something to compare."""
    site = root / "site"
    for dist, ver in (("vllm", "0.32.0"), ("nixl", "0.7.1")):
        info = site / f"{dist}-{ver}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {ver}\n")
    py = root / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    py.chmod(0o755)
    return str(py)


def fanout_topology(
    n: int,
    cluster: RelayedCluster,
    root: Path,
    *,
    vllm_bin: str,
    router_bin: str,
    python: str,
    start_s: float,
) -> dict:
    """N namespace hosts, each with one CPU prefill and one CPU decode (2N engines), the
    router on host 1; every host reached over SSH through its relay, with its own work dir
    (real hosts do not share a file system). Same ports on every host: they are different
    machines. ``start_s``: how long each engine stand-in sleeps before it listens."""
    model = root / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    hosts = cluster.hosts[:n]

    def inst(h, port: int) -> dict:
        return {
            "host": h.address,
            "device": "cpu",
            "port": port,
            "bind": h.address,
            "env": {"STANDIN_START_S": f"{start_s:g}"},
        }

    return {
        "deployment": f"bench-fanout-{n}",
        "model": {"name": str(model)},
        "defaults": {"vllm_bin": vllm_bin, "env": {"PDLAUNCH_PYTHON": python}},
        "hosts": {
            h.address: {
                "local": False,
                "ssh": cluster.ssh(i),
                "work_dir": str(root / "work" / h.name),
            }
            for i, h in enumerate(hosts)
        },
        "prefill": [inst(h, 20100) for h in hosts],
        "decode": [inst(h, 21100) for h in hosts],
        "router": {
            "host": hosts[0].address,
            "bind": hosts[0].address,
            "port": 8123,
            "binary": router_bin,
        },
    }


def load_plan(path: Path):
    """The plan of a topology file, refusing one with findings (a benchmark bug)."""
    from pdlaunch.plan.build import build_plan
    from pdlaunch.rules import has_errors, validate
    from pdlaunch.spec.load import load

    topo, source = load(path)
    findings = validate(topo, source)
    if has_errors(findings):
        raise SystemExit("\n".join(f.message for f in findings if f.severity == "error"))
    return build_plan(topo)


# ------------------------------------------------------------------------------ the cluster


def proc_cpu(pid: int | None, children: bool = True) -> float:
    """CPU seconds of ``pid`` (with ``children``: plus every child it has reaped)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = fields[11:15] if children else fields[11:13]  # utime stime [cutime cstime]
    return sum(int(x) for x in ticks) / os.sysconf("SC_CLK_TCK")


class RelayedCluster:
    """``n`` namespace hosts (tests/support/netns/), their sshd reached through a latency relay."""

    def __init__(self, n: int, rtt_ms: float, root: Path):
        from tests.support.netns import NetnsCluster

        self.rtt_ms = rtt_ms
        self.root = root
        self.netns = NetnsCluster(n)
        self.relay: subprocess.Popen | None = None
        self.ports: list[int] = []

    def __enter__(self) -> RelayedCluster:
        try:
            self.netns.start()  # raises the shared ARP table's limits for its hosts too
            self._start_relay()
            self._write_ssh_files()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.relay is not None:
            with contextlib.suppress(ProcessLookupError):
                self.relay.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.relay.wait(timeout=5)
            self.relay = None
        self.netns.close()

    @property
    def hosts(self) -> list:
        return self.netns.hosts

    @property
    def user(self) -> str:
        return self.netns.user

    @property
    def control_address(self) -> str:
        return self.netns.control_address

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    def ssh(self, index: int) -> dict:
        """The topology's ``ssh`` block for host ``index`` (0-based): port = its relay."""
        return {"user": self.user, "port": self.ports[index], "key": str(self.netns.key_file)}

    def _start_relay(self) -> None:
        targets = [f"{h.address}:22" for h in self.hosts]
        self.relay = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--delay-ms",
                f"{self.rtt_ms / 2:g}",
                "--listen",
                self.control_address,
                *targets,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.relay.stdout is not None
        line = self.relay.stdout.readline()
        if not line:
            raise RuntimeError(f"the relay exited (rc={self.relay.wait()}) before listening")
        self.ports = json.loads(line)["ports"]

    def _write_ssh_files(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        ctrl = self.control_address
        kh, cfg = [], []
        for h, port in zip(self.hosts, self.ports, strict=True):
            keytype, blob = Path(str(h.sshd.host_key) + ".pub").read_text().split()[:2]
            kh.append(f"[{ctrl}]:{port} {keytype} {blob}\n")  # through the relay
            kh.append(f"{h.address} {keytype} {blob}\n")  # direct (the RTT baseline)
            cfg.append(
                f"Host {h.address}\n    HostName {ctrl}\n    Port {port}\n"
                f"    User {self.user}\n    IdentityFile {self.netns.key_file}\n"
                "    IdentitiesOnly yes\n"
            )
        cfg.append(
            f"Host *\n    UserKnownHostsFile {self.known_hosts}\n    GlobalKnownHostsFile none\n"
        )
        self.known_hosts.write_text("".join(kh))
        self.ssh_config.write_text("".join(cfg))

    # -- CPU -----------------------------------------------------------------------------------
    def hosts_cpu(self, n: int | None = None) -> float:
        """CPU seconds so far of the first ``n`` hosts' sshd (default: all) and what each
        reaped: its connections, sessions and commands. A connection's CPU shows only once
        it closed and was reaped: read this a moment after pdlaunch closed its connections."""
        return sum(proc_cpu(h.sshd.pid) for h in self.hosts[:n])

    def relay_cpu(self) -> float:
        return proc_cpu(self.relay.pid if self.relay else None, children=False)

    # -- the injected delay, measured ------------------------------------------------------------
    def measure_rtt(self, samples: int = 7) -> dict[str, float]:
        """Over SSH to host 1, through the relay and directly (medians, ms): connection setup,
        one SSH round trip (a global request the server answers at once) and one command
        (``true`` on its own channel, as pdlaunch runs every command)."""
        import paramiko

        h = self.hosts[0]
        out: dict[str, float] = {}
        for how, (addr, port) in {
            "relay": (self.control_address, self.ports[0]),
            "direct": (h.address, 22),
        }.items():
            connects, trips, cmds = [], [], []
            for i in range(3):
                client = paramiko.SSHClient()
                client.load_host_keys(str(self.known_hosts))
                client.set_missing_host_key_policy(paramiko.RejectPolicy())
                t0 = time.perf_counter()
                client.connect(
                    addr,
                    port,
                    username=self.user,
                    key_filename=str(self.netns.key_file),
                    allow_agent=False,
                    look_for_keys=False,
                    timeout=10,
                )
                connects.append(time.perf_counter() - t0)
                transport = client.get_transport()
                assert transport is not None
                if i == 0:
                    for _ in range(samples):
                        t0 = time.perf_counter()
                        transport.global_request("keepalive@openssh.com", wait=True)
                        trips.append(time.perf_counter() - t0)
                    for _ in range(samples):
                        t0 = time.perf_counter()
                        chan = transport.open_session(timeout=10)
                        chan.exec_command("true")
                        chan.recv_exit_status()
                        chan.close()
                        cmds.append(time.perf_counter() - t0)
                client.close()
            out[f"{how}_connect_ms"] = statistics.median(connects) * 1000
            out[f"{how}_round_trip_ms"] = statistics.median(trips) * 1000
            out[f"{how}_command_ms"] = statistics.median(cmds) * 1000
        out["injected_rtt_ms"] = out["relay_round_trip_ms"] - out["direct_round_trip_ms"]
        return out


def rtt_lines(m: dict[str, float], rtt_ms: float) -> list[str]:
    """The measurement of :meth:`RelayedCluster.measure_rtt`, for people."""
    return [
        f"RTT {rtt_ms:g} ms injected in user space (no netem in this kernel); measured over "
        f"SSH to host 1: one round trip {m['relay_round_trip_ms']:.1f} ms via the relay vs "
        f"{m['direct_round_trip_ms']:.1f} ms direct (+{m['injected_rtt_ms']:.1f} ms)",
        f"  connection setup {m['relay_connect_ms']:.0f} ms vs {m['direct_connect_ms']:.0f} ms "
        f"(= {m['relay_connect_ms'] / rtt_ms:.1f} RTT); one command (`true`, own channel) "
        f"{m['relay_command_ms']:.0f} ms vs {m['direct_command_ms']:.0f} ms "
        f"(= {m['relay_command_ms'] / rtt_ms:.1f} RTT)",
    ]


if __name__ == "__main__":
    relay_main()


def own_cpu() -> float:
    """CPU seconds this process (pdlaunch, in the benchmark) has used so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime
