"""One notion of "local" and of a port clash (pdlaunch/spec/addresses.py), used alike by the
port-conflict rule, the side-channel allocation, the plan's `local` and the hosts layer."""

from __future__ import annotations

import pytest
import yaml

from pdlaunch import hosts
from pdlaunch.plan.build import build_plan
from pdlaunch.rules import validate
from pdlaunch.spec.addresses import (
    binds_overlap,
    is_local_control_host,
    is_loopback,
    listeners_clash,
    same_machine,
)
from pdlaunch.spec.load import load_text


def topology(prefill: dict, decode: dict, **top) -> dict:
    """Two CPU instances and a router on this machine (the tests' stand-in for two hosts)."""
    data = {
        "deployment": "t",
        "model": {"name": "m"},
        "prefill": [{"device": "cpu", "port": 8100, **prefill}],
        "decode": [{"device": "cpu", "port": 8200, **decode}],
        "router": {"host": "127.0.0.1", "bind": "127.0.0.1"},
    }
    data.update(top)
    return data


def errors(data: dict) -> list:
    topo, source = load_text(yaml.safe_dump(data, sort_keys=False), "t.yaml")
    return [f for f in validate(topo, source) if f.severity == "error"]


def side_channel_ports(data: dict) -> dict[str, int]:
    topo, _ = load_text(yaml.safe_dump(data, sort_keys=False), "t.yaml")
    return {
        p.name: p.ports[-1].port
        for p in build_plan(topo).processes
        if p.ports and p.ports[-1].kind == "nixl_side_channel"
    }


# The user report: a prefill on 127.0.0.2 (its own sshd: another host to pdlaunch) and a
# decode on 127.0.0.1, each binding its own address, with the guide's side channel 5600.
TWO_LOOPBACKS = topology(
    {"host": "127.0.0.2", "bind": "127.0.0.2", "side_channel_port": 5600},
    {"host": "127.0.0.1", "bind": "127.0.0.1", "side_channel_port": 5600},
    hosts={"127.0.0.2": {"local": False}},
)


def test_side_channels_on_127_0_0_2_and_127_0_0_1_do_not_clash():
    # The side channel binds VLLM_NIXL_SIDE_CHANNEL_HOST (the node's host): two addresses.
    assert errors(TWO_LOOPBACKS) == []


def test_allocation_agrees_with_the_rule_on_distinct_loopback_addresses():
    auto = topology(
        {"host": "127.0.0.2", "bind": "127.0.0.2"}, {"host": "127.0.0.1", "bind": "127.0.0.1"}
    )
    assert errors(auto) == []
    assert side_channel_ports(auto) == {"prefill-0": 5600, "decode-0": 5600}


def test_same_address_same_side_channel_port_clashes():
    data = topology(
        {"host": "127.0.0.1", "side_channel_port": 5600},
        {"host": "127.0.0.1", "side_channel_port": 5600},
    )
    found = [f for f in errors(data) if f.rule == "port-conflict"]
    assert found and "5600" in found[0].message


def test_wildcard_and_loopback_bind_on_one_machine_clash():
    data = topology(
        {"host": "127.0.0.1", "bind": "0.0.0.0", "port": 8100},
        {"host": "127.0.0.1", "bind": "127.0.0.1", "port": 8100},
    )
    found = [f for f in errors(data) if f.rule == "port-conflict"]
    assert found and found[0].field == ("decode", 0, "port")
    # Control: the wildcard on another loopback address is still this machine.
    data["decode"][0].update(host="127.0.0.2", bind="127.0.0.2")
    assert [f.rule for f in errors(data)] == ["port-conflict"]
    # ... and two specific addresses share the port.
    data["prefill"][0]["bind"] = "127.0.0.1"
    assert errors(data) == []


def test_localhost_and_127_0_0_1_are_one_machine():
    assert same_machine("localhost", "127.0.0.1") and same_machine("LOCALHOST.", "127.1")
    clash = topology(
        {"host": "localhost", "side_channel_port": 5600},
        {"host": "127.0.0.1", "side_channel_port": 5600},
    )
    assert [f.rule for f in errors(clash)] == ["port-conflict"]
    # Automatic bases see the one machine too (they were keyed by spelling: both got 5600).
    auto = topology({"host": "localhost"}, {"host": "127.0.0.1"})
    assert errors(auto) == []
    assert side_channel_ports(auto) == {"prefill-0": 5600, "decode-0": 5601}


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("0.0.0.0", "127.0.0.1", True),
        ("::", "10.0.0.1", True),
        ("0", "127.0.0.1", True),  # legacy spelling of 0.0.0.0
        ("127.0.0.1", "127.0.0.1", True),
        ("127.1", "127.0.0.1", True),
        ("localhost", "127.0.0.1", True),
        ("localhost", "::1", True),
        ("127.0.0.2", "127.0.0.1", False),
        ("10.0.0.1", "10.0.0.2", False),
        ("node1", "10.0.0.1", True),  # a name may resolve to it: the safe answer
    ],
)
def test_binds_overlap(a, b, overlap):
    assert binds_overlap(a, b) is overlap and binds_overlap(b, a) is overlap


