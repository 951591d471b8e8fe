#!/usr/bin/env python3
"""A test cluster of network-namespace hosts on this machine, for humans (needs root).

    python scripts/netns_cluster.py up 3        # pdl-h1..3 at 10.231.0.11..13, sshd on each
    ssh -F /tmp/pdl-netns0-XXXX/ssh_config pdl-h2 hostname
    python scripts/netns_cluster.py netem pdl-h2 --delay 20 --loss 1
    python scripts/netns_cluster.py status
    python scripts/netns_cluster.py down

The same code as the tests' ``netns_cluster`` fixture (tests/support/netns/). A cluster made here
outlives this script and test runs leave it alone; ``down`` removes it, and also whatever a
crashed run left behind, but never a cluster a running test session holds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `tests.support.netns` from any working directory
    sys.path.insert(0, str(ROOT))

from tests.support.netns import (  # noqa: E402
    MAX_HOSTS,
    MAX_SLOTS,
    NetnsCluster,
    NetnsError,
    leftovers,
    netem_state,
    netns_pids,
    parse_slot,
    read_state,
    remove_cluster_files,
    set_netem,
    slot_owner,
    state_path,
    teardown_slot,
    try_lock,
    unlock,
)

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def known_slots() -> list[int]:
    """Slots with something on the machine or a state file."""
    slots = {parse_slot(n) for names in leftovers().values() for n in names}
    slots |= {s for s in range(MAX_SLOTS) if state_path(s).exists()}
    return sorted(s for s in slots if s is not None)


def cmd_up(n: int, slot: int | None) -> int:
    cluster = NetnsCluster(n, slot=slot).start()
    cluster.persist()
    print(f"slot {cluster.slot}: bridge {cluster.bridge}, control host {cluster.control_address}")
    for h in cluster.hosts:
        print(f"  {h.name:<10} {h.address:<15} sshd pid {h.sshd.pid}")
    first = cluster.hosts[0].name
    print(f"hosts file:  {cluster.hosts_file}")
    print(f"ssh config:  {cluster.ssh_config}   (user {cluster.user}, key {cluster.key_file})")
    print(f"try:         ssh -F {cluster.ssh_config} {first} hostname")
    print(f"run inside:  ip netns exec {first} <command>")
    print(f"remove:      python {Path(__file__).relative_to(ROOT)} down")
    return EXIT_OK


def cmd_down(slot: int | None) -> int:
    status = EXIT_OK
    for s in [slot] if slot is not None else known_slots():
        fd = try_lock(s)
        if fd is None:
            pid = read_state(s).get("pid", "?")
            print(f"slot {s}: held by a running process (pid {pid}); left alone")
            continue
        try:
            teardown_slot(s)
            remove_cluster_files(s)
            print(f"slot {s}: removed")
        except NetnsError as exc:
            print(f"slot {s}: {exc}", file=sys.stderr)
            status = EXIT_FAIL
        finally:
            unlock(fd)
    return status


def cmd_status() -> int:
    slots = known_slots()
    if not slots:
        print("no namespace cluster on this machine")
    for s in slots:
        state = read_state(s)
        owner = slot_owner(s)
        extra = f" (pid {state['pid']})" if owner == "live" and "pid" in state else ""
        print(f"slot {s}: {owner}{extra}, files {state.get('root', '-')}")
        addresses = state.get("hosts", {})
        for ns in sorted(leftovers(s)["namespaces"]):
            procs = len(netns_pids(ns))
            netem = netem_state(ns)
            print(
                f"  {ns:<10} {addresses.get(ns, '?'):<15} {procs} process(es)"
                + (f", netem: {netem}" if netem else "")
            )
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netns_cluster.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="create N namespace hosts with an sshd each")
    up.add_argument("n", type=int, help=f"number of hosts (1..{MAX_HOSTS})")
    up.add_argument("--slot", type=int, default=None, help="0 = pdl-hN names (default: first free)")
    down = sub.add_parser("down", help="remove clusters made by `up` and leftovers of crashes")
    down.add_argument("--slot", type=int, default=None, help="only this slot")
    sub.add_parser("status", help="list clusters, their hosts and netem settings")
    netem = sub.add_parser("netem", help="delay / drop what one host sends (0 0 clears)")
    netem.add_argument("host", help="namespace name, e.g. pdl-h2")
    netem.add_argument("--delay", type=float, default=0.0, help="milliseconds")
    netem.add_argument("--loss", type=float, default=0.0, help="percent")
    args = parser.parse_args(argv)
    if args.command == "up" and not 1 <= args.n <= MAX_HOSTS:
        parser.error(f"a cluster has 1..{MAX_HOSTS} hosts, not {args.n}")
    if getattr(args, "slot", None) is not None and not 0 <= args.slot < MAX_SLOTS:
        parser.error(f"--slot must be 0..{MAX_SLOTS - 1}")
    try:
        if args.command == "up":
            return cmd_up(args.n, args.slot)
        if args.command == "down":
            return cmd_down(args.slot)
        if args.command == "status":
            return cmd_status()
        if parse_slot(args.host) is None or args.host not in leftovers()["namespaces"]:
            raise NetnsError(f"no namespace host {args.host} (see `status`)")
        how = set_netem(args.host, args.delay, args.loss)
        print(f"{args.host}: {how}")
        return EXIT_OK
    except NetnsError as exc:
        print(f"netns_cluster.py: {exc}", file=sys.stderr)
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
