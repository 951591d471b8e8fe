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
import fcntl
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.sshd import (
    WRAPPER,
    SshdCluster,
    SshdError,
    SshdHost,
    _ensure_privsep_dir,
    _wait_ready,
    find_sshd,
    keygen,
)

STATE_DIR = Path("/run/pdlaunch-netns")
NETNS_ETC = Path("/etc/netns")
MAX_SLOTS = 32
MAX_HOSTS = 200  # 10.231.k.(10+N) must stay below .255
FIREWALL_TABLE = "pdl"  # block_tcp's rules: table inet pdl, chains input and output
LOSS_TABLE = "pdl_loss"  # set_netem's nftables fallback for loss
ROOT_PREFIX = "pdl-netns"  # mkdtemp prefix of a cluster's files: the only dirs close() deletes
_NAME = re.compile(r"^pdl(\d*)-(?:br|h\d+|h\d+-v)$")
INSTALL_HINT = (
    "the network-namespace test cluster needs root, `ip` (iproute2), `unshare` (util-linux), "
    "`tc` and, for firewall rules, `nft` (Debian: apt-get install -y iproute2 "
    "util-linux nftables); scripts/install.sh installs them"
)


class NetnsError(RuntimeError):
    """The namespace cluster could not be set up, driven or torn down."""


# ------------------------------------------------------------------------------ naming (pure)


def slot_prefix(slot: int) -> str:
    """Slot 0 gets the plain names (pdl-h1); others carry their slot (pdl3-h1)."""
    return "pdl-" if slot == 0 else f"pdl{slot}-"


def namespace_name(slot: int, index: int) -> str:
    return f"{slot_prefix(slot)}h{index}"


def veth_name(slot: int, index: int) -> str:
    return f"{namespace_name(slot, index)}-v"  # at most 15 chars: "pdl31-h200-v"


def bridge_name(slot: int) -> str:
    return f"{slot_prefix(slot)}br"


def gateway_address(slot: int) -> str:
    return f"10.231.{slot}.1"


def host_address(slot: int, index: int) -> str:
    return f"10.231.{slot}.{10 + index}"


def parse_slot(name: str) -> int | None:
    """Slot of a namespace/link/etc-dir name this module creates; None for anything else."""
    m = _NAME.match(name)
    if m is None:
        return None
    return int(m.group(1)) if m.group(1) else 0


def hosts_file_text(mapping: dict[str, str]) -> str:
    return "".join(f"{addr}\t{name}\n" for name, addr in mapping.items())


def ssh_config_text(
    hosts: Iterable[tuple[str, str]], *, user: str, key_file: str, known_hosts: str
) -> str:
    """``Host NAME / HostName ADDRESS`` stanzas plus a ``Host *`` that isolates the client
    from ~/.ssh and /etc/ssh (only the cluster's known_hosts is trusted)."""
    out = [
        f"Host {name}\n    HostName {addr}\n    Port 22\n    User {user}\n"
        f"    IdentityFile {key_file}\n    IdentitiesOnly yes\n"
        for name, addr in hosts
    ]
    out.append(f"Host *\n    UserKnownHostsFile {known_hosts}\n    GlobalKnownHostsFile none\n")
    return "".join(out)


# ------------------------------------------------------------------------------ system calls


def run_cmd(argv: Sequence[str], *, check: bool = True, timeout: float = 30.0) -> str:
    """Run ``argv``; its stdout, or NetnsError naming the command and its stderr."""
    try:
        res = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError as exc:
        raise NetnsError(f"{argv[0]} not found: {INSTALL_HINT}") from exc
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"`{' '.join(argv)}` did not finish within {timeout:g}s") from exc
    if check and res.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed (rc={res.returncode}): {res.stderr.strip()}")
    return res.stdout


