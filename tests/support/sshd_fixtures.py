"""Real-sshd fixtures (tests/support/sshd.py; imported by tests/conftest.py), for tests marked
``@pytest.mark.ssh``:

* ``sshd_cluster`` (session): the :class:`SshdCluster` - client key (``.key_file``), user
  (``.user``), known_hosts trusting every host it started (``.known_hosts``).
* ``sshd_host`` (session): one shared simulated host (an :class:`SshdHost`: ``.host``,
  ``.port``, ``.home``, ``.alias``).
* ``sshd_hosts`` (session): factory. ``sshd_hosts(n)`` -> the first ``n`` hosts of a shared
  pool (started on demand); ``sshd_hosts(n, fresh=True)`` -> ``n`` new hosts for tests that
  break them (rotate keys, stop sshd).
* ``ssh_client_config`` (session): an ssh_config file that isolates tests from ~/.ssh and
  /etc/ssh (known hosts = the cluster's) and defines ``Host simN`` aliases for started hosts.
* ``ssh_settings(h)`` (session): :class:`SshSettings` that log in to ``h`` with the cluster key
  only (no agent, no default keys).
* ``ssh_connect(h, **open_host_kwargs)`` (function): an open SshHost to ``h``; closed after
  the test.

If OpenSSH's server is not installed, these fixtures FAIL (not skip) with an install hint.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pdlaunch.hosts import SshHost, SshSettings, open_host
from tests.support.sshd import SshdCluster, SshdError, SshdHost


@pytest.fixture(scope="session")
def sshd_cluster(tmp_path_factory) -> SshdCluster:
    error = None
    try:
        cluster = SshdCluster(tmp_path_factory.mktemp("sshd"))
    except SshdError as e:
        error = str(e)
    if error:
        pytest.fail(error, pytrace=False)
    yield cluster
    cluster.stop()


class SshdPool:
    def __init__(self, cluster: SshdCluster, on_start):
        self.cluster = cluster
        self.shared: list[SshdHost] = []
        self._on_start = on_start

    def __call__(self, n: int = 1, *, fresh: bool = False) -> list[SshdHost]:
        error = None
        try:
            if fresh:
                hosts = self.cluster.start(n)
            else:
                if len(self.shared) < n:
                    self.shared += self.cluster.start(n - len(self.shared))
                hosts = self.shared[:n]
        except SshdError as e:
            error = str(e)
        if error:
            pytest.fail(error, pytrace=False)
        self._on_start()
        return hosts


@pytest.fixture(scope="session")
def ssh_client_config(sshd_cluster: SshdCluster, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ssh-client") / "ssh_config"
    _write_client_config(sshd_cluster, path)
    return path


def _write_client_config(cluster: SshdCluster, path: Path) -> None:
    path.write_text(
        cluster.ssh_config_text()
        + "Host *\n"
        + f"    UserKnownHostsFile {cluster.known_hosts}\n"
        + "    GlobalKnownHostsFile none\n"
    )


@pytest.fixture(scope="session")
def sshd_hosts(sshd_cluster: SshdCluster, ssh_client_config: Path) -> SshdPool:
    return SshdPool(sshd_cluster, lambda: _write_client_config(sshd_cluster, ssh_client_config))


@pytest.fixture(scope="session")
def sshd_host(sshd_hosts: SshdPool) -> SshdHost:
    return sshd_hosts(1)[0]


@pytest.fixture(scope="session")
def ssh_settings(sshd_cluster: SshdCluster):
    def make(h: SshdHost, **overrides) -> SshSettings:
        kw = dict(
            user=sshd_cluster.user,
            port=h.port,
            key_file=str(sshd_cluster.key_file),
            identities_only=True,
            connect_timeout=5.0,
        )
        kw.update(overrides)
        return SshSettings(**kw)

    return make


@pytest.fixture
def ssh_connect(sshd_cluster: SshdCluster, ssh_client_config: Path, ssh_settings):
    opened: list[SshHost] = []

    def connect(h: SshdHost, **kwargs) -> SshHost:
        kwargs.setdefault("ssh", ssh_settings(h))
        kwargs.setdefault("ssh_config_file", ssh_client_config)
        kwargs.setdefault("known_hosts", sshd_cluster.known_hosts)
        kwargs.setdefault("force_ssh", True)
        host = open_host(kwargs.pop("address", h.host), **kwargs)
        opened.append(host)
        return host

    yield connect
    for host in opened:
        host.close()
