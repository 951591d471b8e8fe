"""Namespaces, links and the firewall/netem settings of one cluster slot: names (pure),
system calls, and what runs inside a namespace host. The cluster itself: cluster.py."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.support.sshd import (
    SshdError,
    find_sshd,
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
