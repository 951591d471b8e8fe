"""Launch-test fixtures (tests/support/deployments.py): ``state_dir`` (autouse: pdlaunch's state
in the test's own tmp dir) and ``make_deployment`` (a 1P1D + router topology of the stand-in
engine and router, ``fake_bins``, with fresh ports; its processes killed after the test)."""

from tests.support.deployments import make_deployment, state_dir  # noqa: F401 - fixtures
