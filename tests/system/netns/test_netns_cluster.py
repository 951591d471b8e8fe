"""The network-namespace test cluster itself (tests/support/netns/): real hosts with their own
network stack, reached over SSH through pdlaunch's hosts layer; netem; teardown that leaves
nothing behind, also after a crashed run; two clusters side by side."""

from __future__ import annotations

import gzip
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdlaunch.hosts import SshSettings, open_host
from tests.support.netns import (
    NetnsCluster,
    NetnsError,
    bridge_name,
    host_address,
    leftovers,
    namespace_name,
    netns_pids,
    parse_slot,
    slot_owner,
    ssh_config_text,
    state_path,
    sweep_stale,
    veth_name,
)

pytestmark = pytest.mark.netns
ROOT = Path(__file__).resolve().parents[3]


def alive(pid: int) -> bool:
    """Running (a zombie counts as dead: init may reap it late in a container)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def connect_s(address: str, port: int = 22, timeout: float = 1.0) -> float | None:
    """Seconds a TCP connect to ``address:port`` took from this (root) namespace, None if
    it failed."""
    t0 = time.monotonic()
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return time.monotonic() - t0
    except OSError:
        return None


def ssh_to(cluster: NetnsCluster, address: str, **kw):
    kw.setdefault(
        "ssh",
        SshSettings(
            user=cluster.user,
            port=22,
            key_file=str(cluster.key_file),
            identities_only=True,
            connect_timeout=5.0,
        ),
    )
    return open_host(
        address,
        known_hosts=cluster.known_hosts,
        ssh_config_file=cluster.ssh_config,
        force_ssh=True,
        **kw,
    )


# --------------------------------------------------------------------------- pure parts


def test_names_addresses_and_slots_round_trip():
    assert (namespace_name(0, 1), veth_name(0, 1), bridge_name(0)) == (
        "pdl-h1",
        "pdl-h1-v",
        "pdl-br",
    )
    assert (namespace_name(3, 12), bridge_name(3)) == ("pdl3-h12", "pdl3-br")
    assert host_address(0, 1) == "10.231.0.11" and host_address(3, 2) == "10.231.3.12"
    assert len(veth_name(31, 200)) <= 15  # IFNAMSIZ - 1
    for slot in (0, 1, 31):
        for name in (namespace_name(slot, 7), veth_name(slot, 7), bridge_name(slot)):
            assert parse_slot(name) == slot
    # names of others are never ours to delete
    for other in ("pdl", "pdl-", "pdlx-h1", "pdl-h1x", "pdl-eth0", "eth0", "pdl-brx", "xpdl-h1"):
        assert parse_slot(other) is None


def test_ssh_config_isolates_the_client():
    text = ssh_config_text([("pdl-h1", "10.231.0.11")], user="u", key_file="/k", known_hosts="/kh")
    assert "Host pdl-h1\n    HostName 10.231.0.11\n" in text
    assert "IdentitiesOnly yes" in text and "User u" in text
    assert text.endswith("Host *\n    UserKnownHostsFile /kh\n    GlobalKnownHostsFile none\n")


# --------------------------------------------------------------------------- over SSH


def test_each_namespace_host_is_its_own_machine_over_ssh(netns: NetnsCluster):
    """pdlaunch's SSH host, pointed at a namespace address, runs in that namespace: its
    hostname, its eth0 address, and the control host (root namespace) as the SSH client."""
    assert [h.name for h in netns.hosts] == [namespace_name(netns.slot, i) for i in (1, 2, 3)]
    assert len(set(netns.host_map.values())) == 3
    machine = socket.gethostname()
    for h in netns.hosts:
        host = ssh_to(netns, h.address)
        try:
            res = host.run(
                'hostname; echo "$SSH_CONNECTION"; ip -4 -o addr show dev eth0; ip route',
                timeout=15,
                check=True,
            )
        finally:
            host.close()
        name, conn, addr, *routes = res.stdout.splitlines()
        assert name == h.name != machine
        client, _, server, port = conn.split()
        assert (client, server, port) == (netns.control_address, h.address, "22")
        assert f"inet {h.address}/24" in addr
        # only the bridge's subnet: no packet of a test can leave this machine
        assert not [r for r in routes if r.startswith("default")], routes


def test_names_resolve_through_ssh_config_and_the_cluster_hosts_file(netns: NetnsCluster):
    a, b, c = netns.hosts
    # the alias: HostName, User and IdentityFile come from the cluster's ssh_config
    host = ssh_to(netns, b.name, ssh=SshSettings(connect_timeout=5.0))
    try:
        res = host.run(f"hostname; getent hosts {a.name} {c.name}", timeout=15, check=True)
    finally:
        host.close()
    lines = res.stdout.splitlines()
    assert lines[0] == b.name
    assert sorted(line.split() for line in lines[1:]) == sorted(
        [[a.address, a.name], [c.address, c.name]]
    )
    hosts_file = netns.hosts_file.read_text()
    for h in netns.hosts:
        assert f"{h.address}\t{h.name}\n" in hosts_file
    assert "pdl" not in Path("/etc/hosts").read_text()  # the machine's own is never written


# --------------------------------------------------------------------------- netem


def test_loss_cuts_one_host_off_and_clears(netns: NetnsCluster):
    a, b, _ = netns.hosts
    assert connect_s(b.address) is not None
    how = netns.set_netem(b.name, loss_pct=100)
    assert how in ("netem", "nft")
    assert connect_s(b.address) is None  # its SYN-ACKs are lost
    assert connect_s(a.address) is not None  # the others are untouched
    assert netns.set_netem(b.name) == "off"
    assert connect_s(b.address) is not None


def test_delay_slows_one_host_or_is_refused_naming_the_kernel_option(netns: NetnsCluster):
    a = netns.hosts[0]
    try:
        how = netns.set_netem(a.name, delay_ms=150)
    except NetnsError as exc:
        assert "CONFIG_NET_SCH_NETEM" in str(exc)
        config = Path("/proc/config.gz")
        if config.exists():  # the refusal must be the kernel's lack, not a bug of ours
            with gzip.open(config, "rt") as f:
                assert "# CONFIG_NET_SCH_NETEM is not set" in f.read()
        return
    assert how == "netem"
    took = connect_s(a.address)
    assert took is not None and took >= 0.15
    netns.set_netem(a.name)
    took = connect_s(a.address)
    assert took is not None and took < 0.1


def test_netem_refuses_nonsense(netns: NetnsCluster):
    with pytest.raises(NetnsError, match="loss_pct"):
        netns.set_netem(netns.hosts[0].name, loss_pct=150)
    with pytest.raises(NetnsError, match="no host"):
        netns.set_netem("pdl-nope", loss_pct=1)


# --------------------------------------------------------------------------- lifecycle


def test_second_cluster_takes_another_slot_and_leaves_the_first_alone(netns: NetnsCluster):
    with NetnsCluster(1) as other:
        assert other.slot != netns.slot
        (o,) = other.hosts
        assert o.name not in netns.host_map and o.address not in netns.host_map.values()
        assert connect_s(o.address) is not None
        assert slot_owner(other.slot) == "live"
    assert not any(leftovers(other.slot).values())
    # the first cluster still serves
    assert all(connect_s(h.address) is not None for h in netns.hosts)
    assert slot_owner(netns.slot) == "live"


def test_teardown_leaves_no_namespace_link_process_or_file():
    with NetnsCluster(2) as cluster:
        slot, root = cluster.slot, cluster.root
        before = leftovers(slot)
        assert sorted(before["namespaces"]) == [h.name for h in cluster.hosts]
        assert set(before["links"]) == {bridge_name(slot)} | {h.veth for h in cluster.hosts}
        pids = [p for h in cluster.hosts for p in netns_pids(h.name)]
        sshd = [h.sshd.pid for h in cluster.hosts]
        assert set(sshd) <= set(pids)
        assert state_path(slot).exists() and root.is_dir()
    assert leftovers(slot) == {"namespaces": [], "links": [], "etc": []}
    assert [p for p in pids if alive(p)] == []
    assert not state_path(slot).exists() and not root.exists()
    assert slot_owner(slot) == "free"
    prefix = bridge_name(slot).removesuffix("br")  # "pdl-" for slot 0
    ns_list = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert prefix not in ns_list and f": {prefix}" not in links


def test_a_crashed_run_is_swept_by_the_next(netns: NetnsCluster):
    """A run killed before its finalizers (os._exit: no atexit either) leaves namespaces and
    a live sshd; the next run's setup removes them."""
    code = (
        "import os\n"
        "from tests.support.netns import NetnsCluster\n"
        "c = NetnsCluster(1).start()\n"
        "print(c.slot, c.hosts[0].name, flush=True)\n"
        "os._exit(3)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 3, res.stderr
    slot_s, name = res.stdout.split()
    slot = int(slot_s)
    assert slot != netns.slot
    pids = netns_pids(name)
    assert pids and all(alive(p) for p in pids)  # its sshd outlived it
    assert slot_owner(slot) == "stale"
    swept = sweep_stale()
    assert slot in swept or not netns_pids(name)  # (or a concurrent run's sweep was first)
    assert not any(leftovers(slot).values())
    assert [p for p in pids if alive(p)] == []
    assert not state_path(slot).exists()
    assert slot_owner(netns.slot) == "live"  # a live cluster is never swept
    assert all(connect_s(h.address) is not None for h in netns.hosts)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "netns_cluster.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_up_status_down(netns: NetnsCluster):
    """The human script: ``up`` leaves a cluster that outlives it and that test runs' sweeps
    leave alone, ``status`` shows it, ``down`` removes it and nothing else."""
    up = cli("up", "2")
    assert up.returncode == 0, up.stderr
    slot = int(re.search(r"^slot (\d+):", up.stdout, re.M).group(1))
    assert slot != netns.slot and slot_owner(slot) == "persistent"
    names = [namespace_name(slot, i) for i in (1, 2)]
    try:
        assert "ssh -F " in up.stdout and names[0] in up.stdout
        assert slot not in sweep_stale()
        assert sorted(leftovers(slot)["namespaces"]) == names
        assert connect_s(host_address(slot, 2)) is not None  # its sshd outlived the script
        status = cli("status")
        assert status.returncode == 0
        assert f"slot {slot}: persistent" in status.stdout
        assert host_address(slot, 1) in status.stdout
        assert f"slot {netns.slot}: live" in status.stdout
    finally:
        down = cli("down", "--slot", str(slot))  # only ours: a concurrent run may have one too
    assert down.returncode == 0, down.stderr
    assert not any(leftovers(slot).values()) and not state_path(slot).exists()
    assert slot_owner(netns.slot) == "live"  # a test run's live cluster is never taken down
    assert all(connect_s(h.address) is not None for h in netns.hosts)


def test_cli_bad_input_is_a_message_not_a_traceback():
    res = cli("up", "0")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "1..200 hosts" in res.stderr
    res = cli("netem", "pdl-nope", "--loss", "5")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "pdl-nope" in res.stderr
