"""`up` over a real sshd of a deployment whose hosts are written as a name without `address:`
(plan/node_addr.py): each engine's script resolves the name on its node and hands vLLM the
address, read back here from the running stand-in engine's own environment (/proc/PID/environ).
The name is `localhost`, the one every machine's /etc/hosts answers without DNS."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdlaunch.runtime.record_store import load_state
from tests.support.deployments import cli
from tests.support.processes import wait_no_procs

pytestmark = pytest.mark.ssh


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_up_hands_each_engine_the_address_its_node_resolved(
    make_deployment, sshd_cluster, sshd_host, tmp_path
):
    ssh = {"user": sshd_cluster.user, "port": sshd_host.port, "key": str(sshd_cluster.key_file)}
    dep = make_deployment("byname", host="localhost", ssh=ssh)
    known = tmp_path / "known_hosts"  # the host is reached by the name: its key under it
    known.write_text(sshd_host.host_key_line().replace("[127.0.0.1]", "[localhost]") + "\n")
    res = cli("up", dep.path, "--timeout", "120", "--known-hosts", known)
    assert res.exit_code == 0, res.output
    try:
        st = load_state("byname")
        engines = [p for p in st.processes if p.name != "router"]
        assert len(engines) == 2 and all(not p.local for p in engines)
        for p in engines:
            env = _environ(p.pid)
            assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1", p.name
            assert "PDLAUNCH_NODE_ADDR" not in env  # the script's own variable stays there
        script = (dep.work_dir / "prefill-0.sh").read_text()
        assert 'export VLLM_NIXL_SIDE_CHANNEL_HOST="${PDLAUNCH_NODE_ADDR}"' in script
    finally:
        res = cli("down", dep.path, "--known-hosts", known)
    assert res.exit_code == 0, res.output
    assert wait_no_procs(dep.work_root) == []
