"""``state_dir`` (autouse): pdlaunch's state in the test's own tmp dir
(tests/support/deployments.py). The real Slurm cluster (``slurm_cluster``) is the session's
one, from tests/conftest.py."""

from tests.support.deployments import state_dir  # noqa: F401 - fixture
