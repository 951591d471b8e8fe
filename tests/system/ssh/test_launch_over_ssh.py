"""`up`/`status`/`logs`/`down` through a real sshd (tests/support/sshd.py): every host in the
topology is 127.0.0.1 forced over SSH, so all commands, uploads and starts go through OpenSSH."""

from __future__ import annotations

import json
import os
import stat

import pytest

from pdlaunch.runtime.record_store import load_state
from tests.support.deployments import SECRET_ENV, cli
from tests.support.processes import procs_under, wait_no_procs
from tests.support.sshd import free_port, keygen

pytestmark = pytest.mark.ssh


def _ssh(cluster, h, **over) -> dict:
    d = {"user": cluster.user, "port": h.port, "key": str(cluster.key_file), "connect_timeout": 5}
    d.update(over)
    return d


def test_up_over_ssh_happy_path(make_deployment, sshd_cluster, sshd_host, monkeypatch):
    secret = "ssh-s3cr3t-" + os.urandom(6).hex()
    monkeypatch.setenv(SECRET_ENV, secret)
    dep = make_deployment(
        "sshok",
        ssh=_ssh(sshd_cluster, sshd_host),
        env={"HF_TOKEN": "${env:" + SECRET_ENV + "}", "FAKE_VLLM_REQUIRE_ENV": "HF_TOKEN"},
    )
    before = sshd_host.log_file.read_text().count("Accepted publickey")
    res = cli("up", dep.path, "--timeout", "120", "--known-hosts", sshd_cluster.known_hosts)
    assert res.exit_code == 0, res.output
    assert "served disaggregated" in res.output
    # it really went through sshd: one login (one connection shared by every command)
    logins = sshd_host.log_file.read_text().count("Accepted publickey") - before
    assert logins == 1, sshd_host.log_tail(30)
    st = load_state("sshok")
    assert st.known_hosts == str(sshd_cluster.known_hosts)
    assert all(not p.local for p in st.processes)
    assert sorted(procs_under(dep.work_root)) == sorted(p.pid for p in st.processes)
    f = dep.work_dir / "run" / "decode-0.secrets.env"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600

    # later commands reuse the recorded known_hosts
    res = cli("status", dep.path, "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["processes"]
    assert all(r["alive"] and r["health"] == "healthy" for r in rows), rows
    res = cli("logs", dep.path, "router")
    assert res.exit_code == 0 and "serving on" in res.output
    res = cli("down", dep.path)
    assert res.exit_code == 0, res.output
    assert wait_no_procs(dep.work_root) == []
    assert not f.exists()
    assert secret not in res.output


def test_closed_ssh_port_is_a_clean_error(make_deployment, sshd_cluster, sshd_host):
    dep = make_deployment("closed", ssh=_ssh(sshd_cluster, sshd_host, port=free_port()))
    res = cli("up", dep.path, "--known-hosts", sshd_cluster.known_hosts)
    assert res.exit_code == 1
    assert "cannot reach 1 host(s)" in res.output and "connection refused" in res.output
    assert "nothing was started" in res.output
    assert "Traceback" not in res.output
    assert not dep.work_root.exists()
    assert load_state("closed") is None


def test_wrong_key_is_refused(make_deployment, sshd_cluster, sshd_host, tmp_path):
    other = keygen(tmp_path / "not-authorized")
    dep = make_deployment("wrongkey", ssh=_ssh(sshd_cluster, sshd_host, key=str(other)))
    cfg = tmp_path / "ssh_config"  # no agent/default keys from ~/.ssh may rescue the login
    cfg.write_text("Host *\n    IdentitiesOnly yes\n    IdentityAgent none\n")
    res = cli("up", dep.path, "--known-hosts", sshd_cluster.known_hosts, "--ssh-config", cfg)
    assert res.exit_code == 1
    assert "cannot reach 1 host(s)" in res.output
    assert "auth" in res.output.lower()
    assert not dep.work_root.exists()
    assert load_state("wrongkey") is None


def test_unknown_host_key_refused_unless_accepted(
    make_deployment, sshd_cluster, sshd_host, tmp_path
):
    known = tmp_path / "known_hosts"
    known.write_text("")
    dep = make_deployment("hostkey", ssh=_ssh(sshd_cluster, sshd_host))
    res = cli("up", dep.path, "--known-hosts", known, "--no-canary")
    assert res.exit_code == 1
    assert "host key" in res.output.lower() and "--accept-new-host-keys" in res.output
    assert not dep.work_root.exists()

    res = cli(
        "up",
        dep.path,
        "--known-hosts",
        known,
        "--accept-new-host-keys",
        "--no-canary",
        "--timeout",
        "120",
    )
    assert res.exit_code == 0, res.output
    assert f"[127.0.0.1]:{sshd_host.port}" in known.read_text()  # recorded
    assert cli("down", dep.path).exit_code == 0  # the recorded key is trusted now
    assert wait_no_procs(dep.work_root) == []


def test_exit_at_start_over_ssh_leaves_no_orphans(make_deployment, sshd_cluster, sshd_host):
    dep = make_deployment(
        "sshexit",
        ssh=_ssh(sshd_cluster, sshd_host),
        prefill_env={"FAKE_VLLM_MODE": "exit", "FAKE_VLLM_DELAY": "0.5"},
    )
    res = cli("up", dep.path, "--known-hosts", sshd_cluster.known_hosts, "--timeout", "120")
    assert res.exit_code == 1
    assert "prefill-0 on 127.0.0.1: exited during start" in res.output
    assert "simulated engine failure" in res.output
    assert wait_no_procs(dep.work_root) == []
    # Nothing recorded after the rollback: `down FILE` searches the host (same SSH options).
    res = cli("down", dep.path, "--known-hosts", sshd_cluster.known_hosts)
    assert res.exit_code == 0 and "no process of it runs" in res.output, res.output
    res = cli("down", dep.path)  # the host key is unknown without them: refused, said why
    assert res.exit_code == 1 and "127.0.0.1" in res.output, res.output


def test_preflight_reuses_ups_connection(make_deployment, sshd_cluster, sshd_host):
    """The preflight check inside `up` runs on `up`'s own connection: one SSH login per host
    for the survey and the whole check (a second handshake per host cost a round trip or
    more at every host)."""
    import socket

    dep = make_deployment("sshpre", ssh=_ssh(sshd_cluster, sshd_host))
    port = dep.spec["prefill"][0]["port"]
    before = sshd_host.log_file.read_text().count("Accepted publickey")
    with socket.socket() as sock:  # a taken port: the check must run over SSH and FAIL
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        res = cli(
            "up",
            dep.path,
            "--with-check",
            "--known-hosts",
            sshd_cluster.known_hosts,
            "--timeout",
            "60",
        )
    assert res.exit_code == 1, res.output
    assert "preflight check failed" in res.output and str(port) in res.output
    logins = sshd_host.log_file.read_text().count("Accepted publickey") - before
    assert logins == 1, sshd_host.log_tail(30)
    assert load_state("sshpre") is None
