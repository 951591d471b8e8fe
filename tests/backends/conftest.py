"""``state_dir`` (autouse): pdlaunch's state in the test's own tmp dir (the Slurm runtime
faults record jobs). ``make_deployment``: the stand-in 1P1D topology (the SSH container tests).
``stand_in_vllm``: a `vllm` that reports the argv and LD_LIBRARY_PATH a container's shell
would exec (tests/support/k8s_export.py)."""

from tests.support.deployments import make_deployment, state_dir  # noqa: F401 - fixtures
from tests.support.k8s_export import stand_in_vllm  # noqa: F401 - fixture
