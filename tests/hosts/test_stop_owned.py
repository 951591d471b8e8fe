"""`Host.stop` signals a live process only when pid, start time *and* its log say it is ours
(issue 32, class 2): a record can copy another process's pid and start time from /proc, but
not make it hold the log pdlaunch gave the process. Against LocalHost and a real sshd (both on
this machine, so /proc here is the truth)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdlaunch.hosts import Host, LocalHost, open_host


@pytest.fixture(scope="module")
def _shared_ssh(sshd_host, ssh_settings, ssh_client_config, sshd_cluster):
    host = open_host(sshd_host.host, ssh=ssh_settings(sshd_host), force_ssh=True,
                     ssh_config_file=ssh_client_config,
                     known_hosts=sshd_cluster.known_hosts)  # fmt: skip
    yield host
    host.close()


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def host(request, tmp_path, monkeypatch):
    if request.param == "ssh":
        yield request.getfixturevalue("_shared_ssh")
        return
    monkeypatch.setenv("HOME", str(tmp_path))
    h = LocalHost("127.0.0.1")
    yield h
    h.close()


def alive(pid: int, start: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] not in ("Z", "X", "x") and int(fields[19]) == start


def test_a_live_pid_holding_another_log_is_not_ours(host: Host, tmp_path: Path) -> None:
    d = tmp_path / "stop-owned"
    d.mkdir(mode=0o777, exist_ok=True)
    d.chmod(0o777)  # the sshd user may not be this one
    theirs = host.start_tracked("exec sleep 300", pid_file=str(d / "theirs.pid"),
                                log_file=str(d / "theirs.log"))  # fmt: skip
    assert theirs.start_time is not None
    try:
        # Right pid, right start time, our log: the process holds another log.
        stopped = host.stop(theirs.pid, grace=1, start_time=theirs.start_time,
                            log_file=str(d / "ours.log"))  # fmt: skip
        assert stopped is False
        assert alive(theirs.pid, theirs.start_time)
        # Its own log: ours, stopped.
        assert host.stop(theirs.pid, grace=1, start_time=theirs.start_time,
                         log_file=str(d / "theirs.log")) is True  # fmt: skip
        assert not alive(theirs.pid, theirs.start_time)
    finally:
        host.stop(theirs.pid, grace=0)
