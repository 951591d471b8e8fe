"""`pdlaunch check` of a topology whose hosts are names without `address:` (plan/node_addr.py),
over real sshd hosts: each engine host runs the scripts' own resolution over SSH
(node_addr.resolve), and decode dials the prefill side channel at the address the prefill's
node resolved, not at the name. The name is `localhost` (sshd hosts listen on 127.0.0.1, an
address of `lo` here); the cases that need other names are judged from captured output in
tests/fixtures/check/cases/node_addr.resolve/ and run for real in
tests/system/netns/test_node_addr_on_node.py.
"""

from __future__ import annotations

import pytest

from pdlaunch.check.results import Status
from pdlaunch.check.runner import CheckOptions, run_check
from pdlaunch.hosts import ConnectOptions
from tests.support.check_over_ssh import fake_python, free_port, host_of, plan_of, rows, ssh_of


@pytest.mark.ssh
def test_named_hosts_resolve_on_their_node_and_are_dialled_there(
    tmp_path, sshd_hosts, sshd_cluster
):
    h0, h1, h2 = sshd_hosts(3)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    py = fake_python(tmp_path, "venv", "0.32.0")
    side = free_port()
    topo = {
        "deployment": "check-by-name",
        "model": {"name": str(model)},
        "hosts": {"localhost": {"local": False}},
        "defaults": {"ssh": ssh_of(h0, sshd_cluster), "env": {"PDLAUNCH_PYTHON": str(py)}},
        "prefill": [
            {
                "host": "localhost",
                "device": "cpu",
                "port": free_port(),
                "side_channel_port": side,
                "ssh": ssh_of(h1, sshd_cluster),
            }
        ],
        "decode": [
            {
                "host": "localhost",
                "device": "cpu",
                "port": free_port(),
                "side_channel_port": free_port(),
                "ssh": ssh_of(h2, sshd_cluster),
            }
        ],
        "router": {"host": "localhost", "port": free_port()},
    }
    _, plan = plan_of(tmp_path, topo)
    assert all(p.node_addr is not None for p in plan.processes if p.role != "router")
    # The hosts are reached by the name: trust their keys under it.
    known = tmp_path / "known_hosts"
    known.write_text(
        "".join(
            h.host_key_line().replace("[127.0.0.1]", "[localhost]") + "\n" for h in (h0, h1, h2)
        )
    )
    report = run_check(plan, CheckOptions(connect=ConnectOptions(known_hosts=str(known))))

    assert [h.reachable for h in report.hosts] == [True, True, True]
    prefill, decode, router = (host_of(report, n) for n in ("prefill-0", "decode-0", "router"))
    for target in (prefill, decode):
        (r,) = rows(report, "node_addr.resolve", target)
        assert r.status is Status.OK, r
        assert r.data == {"name": "localhost", "address": "127.0.0.1"}
        assert "loopback: every engine runs on this machine" in r.message
    assert not rows(report, "node_addr.resolve", router)  # the router has no side channel

    (reach,) = [
        r
        for r in rows(report, "ports.reach", "decode-0 -> prefill-0")
        if r.data.get("port") == side
    ]
    # dialled at what the prefill's node resolved, with check's listener bound there
    assert reach.data["host"] == "127.0.0.1"
    assert reach.status is Status.OK and reach.data["held"] is True
