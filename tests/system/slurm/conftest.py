"""Slurm-test fixtures.

* ``slurm_cluster`` (session, tests/support/slurm_fixtures.py, imported by tests/conftest.py so
  every suite shares one cluster): a real two-node Slurm cluster on this
  machine (tests/support/slurm_cluster.py: munged, slurmctld, one slurmd per node). ``SLURM_CONF``
  points at it for the whole session, so pdlaunch's Slurm commands reach it. Stopped, and
  checked to leave no daemon or slurmstepd behind, at the end of the session. Missing
  Slurm/MUNGE FAILS the tests (with the install hint), as the sshd fixtures do.
* ``fake_bins`` (session, tests/conftest.py): the launch tests' stand-ins for `vllm serve`
  and vllm-router.
* ``fake_slurm`` (tests/conftest.py): stand-in Slurm commands on PATH that record every call
  (pdlaunch.testing.FakeSlurm), for faults the real cluster cannot show on demand.
* ``state_dir`` (autouse): pdlaunch's state (the Slurm record) in the test's own tmp dir.
"""

from __future__ import annotations

from tests.support.deployments import state_dir  # noqa: F401 - fixture
