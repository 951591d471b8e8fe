"""`pdlaunch check` end to end: real sshd "hosts" on loopback (tests/support/sshd.py), the real
probe commands, the real parsers. The hardware tools are absent here, so the check must say
FAIL where the plan needs them and SKIP where it does not; a port this test occupies, a vLLM
version mismatch this test sets up and an unreachable host must all be found."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdlaunch.check.results import Status
from pdlaunch.check.runner import run_check
from tests.support.check_over_ssh import (
    fake_python,
    free_port,
    host_of,
    opts,
    plan_of,
    rows,
    ssh_of,
)
from tests.support.sshd import free_ports


@pytest.fixture
def cuda_cpu(tmp_path, model_dir, sshd_hosts, sshd_cluster):
    """prefill: cuda on sim host 1 (PDLAUNCH_PYTHON -> vllm 0.32.0); decode: cpu on sim
    host 2 (vllm_bin in a venv whose python sees vllm 0.31.1); router on sim host 0."""
    h0, h1, h2 = sshd_hosts(3)
    py_a = fake_python(tmp_path, "venvA", "0.32.0")
    py_b = fake_python(tmp_path, "venvB", "0.31.1")
    ports = free_ports("p_http", "d_http", "p_side", "d_side", "router")
    topo = {
        "deployment": "check-e2e",
        "model": {"name": str(model_dir)},
        "hosts": {"127.0.0.1": {"local": False}},
        "defaults": {"ssh": ssh_of(h0, sshd_cluster)},
        "prefill": [
            {
                "host": "127.0.0.1",
                "device": "cuda",
                "block_size": 128,
                "port": ports["p_http"],
                "side_channel_port": ports["p_side"],
                "ssh": ssh_of(h1, sshd_cluster),
                "env": {"PDLAUNCH_PYTHON": str(py_a)},
            }
        ],
        "decode": [
            {
                "host": "127.0.0.1",
                "device": "cpu",
                "port": ports["d_http"],
                "side_channel_port": ports["d_side"],
                "ssh": ssh_of(h2, sshd_cluster),
                "vllm_bin": str(py_b.parent / "vllm"),
            }
        ],
        "router": {"host": "127.0.0.1", "port": ports["router"]},
    }
    path, plan = plan_of(tmp_path, topo)
    return path, plan, ports


# ------------------------------------------------------------------------ end to end


@pytest.mark.ssh
def test_check_over_sshd_hosts(cuda_cpu, sshd_cluster):
    _, plan, ports = cuda_cpu
    with socket.socket() as busy:  # occupy the prefill HTTP port, as a stray server would
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", ports["p_http"]))
        busy.listen(4)
        report = run_check(plan, opts(sshd_cluster))

    assert report.failed
    assert [h.reachable for h in report.hosts] == [True, True, True]
    prefill, decode, router = (host_of(report, n) for n in ("prefill-0", "decode-0", "router"))
    assert len({prefill, decode, router}) == 3  # three sshd hosts, one address
    assert prefill.startswith("127.0.0.1:ssh")

    # hardware tools: absent -> FAIL where the plan needs them (cuda host), else SKIP
    if shutil.which("nvidia-smi") is None:
        (r,) = rows(report, "nvidia.smi", prefill)
        assert r.status is Status.FAIL and "nvidia-smi not found" in r.message and r.fix
    assert not rows(report, "nvidia.smi", decode)  # a cpu host is not asked for GPUs
    if not Path("/sys/class/infiniband").exists():
        # UCX_TLS=ib,rc,cuda_copy puts the cuda host on RDMA
        assert [r.status for r in rows(report, "rdma.sysfs", prefill)] == [Status.FAIL]
    assert not rows(report, "rdma.sysfs", decode)  # tcp,self,sm: no RDMA needed
    if shutil.which("ucx_info") is None:
        (need,) = rows(report, "ucx.transports", prefill)
        (opt,) = rows(report, "ucx.transports", decode)
        assert need.status is Status.FAIL  # cuda_copy / rc need a UCX build that has them
        assert opt.status is Status.SKIP and "not needed" in opt.message
    assert rows(report, "nvidia.peermem", prefill)  # GPUDirect RDMA probed on cuda+rdma
    assert not rows(report, "ucx.transports", router)

    # the occupied port, and only it
    listen = {r.data.get("port"): r for r in rows(report, "ports.listen", prefill)}
    assert listen[ports["p_http"]].status is Status.FAIL
    assert "already in use" in listen[ports["p_http"]].message
    assert listen[ports["p_side"]].status is Status.OK
    assert all(r.status is Status.OK for r in rows(report, "ports.listen", decode))
    # router HTTP and its metrics port
    assert [r.status for r in rows(report, "ports.listen", router)] == [Status.OK, Status.OK]

    # versions: each host's own interpreter (PDLAUNCH_PYTHON / python next to vllm_bin)
    (va,) = rows(report, "versions", prefill)
    (vb,) = rows(report, "versions", decode)
    assert (va.status, va.data["vllm"]) == (Status.OK, "0.32.0")
    assert (vb.status, vb.data["vllm"]) == (Status.OK, "0.31.1")
    assert not rows(report, "versions", router)
    cluster = rows(report, "versions.cluster", "cluster")
    vllm_row = next(r for r in cluster if "vllm differs" in r.message)
    assert vllm_row.status is Status.FAIL
    assert "0.32.0" in vllm_row.message and "0.31.1" in vllm_row.message

    # model path checked on every engine host
    assert [r.status for r in rows(report, "model.path")] == [Status.OK, Status.OK]

    # pairs: decode -> prefill side channel, router -> both HTTP ports
    assert report.pairs == ["decode-0 -> prefill-0", "router -> prefill-0", "router -> decode-0"]
    (side,) = rows(report, "ports.reach", "decode-0 -> prefill-0")
    assert side.status is Status.OK and f":{ports['p_side']}" in side.message
    # nothing listens yet: check holds the free port with its own listener while decode's
    # host connects, so a firewall that rejects could not pass for an empty port
    assert side.data["result"] == "open" and side.data["held"] is True
    (http,) = rows(report, "ports.reach", "router -> prefill-0")
    assert http.data["result"] == "open" and http.status is Status.OK  # our listener
    assert {r.target for r in rows(report, "ports.reach")} == set(report.pairs)

    # JSON is serialisable and grouped rows cover everything
    doc = json.loads(json.dumps(report.to_dict()))
    assert doc["ok"] is False and doc["counts"]["FAIL"] >= 4
    assert sum(len(rs) for _, _, rs in report.groups()) == len(report.results)


@pytest.mark.ssh
def test_check_cli_json_exit_codes(cuda_cpu, sshd_cluster, tmp_path):
    from pdlaunch.cli import app

    path, _, _ = cuda_cpu
    runner = CliRunner()
    res = runner.invoke(
        app,
        ["check", str(path), "--json", "--fast", "--known-hosts", str(sshd_cluster.known_hosts)],
    )
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert doc["fast"] is True and doc["ok"] is False
    assert {r["probe"] for r in doc["results"]} >= {"versions", "ports.listen", "ports.reach"}
    # table output: same exit status, rows grouped by host and pair
    res = runner.invoke(app, ["check", str(path), "--known-hosts", str(sshd_cluster.known_hosts)])
    assert res.exit_code == 1
    assert "decode-0" in res.output and "FAIL" in res.output and "3 pair(s)" in res.output
    # unreadable input: 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("deployment: [\n")
    assert runner.invoke(app, ["check", str(bad)]).exit_code == 2


@pytest.mark.ssh
def test_unreachable_host_is_a_fail_row_not_a_crash(tmp_path, model_dir, sshd_hosts, sshd_cluster):
    h0, h1 = sshd_hosts(2)
    py = fake_python(tmp_path, "venv", "0.32.0")
    dead = free_port()  # nothing listens there: connection refused
    topo = {
        "deployment": "check-dead",
        "model": {"name": str(model_dir)},
        "hosts": {"127.0.0.1": {"local": False}},
        "defaults": {"ssh": ssh_of(h0, sshd_cluster), "env": {"PDLAUNCH_PYTHON": str(py)}},
        "prefill": [
            {
                "host": "127.0.0.1",
                "device": "cpu",
                "port": free_port(),
                "side_channel_port": free_port(),
                "ssh": ssh_of(h1, sshd_cluster),
            }
        ],
        "decode": [
            {
                "host": "127.0.0.1",
                "device": "cpu",
                "port": free_port(),
                "side_channel_port": free_port(),
                "ssh": {**ssh_of(h1, sshd_cluster), "port": dead},
            }
        ],
        "router": {"host": "127.0.0.1", "port": free_port()},
    }
    _, plan = plan_of(tmp_path, topo)
    report = run_check(plan, opts(sshd_cluster))
    decode = host_of(report, "decode-0")
    (conn,) = rows(report, "host.connect")
    assert conn.target == decode and conn.status is Status.FAIL
    assert str(dead) in conn.message and "ssh -p" in conn.fix
    assert not [r for r in report.results if r.target == decode and r.probe != "host.connect"]
    # the others were checked all the same
    prefill = host_of(report, "prefill-0")
    assert [r.status for r in rows(report, "versions", prefill)] == [Status.OK]
    assert rows(report, "ports.listen", host_of(report, "router"))
    (skip,) = rows(report, "ports.reach", "decode-0 -> prefill-0")
    assert skip.status is Status.SKIP and "unreachable" in skip.message
    # the router still reaches the decode HTTP port (the network is fine, only ssh is not)
    assert rows(report, "ports.reach", "router -> decode-0")[0].status is Status.OK
    assert report.failed


@pytest.mark.ssh
def test_ascend_pair_and_cluster_rows(tmp_path, sshd_hosts, sshd_cluster):
    """Ascend over Mooncake: the NPU tools are absent, so every NPU probe FAILs; the ping
    pair cannot learn decode NPU addresses and says so, with --fast (`up`) too."""
    h0, h1, h2 = sshd_hosts(3)
    py = fake_python(tmp_path, "venv", "0.32.0")
    topo = {
        "deployment": "check-ascend",
        "model": {"name": "Qwen/Qwen3-8B"},  # a hub id: no model.path probe
        "hosts": {"127.0.0.1": {"local": False}},
        "defaults": {"ssh": ssh_of(h0, sshd_cluster), "env": {"PDLAUNCH_PYTHON": str(py)}},
        "prefill": [
            {
                "host": "127.0.0.1",
                "device": "npu",
                "port": free_port(),
                "tp": 2,
                "devices": [0, 1],
                "kv_port": free_port(),
                "ssh": ssh_of(h1, sshd_cluster),
            }
        ],
        "decode": [
            {
                "host": "127.0.0.1",
                "device": "npu",
                "port": free_port(),
                "tp": 2,
                "devices": [2, 3],
                "kv_port": free_port(),
                "ssh": ssh_of(h2, sshd_cluster),
            }
        ],
        "kv_connector": {"kind": "mooncake"},
        "router": {
            "host": "127.0.0.1",
            "port": free_port(),
            "kind": "toy-proxy",
            "binary": "/opt/proxy.py",
        },
    }
    _, plan = plan_of(tmp_path, topo)
    report = run_check(plan, opts(sshd_cluster))
    prefill = host_of(report, "prefill-0")
    if shutil.which("npu-smi") is None:
        for probe in (
            "ascend.npu_smi",
            "ascend.link",
            "ascend.link_stat",
            "ascend.ip",
            "ascend.tls",
        ):
            assert [r.status for r in rows(report, probe, prefill)] == [Status.FAIL], probe
    if not Path("/etc/hccn.conf").exists():
        assert rows(report, "ascend.hccn_conf", prefill)[0].status is Status.FAIL
    assert not rows(report, "ucx.transports")  # Mooncake: no UCX
    assert not rows(report, "model.path")
    (ping,) = rows(report, "ascend.ping", "prefill-0 -> decode-0")
    assert ping.status is Status.SKIP and "unknown" in ping.message
    (tls,) = rows(report, "ascend.tls.cluster", "cluster")
    assert tls.status is Status.SKIP
    (ver,) = rows(report, "versions.cluster", "cluster")
    assert ver.status is Status.OK  # same interpreter everywhere
    # decode reaches both Mooncake producer ports of the TP2 prefill
    assert len(rows(report, "ports.reach", "decode-0 -> prefill-0")) == 2

    # `up`'s preflight (--fast) pings the NPUs too (Ascend guide, Parameter Plane
    # Connectivity step 5), and looks for link flapping (step 2)
    fast = run_check(plan, opts(sshd_cluster, fast=True))
    assert fast.fast
    (fping,) = rows(fast, "ascend.ping", "prefill-0 -> decode-0")
    assert fping.status is Status.SKIP and "unknown" in fping.message
    assert rows(fast, "ascend.npu_smi") and rows(fast, "ascend.link_stat")
