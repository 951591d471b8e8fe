"""``fakebin``: the stand-in vllm, vllm-router, python, docker and podman the seed-guide suite
runs rendered scripts with (tests/support/seed_commands.py)."""

from tests.support.seed_commands import fakebin  # noqa: F401 - fixture