def test_listeners_clash_needs_one_machine_and_overlapping_binds():
    assert listeners_clash("127.0.0.1", "0.0.0.0", "localhost", "127.0.0.1")
    assert not listeners_clash("127.0.0.2", "127.0.0.2", "127.0.0.1", "127.0.0.1")
    assert not listeners_clash("10.0.0.1", "0.0.0.0", "10.0.0.2", "0.0.0.0")


SPELLINGS = ["127.0.0.1", "localhost", "LocalHost.", "::1", "[::1]", "127.1", "127.0.0.2",
             "10.0.0.1", "gpu-node-1", "localhost.example"]  # fmt: skip


@pytest.mark.parametrize("host", SPELLINGS)
def test_plan_and_hosts_layer_agree_on_local(host):
    # The plan's `local` (no SSH) and open_host's LocalHost/SshHost choice are one predicate.
    assert hosts.is_local_address(host) is is_local_control_host(host)
    opened = hosts.open_host(host, connect=False)
    assert isinstance(opened, hosts.LocalHost) is is_local_control_host(host)
    if host.startswith("["):
        return  # the topology schema takes bare addresses only
    spec = topology({"host": host}, {"host": host})
    spec["router"] = {"host": host}
    topo, _ = load_text(yaml.safe_dump(spec, sort_keys=False), "t.yaml")
    assert {p.local for p in build_plan(topo).processes} == {is_local_control_host(host)}


def test_local_control_host_is_a_loopback_subset():
    assert is_local_control_host("127.0.0.1") and is_local_control_host("::1")
    assert not is_local_control_host("127.0.0.2") and is_loopback("127.0.0.2")
    assert all(is_loopback(h) for h in SPELLINGS if is_local_control_host(h))


def test_cpu_cores_are_shared_by_every_spelling_of_one_machine():
    # localhost and 127.0.0.1 are one machine: their CPU instances must not both get core 0.
    data = topology({"host": "localhost"}, {"host": "127.0.0.1"})
    topo, _ = load_text(yaml.safe_dump(data, sort_keys=False), "t.yaml")
    binds = {
        p.name: p.env.get("VLLM_CPU_OMP_THREADS_BIND")
        for p in build_plan(topo).processes
        if p.role != "router"
    }
    assert binds["prefill-0"] != binds["decode-0"], binds


def _plan(data: dict):
    topo, _ = load_text(yaml.safe_dump(data, sort_keys=False), "t.yaml")
    return {p.name: p for p in build_plan(topo).processes}


def test_host_settings_are_keyed_by_the_address_as_written():
    """Issue 26: settings written for 127.0.0.30 (its own sshd: another host to pdlaunch) are
    not those of a router on 127.0.0.1, though both are this machine; `up` dialled the router
    over SSH on 127.0.0.30's port and failed."""
    data = topology(
        {"host": "127.0.0.30", "bind": "127.0.0.30"},
        {"host": "127.0.0.30", "bind": "127.0.0.30", "port": 8201},
        hosts={
            "127.0.0.30": {
                "local": False,
                "ssh": {"port": 2222, "key": "/k/id"},
                "env": {"ONLY_ON_30": "1"},
                "work_dir": "/w30",
            }
        },
    )
    assert errors(data) == []
    procs = _plan(data)
    for name in ("prefill-0", "decode-0"):
        p = procs[name]
        assert (p.local, p.ssh.port, p.ssh.key) == (False, 2222, "/k/id")
        assert p.env.get("ONLY_ON_30") == "1" and p.work_dir.startswith("/w30/")
    router = procs["router"]
    assert router.local is True and router.ssh.port is None and router.ssh.key is None
    assert "ONLY_ON_30" not in router.env and not router.work_dir.startswith("/w30/")


def test_host_settings_follow_other_spellings_of_the_same_address_only():
    # 127.1 is 127.0.0.1 (the C resolver's legacy form); localhost is another name (it may be
    # ::1): settings for it do not reach a node written 127.0.0.1
    data = topology(
        {"host": "127.0.0.1", "bind": "127.0.0.1"},
        {"host": "localhost", "bind": "127.0.0.1", "port": 8201},
        hosts={"LocalHost.": {"env": {"B": "1"}}, "127.1": {"env": {"A": "1"}}},
    )
    assert errors(data) == []
    procs = _plan(data)
    assert procs["prefill-0"].env.get("A") == "1" and "B" not in procs["prefill-0"].env
    assert procs["decode-0"].env.get("B") == "1" and "A" not in procs["decode-0"].env
    # still one machine for ports: the same port on both spellings clashes
    assert same_machine("127.1", "localhost")
