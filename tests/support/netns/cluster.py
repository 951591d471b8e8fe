"""A test cluster of real "hosts" on this machine: Linux network namespaces on a private bridge.

Pure helper module (no pytest import), used by the ``netns_cluster`` fixture
(tests/support/netns_fixtures.py) and by ``scripts/netns_cluster.py``::

    from tests.support.netns import NetnsCluster

    with NetnsCluster(3) as cluster:          # needs root, iproute2, util-linux, OpenSSH
        cluster.hosts[0].name, .address       # "pdl-h1", "10.231.0.11"
        cluster.host_map                      # {"pdl-h1": "10.231.0.11", ...}
        cluster.control_address               # 10.231.0.1: this (root) namespace on the bridge
        cluster.ssh_config, cluster.known_hosts, cluster.key_file, cluster.user
        cluster.set_netem("pdl-h2", delay_ms=20, loss_pct=1)
        cluster.block_tcp("pdl-h1", 5600, peer="10.231.0.12")   # nft rule in pdl-h1: drop
        cluster.reset()                       # no firewall rule, no netem anywhere

Layout of a cluster in slot ``k`` (slot 0 unless another live cluster holds it)::

    root namespace: bridge pdl-br (pdlK-br), address 10.231.k.1/24
    pdl-hN (pdlK-hN): veth pdl-hN-v in the bridge <-> eth0 10.231.k.(10+N)/24, lo up,
                      own UTS namespace for sshd (hostname pdl-hN), sshd on eth0 port 22

No default route is set in the namespaces and the address range exists only on the bridge, so
no packet of a test leaves this machine. ``ip netns exec`` bind-mounts /etc/netns/NAME/hosts
over /etc/hosts for what it starts; a hosts file there lets every namespace host (and so every
command run over its sshd) resolve the cluster's names. The machine's own /etc/hosts is never
written.

``set_netem`` uses tc netem where the kernel has it; on a kernel built without sch_netem (this
project's CI VM, ``# CONFIG_NET_SCH_NETEM is not set``) loss falls back to an nftables
random-drop rule on the host's output and a delay is refused with a NetnsError naming the
missing kernel option.

Linux keeps ONE neighbour (ARP) table for all network namespaces together (``gc_thresh3``
1024 by default), and n hosts that all dial each other need about n * (n + 1) entries: 32 of
them overflowed it (new neighbours refused, connections between some hosts timed out). While
clusters exist, ``net.ipv4.neigh.default.gc_thresh1/2/3`` are raised for all of them together
(never below what the machine had); the values from before are kept in
/run/pdlaunch-netns/arp-limits.json and written back once no cluster is left.

Concurrency: each slot has a lock file under /run/pdlaunch-netns/ that its owner holds (flock)
for the cluster's lifetime; a cluster made by the CLI (``persist()``) is marked persistent in
the slot's state file instead. At start, leftovers (namespaces, links, /etc/netns entries) of
a slot with no live owner and no persistent mark are removed: what a crashed run left behind.
Teardown kills every process in each namespace (``ip netns pids``), then deletes namespaces
(their veth ends go with them), remaining veths and the bridge; it runs from ``close()``,
from atexit, and from the next run's sweep.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pwd
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.netns.namespaces import (
    INSTALL_HINT,
    MAX_HOSTS,
    MAX_SLOTS,
    NETNS_ETC,
    ROOT_PREFIX,
    NetnsError,
    block_tcp,
    bridge_name,
    gateway_address,
    host_address,
    hosts_file_text,
    namespace_name,
    ns_exec,
    ns_nft,
    preflight,
    reset_host,
    run_cmd,
    set_netem,
    ssh_config_text,
    teardown_slot,
    veth_name,
)
from tests.support.netns.slots import (
    read_state,
    remove_cluster_files,
    state_path,
    sweep_stale,
    sync_arp_limits,
    try_lock,
    unlock,
)
from tests.support.sshd import (
    WRAPPER,
    SshdCluster,
    SshdHost,
    _ensure_privsep_dir,
    _wait_ready,
    find_sshd,
    keygen,
)

# ------------------------------------------------------------------------------ the cluster


@dataclass
class NetnsHost:
    """One namespace "host"."""

    index: int  # 1-based: pdl-h1
    name: str  # namespace name = hostname = ssh_config alias
    address: str
    veth: str
    sshd: SshdHost


class NetnsCluster:
    """``n`` namespace hosts on a bridge, each with its own sshd; see the module docstring."""

    def __init__(self, n: int = 3, *, slot: int | None = None, user: str | None = None):
        if not 1 <= n <= MAX_HOSTS:
            raise NetnsError(f"a cluster has 1..{MAX_HOSTS} hosts, not {n}")
        self.n = n
        self.wanted_slot = slot
        self.user = user or pwd.getpwuid(os.geteuid()).pw_name
        self.slot = -1
        self.hosts: list[NetnsHost] = []
        self.root = Path()
        self._lock: int | None = None
        self._procs: list[subprocess.Popen] = []
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, timeout: float = 20.0) -> NetnsCluster:
        problems = preflight()
        if problems:
            raise NetnsError("; ".join(problems) + f". {INSTALL_HINT}")
        sweep_stale()
        self._acquire_slot()
        atexit.register(self.close)
        try:
            self.root = Path(tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{self.slot}-"))
            self._write_state(persistent=False)
            sync_arp_limits()  # this cluster's state file counts now
            self._network()
            self._start_sshd(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def persist(self) -> None:
        """Keep the cluster after this process exits (the CLI's ``up``): later runs' sweeps
        leave it alone until ``scripts/netns_cluster.py down``."""
        self._write_state(persistent=True)
        atexit.unregister(self.close)
        self._procs = []  # sshd lives on, reparented to init when this process exits
        if self._lock is not None:
            unlock(self._lock)
            self._lock = None
        self._closed = True

    def close(self) -> None:
        """Tear everything down; idempotent (finalizer, atexit and an explicit call)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            if self.slot >= 0:
                teardown_slot(self.slot)
        finally:
            for proc in self._procs:  # reap: their namespaces' pids were killed above
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            self._procs = []
            if self.slot >= 0 and self._lock is not None:
                remove_cluster_files(self.slot)
                unlock(self._lock)
                self._lock = None

    def __enter__(self) -> NetnsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- lookups -----------------------------------------------------------------------------
    @property
    def host_map(self) -> dict[str, str]:
        return {h.name: h.address for h in self.hosts}

    @property
    def control_address(self) -> str:
        """This (root) namespace's address on the bridge: where tests and pdlaunch run."""
        return gateway_address(self.slot)

    @property
    def bridge(self) -> str:
        return bridge_name(self.slot)

    @property
    def hosts_file(self) -> Path:
        return self.root / "hosts"

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.root / "client" / "known_hosts"

    @property
    def key_file(self) -> Path:
        return self.root / "client" / "id_ed25519"

    def host(self, name_or_index: str | int) -> NetnsHost:
        """By name (``pdl-h1``), address, or 1-based index."""
        for h in self.hosts:
            if name_or_index in (h.name, h.address, h.index):
                return h
        raise NetnsError(f"no host {name_or_index!r} in this cluster ({sorted(self.host_map)})")

    # -- acting inside a host (module functions below, by host name/address/index) ---------
    def exec(self, host: str | int, argv: Sequence[str], *, check: bool = True) -> str:
        """Run ``argv`` in the host's network namespace (as root, not over SSH); its stdout."""
        return ns_exec(self.host(host).name, argv, check=check)

    def nft(self, host: str | int, *command: str) -> str:
        """``nft COMMAND`` in the host's namespace (its own ruleset, empty at start)."""
        return ns_nft(self.host(host).name, *command)

    def block_tcp(
        self,
        host: str | int,
        port: int,
        *,
        chain: str = "input",
        peer: str | None = None,
        action: str = "drop",
    ) -> None:
        """See :func:`block_tcp`."""
        block_tcp(self.host(host).name, port, chain=chain, peer=peer, action=action)

    def set_netem(self, host: str | int, delay_ms: float = 0, loss_pct: float = 0) -> str:
        """See :func:`set_netem`."""
        return set_netem(self.host(host).name, delay_ms, loss_pct)

    def reset(self, hosts: Iterable[str | int] | None = None) -> None:
        """No filter-table firewall rule and no netem on ``hosts`` (default: all)."""
        for h in self.hosts if hosts is None else [self.host(x) for x in hosts]:
            reset_host(h.name)

    # -- internals -----------------------------------------------------------------------------
    def _acquire_slot(self) -> None:
        candidates = [self.wanted_slot] if self.wanted_slot is not None else range(MAX_SLOTS)
        for slot in candidates:
            if not 0 <= slot < MAX_SLOTS:
                raise NetnsError(f"slot must be 0..{MAX_SLOTS - 1}, not {slot}")
            fd = try_lock(slot)
            if fd is None:
                continue
            if read_state(slot).get("persistent"):
                unlock(fd)
                continue
            try:
                teardown_slot(slot)  # leftovers of a crashed run in this very slot
            except BaseException:
                unlock(fd)
                raise
            self.slot, self._lock = slot, fd
            return
        where = f"slot {self.wanted_slot}" if self.wanted_slot is not None else "every slot"
        raise NetnsError(
            f"{where} is taken by a live or persistent cluster "
            "(see `scripts/netns_cluster.py status`)"
        )

    def _write_state(self, *, persistent: bool) -> None:
        state = {
            "pid": os.getpid(),
            "root": str(self.root),
            "n": self.n,
            "persistent": persistent,
            "hosts": self.host_map,
        }
        state_path(self.slot).write_text(json.dumps(state, indent=1) + "\n")

    def _network(self) -> None:
        slot, br = self.slot, bridge_name(self.slot)
        run_cmd(["ip", "link", "add", br, "type", "bridge"])
        run_cmd(["ip", "addr", "add", f"{gateway_address(slot)}/24", "dev", br])
        run_cmd(["ip", "link", "set", br, "up"])
        mapping = {namespace_name(slot, i): host_address(slot, i) for i in range(1, self.n + 1)}
        for i in range(1, self.n + 1):
            ns, veth, addr = namespace_name(slot, i), veth_name(slot, i), host_address(slot, i)
            # the hosts file first: `ip netns exec` bind-mounts it only if present at exec time
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(
                "127.0.0.1\tlocalhost\n"
                + f"{gateway_address(slot)}\tpdl-control\n"
                + hosts_file_text(mapping)
            )
            run_cmd(["ip", "netns", "add", ns])
            run_cmd(
                ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns]
            )
            run_cmd(["ip", "link", "set", veth, "master", br, "up"])
            run_cmd(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
            run_cmd(["ip", "-n", ns, "link", "set", "eth0", "up"])
            run_cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
        self.root.joinpath("hosts").write_text(
            f"{gateway_address(slot)}\tpdl-control\n" + hosts_file_text(mapping)
        )

    def _start_sshd(self, timeout: float) -> None:
        _ensure_privsep_dir()
        # the loopback cluster is only the identity here: client key, authorized_keys,
        # and the sshd_config writer shared with the loopback hosts
        identity = SshdCluster(self.root, user=self.user)
        for i in range(1, self.n + 1):
            d = self.root / f"h{i}"
            home = d / "home"
            home.mkdir(parents=True)
            (d / "session.sh").write_text(WRAPPER)
            (d / "session.sh").chmod(0o755)
            sshd = SshdHost(
                index=i,
                host=host_address(self.slot, i),
                port=22,
                dir=d,
                home=home,
                host_key=keygen(d / "ssh_host_ed25519_key", comment=namespace_name(self.slot, i)),
                config_file=d / "sshd_config",
                log_file=d / "sshd.log",
            )
            identity._write_config(sshd)
            self.hosts.append(
                NetnsHost(i, namespace_name(self.slot, i), sshd.host, veth_name(self.slot, i), sshd)
            )
        for h in self.hosts:
            h.sshd.process = self._spawn_sshd(h)
            self._procs.append(h.sshd.process)
        failed = _wait_ready([h.sshd for h in self.hosts], timeout)
        if failed:
            raise NetnsError(
                "sshd failed in " + "; ".join(f"{s.address}: {s.log_tail(5)}" for s in failed)
            )
        self.known_hosts.write_text(
            "".join(f"{h.name},{h.sshd.host_key_line()}\n" for h in self.hosts)
        )
        self.ssh_config.write_text(
            ssh_config_text(
                [(h.name, h.address) for h in self.hosts],
                user=self.user,
                key_file=str(self.key_file),
                known_hosts=str(self.known_hosts),
            )
        )
        self._write_state(persistent=False)

    def _spawn_sshd(self, h: NetnsHost) -> subprocess.Popen:
        log = open(h.sshd.log_file, "ab")  # noqa: SIM115 - handed to the child
        h.sshd.log_offset = log.seek(0, os.SEEK_END)
        # own UTS namespace: `hostname` over SSH names the namespace host, not this machine
        wrapper = ["sh", "-c", 'hostname "$0" && exec "$@"', h.name]
        sshd = [find_sshd(), "-D", "-e", "-f", str(h.sshd.config_file)]
        argv = ["ip", "netns", "exec", h.name, "unshare", "--uts", *wrapper, *sshd]
        try:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
