"""Slurm-test fixtures.

* ``slurm_cluster`` (session): a real two-node Slurm cluster on this machine (tests/slurm/
  cluster.py: munged, slurmctld, one slurmd per node). ``SLURM_CONF`` points at it for the
  whole session, so pdlaunch's Slurm commands reach it. Stopped, and checked to leave no
  daemon or slurmstepd behind, at the end of the session. Missing Slurm/MUNGE FAILS the tests
  (with the install hint), as the sshd fixtures do.
* ``fake_bins`` (session, tests/conftest.py): the launch tests' stand-ins for `vllm serve`
  and vllm-router.
* ``fake_slurm``: stand-in Slurm commands on PATH that record every call
  (tests/slurm/fake_slurm.py), for faults the real cluster cannot show on demand.
* ``state_dir`` (autouse): pdlaunch's state (the Slurm record) in the test's own tmp dir.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.slurm.cluster import SlurmCluster, SlurmClusterError
from tests.slurm.fake_slurm import fake_slurm  # noqa: F401 (a fixture)


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


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("PDLAUNCH_STATE_DIR", str(d))
    return d
