"""Where decode dials a side channel its node resolves at start (check/reach.py
``resolved_reaches``): at the address the node's node_addr.resolve row found, else at the name
as written. Over real sshd hosts: tests/system/ssh/test_check_node_addr_over_ssh.py."""

from __future__ import annotations

from pathlib import Path

from pdlaunch.check.reach import Reach, reach_pairs, resolved_reaches
from pdlaunch.check.results import CheckResult, Status
from pdlaunch.check.targets import HostTarget
from pdlaunch.plan.build import build_plan
from pdlaunch.spec.load import load


def test_a_side_channel_is_dialled_where_its_node_resolved_it():
    target = HostTarget("gpu-a01", "gpu-a01", False, {}, [])
    r = Reach("decode-0", "prefill-0", "gpu-a01", 5600, "NIXL side channel", "gpu-a01")
    failed = CheckResult("node_addr.resolve", "gpu-a01", Status.FAIL, "x", "y", {"name": "gpu-a01"})
    assert resolved_reaches([r], {"prefill-0": target}, [failed]) == [r]
    found = CheckResult(
        "node_addr.resolve",
        "gpu-a01",
        Status.OK,
        "x",
        "",
        {"name": "gpu-a01", "address": "10.0.0.5"},
    )
    (moved,) = resolved_reaches([r], {"prefill-0": target}, [found])
    assert moved.address == "10.0.0.5" and moved.port == 5600
    # a reach to a name that is not resolved on the node (HTTP) is never moved
    http = Reach("router", "prefill-0", "gpu-a01", 8000, "HTTP API")
    assert resolved_reaches([http], {"prefill-0": target}, [found]) == [http]


def test_the_plan_says_which_side_channels_are_resolved_on_their_node():
    fixture = Path(__file__).resolve().parents[1] / "fixtures/topologies/dns-named-cluster.yaml"
    topo, _ = load(fixture)
    reaches = reach_pairs(build_plan(topo))
    side = [r for r in reaches if r.purpose.startswith("NIXL side channel")]
    assert side and {(r.dest, r.resolved_from) for r in side} == {
        ("prefill-0-node0", "gpu-a01.dc1.example.com"),
        ("prefill-0-node1", "gpu-a02.dc1.example.com"),
    }
    assert all(r.resolved_from is None for r in reaches if r not in side)
