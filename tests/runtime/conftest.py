"""``state_dir`` (autouse, tests/support/deployments.py): pdlaunch's state in the test's own
tmp dir. The real Slurm cluster (``slurm_cluster``) is the session's one, from
tests/conftest.py."""

from tests.support.deployments import state_dir  # noqa: F401 - fixture
