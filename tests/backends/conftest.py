"""``stand_in_vllm``: a `vllm` that reports the argv and LD_LIBRARY_PATH a container's shell would
exec (tests/support/k8s_export.py)."""

from tests.support.k8s_export import stand_in_vllm  # noqa: F401 - fixture
