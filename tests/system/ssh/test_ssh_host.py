"""SshHost against real sshd processes: connection faults, host keys, ssh_config, ProxyJump,
threads. (Behaviour shared with LocalHost is tested in test_local.py for both.)"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pdlaunch.hosts import (
    HostAuthError,
    HostConnectionError,
    HostError,
    HostKeyError,
    SshHost,
    SshSettings,
    Upload,
    open_host,
)
from tests.support.sshd import free_port, keygen

pytestmark = pytest.mark.ssh


def accepted_logins(h) -> int:
    return h.log_file.read_text().count("Accepted publickey")


# -- connection faults --------------------------------------------------------------------------
def test_closed_port_is_refused_fast(ssh_connect, sshd_host, ssh_settings):
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(HostConnectionError) as ei:
        ssh_connect(sshd_host, ssh=ssh_settings(sshd_host, port=port, connect_timeout=30))
    assert time.monotonic() - t0 < 5  # refused at once, not after the connect timeout
    assert str(ei.value) == f"ssh root@127.0.0.1:{port}: connection refused".replace(
        "root", ssh_settings(sshd_host).user
    )
    assert ei.value.host == "127.0.0.1"


def test_silent_server_times_out(ssh_connect, sshd_host, ssh_settings):
    with socket.socket() as srv:  # accepts TCP, never speaks SSH
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(HostConnectionError, match=f"127.0.0.1:{port}") as ei:
            ssh_connect(sshd_host, ssh=ssh_settings(sshd_host, port=port, connect_timeout=1))
        assert time.monotonic() - t0 < 8
    assert "banner" in str(ei.value) or "did not complete within 1s" in str(ei.value)


def test_wrong_key_is_an_auth_error(ssh_connect, sshd_host, ssh_settings, tmp_path):
    other = keygen(tmp_path / "other_key")
    with pytest.raises(HostAuthError) as ei:
        ssh_connect(sshd_host, ssh=ssh_settings(sshd_host, key_file=str(other)))
    msg = str(ei.value)
    assert "authentication failed for user" in msg
    assert str(other) in msg


def test_missing_key_file(ssh_connect, sshd_host, ssh_settings, tmp_path):
    with pytest.raises(HostAuthError, match="key file not found"):
        ssh_connect(sshd_host, ssh=ssh_settings(sshd_host, key_file=str(tmp_path / "nope")))


def test_unresolvable_host(ssh_connect, sshd_host, ssh_settings):
    with pytest.raises(HostConnectionError, match="cannot resolve host name"):
        ssh_connect(sshd_host, address="no-such-host.invalid")


def test_connect_lazily_and_reconnect_after_drop(sshd_host, ssh_settings, ssh_client_config):
    host = SshHost(sshd_host.host, ssh_settings(sshd_host), ssh_config_file=ssh_client_config)
    try:
        assert not host.is_connected
        assert host.run("echo 1").stdout == "1\n"
        assert host.is_connected
        host._conn.transport.close()  # the connection drops (sshd restart, network blip)
        assert host.run("echo 2").stdout == "2\n"
    finally:
        host.close()
    assert not host.is_connected


# -- host keys ---------------------------------------------------------------------------------
def test_unknown_host_key_is_refused_by_default(ssh_connect, sshd_host, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  UserKnownHostsFile {kh}\n  GlobalKnownHostsFile none\n")
    with pytest.raises(HostKeyError) as ei:
        ssh_connect(sshd_host, ssh_config_file=cfg, known_hosts=kh)
    msg = str(ei.value)
    assert f"unknown host key for 127.0.0.1:{sshd_host.port}" in msg
    assert "--accept-new-host-keys" in msg
    assert "SHA256:" in msg
    assert not ei.value.changed
    assert kh.read_text() == ""


def test_accept_new_host_key_records_it(ssh_connect, sshd_host, tmp_path):
    kh = tmp_path / "sub" / "known_hosts"  # parent does not exist yet
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  UserKnownHostsFile {kh}\n  GlobalKnownHostsFile none\n")
    host = ssh_connect(sshd_host, ssh_config_file=cfg, known_hosts=kh, accept_new_host_keys=True)
    assert host.run("echo ok").stdout == "ok\n"
    assert kh.read_text() == sshd_host.host_key_line() + "\n"
    # Next time it is known: works without the flag, and nothing is appended again.
    again = ssh_connect(sshd_host, ssh_config_file=cfg, known_hosts=kh)
    assert again.run("echo ok").stdout == "ok\n"
    ssh_connect(sshd_host, ssh_config_file=cfg, known_hosts=kh, accept_new_host_keys=True)
    assert kh.read_text().count("\n") == 1


def test_accept_new_records_in_user_known_hosts_by_default(ssh_connect, sshd_host, tmp_path):
    kh = tmp_path / "user_known_hosts"
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  UserKnownHostsFile {kh}\n  GlobalKnownHostsFile none\n")
    ssh_connect(sshd_host, ssh_config_file=cfg, known_hosts=None, accept_new_host_keys=True)
    assert kh.read_text() == sshd_host.host_key_line() + "\n"


def test_changed_host_key_is_refused_even_with_accept_new(ssh_connect, sshd_hosts, tmp_path):
    (h,) = sshd_hosts(1, fresh=True)
    kh = tmp_path / "known_hosts"
    kh.write_text(h.host_key_line() + "\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  UserKnownHostsFile {kh}\n  GlobalKnownHostsFile none\n")
    ssh_connect(h, ssh_config_file=cfg, known_hosts=kh).close()
    h.rotate_host_key()  # same address, new key: reinstall or man-in-the-middle
    before = kh.read_text()
    for accept in (False, True):
        with pytest.raises(HostKeyError) as ei:
            ssh_connect(h, ssh_config_file=cfg, known_hosts=kh, accept_new_host_keys=accept)
        assert ei.value.changed
        assert "has CHANGED" in str(ei.value)
        assert f"ssh-keygen -R '[127.0.0.1]:{h.port}'" in str(ei.value)
    assert kh.read_text() == before
    h.stop()


def test_known_hosts_is_parsed_once_for_many_connections_and_again_when_it_changes(
    ssh_connect, sshd_hosts, tmp_path, monkeypatch
):
    # paramiko parses a known_hosts in quadratic time; with one file naming every host, a
    # parse per connection made a whole run cubic in its hosts
    import paramiko

    hosts = sshd_hosts(3)
    kh = tmp_path / "known_hosts"
    kh.write_text("".join(h.host_key_line() + "\n" for h in hosts[:2]))
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  UserKnownHostsFile {kh}\n  GlobalKnownHostsFile none\n")
    parsed: list[str] = []
    real_load = paramiko.HostKeys.load

    def load(self, filename):  # the real parse, counted
        parsed.append(filename)
        return real_load(self, filename)

    monkeypatch.setattr(paramiko.HostKeys, "load", load)
    for h in hosts[:2]:
        assert ssh_connect(h, ssh_config_file=cfg, known_hosts=kh).run("true").ok
    assert parsed == [str(kh)]  # one file (named twice), one parse, two hosts
    with pytest.raises(HostKeyError, match="unknown host key"):
        ssh_connect(hosts[2], ssh_config_file=cfg, known_hosts=kh)
    # recorded by another connection: the file changed, so it is read anew
    ssh_connect(hosts[2], ssh_config_file=cfg, known_hosts=kh, accept_new_host_keys=True)
    assert ssh_connect(hosts[2], ssh_config_file=cfg, known_hosts=kh).run("true").ok
    assert parsed == [str(kh)] * 2


# -- ssh_config, defaults, ProxyJump -------------------------------------------------------------
def test_ssh_config_alias(sshd_hosts, ssh_client_config, sshd_cluster):
    h = sshd_hosts(1)[0]
    host = open_host(
        h.alias, ssh=SshSettings(identities_only=True), ssh_config_file=ssh_client_config
    )
    try:
        assert host.name == h.alias
        assert host.label == f"{sshd_cluster.user}@127.0.0.1:{h.port}"
        assert host.run("pwd").stdout.strip() == str(h.home)
    finally:
        host.close()


def test_home_ssh_config_and_known_hosts_are_used(sshd_host, sshd_cluster, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host box\n  HostName 127.0.0.1\n  Port {sshd_host.port}\n  User {sshd_cluster.user}\n"
        f"  IdentityFile {sshd_cluster.key_file}\n"
    )
    (home / ".ssh" / "known_hosts").write_text(sshd_host.host_key_line() + "\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    host = open_host("box")
    try:
        assert host.run("echo via-home-config").stdout == "via-home-config\n"
    finally:
        host.close()
    # ...and with an empty known_hosts the same host is refused.
    (home / ".ssh" / "known_hosts").write_text("")
    with pytest.raises(HostKeyError):
        open_host("box")


def test_proxy_jump_from_settings(sshd_hosts, ssh_connect, ssh_settings):
    jump, target = sshd_hosts(2)
    n_jump = accepted_logins(jump)
    spec = f"{ssh_settings(jump).user}@127.0.0.1:{jump.port}"
    host = ssh_connect(target, ssh=ssh_settings(target, jump=spec))
    assert host.run("pwd").stdout.strip() == str(target.home)
    assert accepted_logins(jump) == n_jump + 1  # we really logged in to the jump host


def test_proxy_jump_from_ssh_config(sshd_hosts, sshd_cluster, tmp_path):
    jump, target = sshd_hosts(2)
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        sshd_cluster.ssh_config_text([jump])
        + f"Host behind\n  HostName 127.0.0.1\n  Port {target.port}\n  User {sshd_cluster.user}\n"
        f"  IdentityFile {sshd_cluster.key_file}\n  ProxyJump {jump.alias}\n"
        f"  UserKnownHostsFile {sshd_cluster.known_hosts}\n"
        "Host *\n  GlobalKnownHostsFile none\n"
    )
    n_jump = accepted_logins(jump)
    host = open_host("behind", ssh=SshSettings(identities_only=True), ssh_config_file=cfg)
    try:
        assert host.run("pwd").stdout.strip() == str(target.home)
        assert accepted_logins(jump) == n_jump + 1
    finally:
        host.close()


def test_jump_host_failures_name_the_jump_host(sshd_hosts, ssh_connect, ssh_settings, tmp_path):
    jump, target = sshd_hosts(2)
    user = ssh_settings(jump).user
    dead = free_port()
    with pytest.raises(HostConnectionError, match=rf"127.0.0.1:{dead} \(jump host for .*refused"):
        ssh_connect(target, ssh=ssh_settings(target, jump=f"{user}@127.0.0.1:{dead}"))
    # The jump host's key is checked like any other.
    kh = tmp_path / "known_hosts"
    kh.write_text(target.host_key_line() + "\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host *\n  UserKnownHostsFile {kh}\n  GlobalKnownHostsFile none\n")
    with pytest.raises(HostKeyError, match=f"unknown host key for 127.0.0.1:{jump.port}"):
        ssh_connect(
            target,
            ssh=ssh_settings(target, jump=f"{user}@127.0.0.1:{jump.port}"),
            ssh_config_file=cfg,
            known_hosts=kh,
        )
    # The jump host cannot reach the target.
    with pytest.raises(HostConnectionError, match="jump host could not open a connection"):
        ssh_connect(
            target,
            ssh=ssh_settings(target, port=dead, jump=f"{user}@127.0.0.1:{jump.port}"),
        )


# -- socket options ------------------------------------------------------------------------------
def _nodelay(sock: socket.socket) -> bool:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_ssh_socket_has_nagle_off(ssh_connect, sshd_host):
    # Nagle + the server's delayed ACK cost up to 40 ms per command (several small packets
    # per exec); the kernel's default is on, so this fails unless pdlaunch turns it off.
    with socket.create_connection(("127.0.0.1", sshd_host.port)) as plain:
        assert not _nodelay(plain)
    host = ssh_connect(sshd_host)
    assert host.run("echo ok").stdout == "ok\n"
    sock = host._conn.transport.sock
    assert isinstance(sock, socket.socket)
    assert _nodelay(sock)


def test_jump_host_socket_has_nagle_off(sshd_hosts, ssh_connect, ssh_settings):
    jump, target = sshd_hosts(2)
    spec = f"{ssh_settings(jump).user}@127.0.0.1:{jump.port}"
    host = ssh_connect(target, ssh=ssh_settings(target, jump=spec))
    assert host.run("pwd").stdout.strip() == str(target.home)
    # the target's transport rides a channel of the hop: the hop's TCP socket is the wire
    (hop,) = host._hops
    assert isinstance(hop.transport.sock, socket.socket)
    assert _nodelay(hop.transport.sock)
    assert not isinstance(host._conn.transport.sock, socket.socket)


# -- concurrency ---------------------------------------------------------------------------------
def test_one_host_many_threads(ssh_connect, sshd_host):
    host = ssh_connect(sshd_host)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: host.run(f"echo {i}; sleep 0.2").stdout, range(40)))
    assert results == [f"{i}\n" for i in range(40)]


def test_many_hosts_in_parallel(sshd_hosts, ssh_connect, tmp_path):
    hosts = sshd_hosts(4)

    def work(h):
        host = ssh_connect(h)
        host.put_files([Upload(f"host {h.index}\n", "~/marker.txt", 0o600)])
        pid = host.start_tracked("exec sleep 300", pid_file="~/p.pid", log_file="~/l.log").pid
        alive = host.is_alive(pid)
        host.stop(pid, grace=1)
        return alive, host.run("cat ~/marker.txt").stdout

    with ThreadPoolExecutor(len(hosts)) as pool:
        results = list(pool.map(work, hosts))
    # Each simulated host has its own home directory.
    assert results == [(True, f"host {h.index}\n") for h in hosts]


def test_follow_log_while_running_commands(ssh_connect, sshd_host, tmp_path):
    host = ssh_connect(sshd_host)
    f = tmp_path / "busy.log"
    f.write_text("")
    got: list[str] = []
    t = threading.Thread(target=lambda: got.extend(host.follow_log(str(f), lines=10)))
    t.start()
    for i in range(5):
        host.run(f"echo line{i} >> {f}", check=True)
    deadline = time.monotonic() + 10
    while len(got) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    host.close()
    t.join(5)
    assert got == [f"line{i}" for i in range(5)]


def test_errors_are_host_errors_with_plain_messages(ssh_connect, sshd_host, ssh_settings):
    with pytest.raises(HostError) as ei:
        ssh_connect(sshd_host, ssh=ssh_settings(sshd_host, port=free_port()))
    assert "Traceback" not in str(ei.value)
    assert "\n" not in str(ei.value)
