"""Fixtures over tests/support/netns/ (imported by tests/conftest.py), for tests marked
``@pytest.mark.netns``:

* ``netns_cluster`` (session): a :class:`NetnsCluster` of 3 namespace hosts (pdl-h1..3, or
  pdlK-h1..3 when another run holds slot 0), each with its own sshd on port 22; started on
  first use, torn down at the end of the session (and by atexit, and by the next run's sweep).
* ``netns`` (function): the same cluster, with every firewall rule and netem setting of the
  test removed afterwards.

Like the sshd fixtures, these FAIL (not skip) with an install hint when the machine cannot
build the cluster (not root, iproute2/util-linux/OpenSSH missing).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.netns import NetnsCluster, NetnsError

CLUSTER_SIZE = 3  # prefill host, decode host, router host


@pytest.fixture(scope="session")
def netns_cluster() -> Iterator[NetnsCluster]:
    error = None
    cluster = NetnsCluster(CLUSTER_SIZE)
    try:
        cluster.start()
    except NetnsError as exc:
        error = str(exc)
    if error:
        pytest.fail(f"network-namespace cluster: {error}", pytrace=False)
    yield cluster
    cluster.close()


@pytest.fixture
def netns(netns_cluster: NetnsCluster) -> Iterator[NetnsCluster]:
    yield netns_cluster
    netns_cluster.reset()