def preflight() -> list[str]:
    """What this machine lacks to build a cluster (empty: nothing)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not running as root (network namespaces and bridges need it)")
    for tool in ("ip", "unshare", "tc", "hostname"):
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` not found")
    try:
        find_sshd()
    except SshdError as exc:
        problems.append(str(exc))
    return problems


def list_namespaces() -> list[str]:
    out = run_cmd(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_links() -> list[str]:
    """Interface names of the root namespace (``pdl-h1-v@if2`` -> ``pdl-h1-v``)."""
    names = []
    for line in run_cmd(["ip", "-o", "link", "show"], check=False).splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def netns_pids(ns: str) -> list[int]:
    out = run_cmd(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in out.split() if x.isdigit()]


def kill_namespace_processes(ns: str, timeout: float = 5.0) -> None:
    """SIGKILL everything in ``ns`` until nothing is left (a session may fork meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = netns_pids(ns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise NetnsError(f"processes {pids} in namespace {ns} survived SIGKILL")
        time.sleep(0.02)


def leftovers(slot: int | None = None) -> dict[str, list[str]]:
    """Namespaces, root-namespace links and /etc/netns entries of ``slot`` (None: any slot)."""

    def mine(name: str) -> bool:
        s = parse_slot(name)
        return s is not None and (slot is None or s == slot)

    etc = sorted(p.name for p in NETNS_ETC.iterdir()) if NETNS_ETC.is_dir() else []
    return {
        "namespaces": [n for n in list_namespaces() if mine(n)],
        "links": [n for n in list_links() if mine(n)],
        "etc": [n for n in etc if mine(n)],
    }


def teardown_slot(slot: int) -> None:
    """Remove everything of ``slot``: processes, namespaces, veths, bridge, /etc/netns entries.
    Idempotent; the caller must own the slot (or know its owner is gone)."""
    found = leftovers(slot)
    errors = []
    for ns in found["namespaces"]:
        try:
            kill_namespace_processes(ns)
            run_cmd(["ip", "netns", "del", ns])
        except NetnsError as exc:
            errors.append(str(exc))
    # veth root ends vanish with their namespace; the bridge (and a veth whose namespace was
    # never made) is deleted here, veths first so the bridge is empty
    for link in sorted(leftovers(slot)["links"], key=lambda n: n.endswith("-br")):
        with contextlib.suppress(NetnsError):
            run_cmd(["ip", "link", "del", link])
    for name in found["etc"]:
        shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
    with contextlib.suppress(OSError):
        if NETNS_ETC.is_dir() and not any(NETNS_ETC.iterdir()):
            NETNS_ETC.rmdir()  # we made it: /etc/netns does not exist on a stock Debian
    left = leftovers(slot)
    if any(left.values()) or errors:
        raise NetnsError(f"teardown of slot {slot} incomplete: {left} {'; '.join(errors)}")


# ------------------------------------------------------------------------------ inside a host


def ns_exec(ns: str, argv: Sequence[str], *, check: bool = True) -> str:
    return run_cmd(["ip", "netns", "exec", ns, *argv], check=check)


def ns_nft(ns: str, *command: str, check: bool = True) -> str:
    """``nft COMMAND`` in the namespace: its own ruleset, empty when the namespace is made."""
    if shutil.which("nft") is None:
        raise NetnsError(f"`nft` not found: {INSTALL_HINT}")
    return ns_exec(ns, ["nft", *command], check=check)


def _base_chain(table: str, chain: str) -> list[str]:
    return [
        f"add table inet {table}",
        f"add chain inet {table} {chain} "
        f"{{ type filter hook {chain} priority 0 ; policy accept ; }}",
    ]


VERDICTS = {"drop": "drop", "reject": "reject", "reset": "reject with tcp reset"}


def block_tcp(
    ns: str, port: int, *, chain: str = "input", peer: str | None = None, action: str = "drop"
) -> None:
    """A firewall rule in host ``ns``: TCP to ``port`` arriving (``chain="input"``, from
    ``peer`` if given) or leaving (``"output"``, to ``peer``) is dropped (silence: the peer
    times out), rejected (ICMP port unreachable) or reset (TCP RST)."""
    if chain not in ("input", "output") or action not in VERDICTS:
        raise NetnsError(f"block_tcp: chain input|output and action {'|'.join(VERDICTS)}")
    match = f"ip {'saddr' if chain == 'input' else 'daddr'} {peer} " if peer else ""
    for command in _base_chain(FIREWALL_TABLE, chain):
        ns_nft(ns, command)
    ns_nft(ns, f"add rule inet {FIREWALL_TABLE} {chain} {match}tcp dport {port} {VERDICTS[action]}")


def set_netem(ns: str, delay_ms: float = 0, loss_pct: float = 0) -> str:
    """Delay and/or drop what host ``ns`` sends (netem on its eth0), replacing any earlier
    setting; 0, 0 removes it.

    Returns how it was done: ``"netem"``, ``"nft"`` (loss only, on a kernel without sch_netem:
    a random-drop rule on the host's output) or ``"off"``. Delay on such a kernel is a
    NetnsError: nothing else in the kernel can hold packets back."""
    if delay_ms < 0 or not 0 <= loss_pct <= 100:
        raise NetnsError(
            f"netem needs delay_ms >= 0 and 0 <= loss_pct <= 100, not {delay_ms}, {loss_pct}"
        )
    ns_exec(ns, ["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
    if shutil.which("nft") is not None:
        ns_nft(ns, f"delete table inet {LOSS_TABLE}", check=False)
    if delay_ms == 0 and loss_pct == 0:
        return "off"
    netem = ["netem", "delay", f"{delay_ms:g}ms", "loss", f"{loss_pct:g}%"]
    try:
        ns_exec(ns, ["tc", "qdisc", "replace", "dev", "eth0", "root", *netem])
        return "netem"
    except NetnsError as exc:
        if "kind is unknown" not in str(exc):
            raise
    if delay_ms > 0:
        raise NetnsError(
            f"cannot delay packets of {ns}: this kernel ({os.uname().release}) has no sch_netem "
            "(CONFIG_NET_SCH_NETEM); only loss can be emulated here (set delay 0)"
        )
    for command in _base_chain(LOSS_TABLE, "output"):
        ns_nft(ns, command)
    below = max(1, round(loss_pct * 100))  # numgen draws 0..9999
    sample = f"numgen random mod 10000 < {below} " if below < 10000 else ""
    ns_nft(ns, f'add rule inet {LOSS_TABLE} output oifname "eth0" {sample}drop')
    return "nft"


def reset_host(ns: str) -> None:
    """No firewall rule (the namespace's whole nftables ruleset) and no netem in ``ns``."""
    set_netem(ns)
    if shutil.which("nft") is not None:
        ns_nft(ns, "flush ruleset", check=False)


def netem_state(ns: str) -> str:
    """Human summary of what :func:`set_netem` left in ``ns`` ("" when nothing)."""
    qdisc = ns_exec(ns, ["tc", "qdisc", "show", "dev", "eth0"], check=False)
    parts = [line.strip() for line in qdisc.splitlines() if " netem " in line]
    if shutil.which("nft") is not None:
        rules = ns_nft(ns, f"list table inet {LOSS_TABLE}", check=False)
        parts += [f"nft {line.strip()}" for line in rules.splitlines() if "numgen" in line]
    return "; ".join(parts)


# ------------------------------------------------------------------------------ slots


def _lock_path(slot: int) -> Path:
    return STATE_DIR / f"slot{slot}.lock"


def state_path(slot: int) -> Path:
    return STATE_DIR / f"slot{slot}.json"


def read_state(slot: int) -> dict:
    try:
        return json.loads(state_path(slot).read_text())
    except (OSError, ValueError):
        return {}


def try_lock(slot: int) -> int | None:
    """An fd holding the slot's lock, or None when a live process holds it."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(_lock_path(slot), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.close(fd)


def slot_owner(slot: int) -> str:
    """``live`` (a running process holds the lock), ``persistent`` (made by the CLI),
    ``stale`` (leftovers, no owner) or ``free``."""
    fd = try_lock(slot)
    if fd is None:
        return "live"
    try:
        if read_state(slot).get("persistent"):
            return "persistent"
        return "stale" if any(leftovers(slot).values()) else "free"
    finally:
        unlock(fd)


def remove_cluster_files(slot: int) -> None:
    """The slot's state file and the cluster directory it names (only one of ours); the ARP
    limits then fit the clusters left (the machine's own values once none is)."""
    root = read_state(slot).get("root")
    if root and Path(root).name.startswith(ROOT_PREFIX):
        shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        state_path(slot).unlink()
    sync_arp_limits()


def sweep_stale() -> list[int]:
    """Tear down every slot that has leftovers but no live owner and no persistent mark
    (a crashed earlier run); returns those slots."""
    slots = {parse_slot(n) for names in leftovers().values() for n in names} - {None}
    swept = []
    for slot in sorted(s for s in slots if s is not None):
        fd = try_lock(slot)
        if fd is None:
            continue
        try:
            if read_state(slot).get("persistent"):
                continue
            teardown_slot(slot)
            remove_cluster_files(slot)
            swept.append(slot)
        finally:
            unlock(fd)
    return swept


# ------------------------------------------------------------------------------ ARP limits

ARP_SYSCTL = Path("/proc/sys/net/ipv4/neigh/default")
ARP_KEYS = ("gc_thresh1", "gc_thresh2", "gc_thresh3")  # raised largest first, lowered last


def arp_limits_needed(cluster_sizes: Iterable[int]) -> dict[str, int]:
    """gc_thresh1/2/3 for clusters of these sizes at once: each of n hosts that all talk to
    each other (and to the control address) holds n + 1 neighbours. gc_thresh1: nothing is
    collected below it; 2 and 3: soft and hard limits, with room to spare."""
    entries = sum(n * (n + 1) for n in cluster_sizes)
    return {"gc_thresh1": entries, "gc_thresh2": 2 * entries, "gc_thresh3": 4 * entries}


def read_arp_limits(sysctl: Path = ARP_SYSCTL) -> dict[str, int]:
    return {k: int((sysctl / k).read_text()) for k in ARP_KEYS}


def _write_arp_limits(values: dict[str, int], sysctl: Path) -> None:
    now = read_arp_limits(sysctl)
    raising = [k for k in reversed(ARP_KEYS) if values[k] > now[k]]  # thresh3 first
    lowering = [k for k in ARP_KEYS if values[k] < now[k]]  # thresh1 first
    for k in raising + lowering:
        try:
            (sysctl / k).write_text(f"{values[k]}\n")
        except OSError as exc:
            raise NetnsError(f"cannot set net.ipv4.neigh.default.{k} = {values[k]}: {exc}") from exc


def sync_arp_limits(
    cluster_sizes: Sequence[int] | None = None,
    *,
    sysctl: Path = ARP_SYSCTL,
    saved: Path | None = None,
) -> dict[str, int]:
    """Fit the shared neighbour table to the clusters that exist now (default: every slot
    with a state file, live or persistent): the machine's own values, raised where those
    clusters need more. The machine's own values are saved before the first raise and
    written back, the save removed, when no cluster is left. Returns the values in force."""
    if not sysctl.is_dir():  # no IPv4 neighbour settings to fit (not Linux as we know it)
        return {}
    saved = saved or STATE_DIR / "arp-limits.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(saved.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cluster_sizes is None:
            cluster_sizes = [int(read_state(s).get("n") or 0) for s in range(MAX_SLOTS)]
        sizes = [n for n in cluster_sizes if n > 0]
        try:
            original = {k: int(v) for k, v in json.loads(saved.read_text()).items()}
        except (OSError, ValueError):
            original = None
        if not sizes:
            if original is not None:
                _write_arp_limits(original, sysctl)
                saved.unlink()
            return read_arp_limits(sysctl)
        base = original or read_arp_limits(sysctl)
        need = arp_limits_needed(sizes)
        values = {k: max(base[k], need[k]) for k in ARP_KEYS}
        if values != base and original is None:
            saved.write_text(json.dumps(base) + "\n")  # before the first change
        _write_arp_limits(values, sysctl)
        return values
    finally:
        unlock(lock)


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
