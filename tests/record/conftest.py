"""``state_dir`` (autouse, tests/support/deployments.py): pdlaunch's state in the test's own
tmp dir, never the user's."""

from tests.support.deployments import state_dir  # noqa: F401 - fixture
