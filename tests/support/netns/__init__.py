"""The network-namespace test cluster: ``cluster`` (NetnsCluster, NetnsHost: start, drive,
close), ``namespaces`` (names, system calls, firewall and netem inside a host), ``slots``
(which cluster owns which slot, sweeping leftovers, the shared ARP limits). Their public names
in one place for the tests, ``tests/support/netns_fixtures.py`` and
``scripts/netns_cluster.py``; the module docstring of ``cluster`` describes the cluster."""

from tests.support.netns.cluster import (
    NetnsCluster,
    NetnsHost,
)
from tests.support.netns.namespaces import (
    MAX_HOSTS,
    MAX_SLOTS,
    NetnsError,
    bridge_name,
    host_address,
    leftovers,
    namespace_name,
    netem_state,
    netns_pids,
    parse_slot,
    set_netem,
    ssh_config_text,
    teardown_slot,
    veth_name,
)
from tests.support.netns.slots import (
    ARP_KEYS,
    arp_limits_needed,
    read_arp_limits,
    read_state,
    remove_cluster_files,
    slot_owner,
    state_path,
    sweep_stale,
    sync_arp_limits,
    try_lock,
    unlock,
)

__all__ = [
    "ARP_KEYS",
    "MAX_HOSTS",
    "MAX_SLOTS",
    "NetnsCluster",
    "NetnsError",
    "NetnsHost",
    "arp_limits_needed",
    "bridge_name",
    "host_address",
    "leftovers",
    "namespace_name",
    "netem_state",
    "netns_pids",
    "parse_slot",
    "read_arp_limits",
    "read_state",
    "remove_cluster_files",
    "set_netem",
    "slot_owner",
    "ssh_config_text",
    "state_path",
    "sweep_stale",
    "sync_arp_limits",
    "teardown_slot",
    "try_lock",
    "unlock",
    "veth_name",
]
