"""``state_dir`` (autouse) and ``make_deployment`` for the launch-over-SSH suite
(tests/support/deployments.py); the sshd fixtures come from tests/conftest.py."""

from tests.support.deployments import make_deployment, state_dir  # noqa: F401 - fixtures
