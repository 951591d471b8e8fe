"""The session's one real Slurm cluster (tests/support/slurm_cluster.py), imported by
tests/conftest.py so every directory that asks for it shares one cluster: two would start two
slurmctld on the same machine."""

from __future__ import annotations

import os

import pytest

from tests.support.slurm_cluster import SlurmCluster, SlurmClusterError


@pytest.fixture(scope="session")
def slurm_cluster():
    cluster = SlurmCluster(nodes=2)
    error = None
    try:
        cluster.start()
    except SlurmClusterError as exc:
        error = str(exc)
    if error:
        pytest.fail(error, pytrace=False)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        root = cluster.root
        cluster.stop()  # raises if a daemon or slurmstepd of the cluster is left
        assert not root.exists(), f"{root} was not removed"
