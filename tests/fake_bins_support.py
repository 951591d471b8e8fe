"""The launch tests' stand-ins for `vllm serve` and vllm-router (tests/launch/fake_vllm.py,
tests/launch/fake_router.py) as executables, for the launch and Slurm tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parent / "launch"


def install_fake(src: Path, dest: Path) -> Path:
    """``src`` as an executable ``dest`` with this interpreter in its shebang: a fast start, and
    no PATH lookup where the venv is not on PATH (an sshd login's shell, a Slurm step)."""
    body = src.read_text().split("\n", 1)[1]
    dest.write_text(f"#!{sys.executable} -S\n{body}")  # -S: no site-packages, faster
    dest.chmod(0o755)
    return dest


@pytest.fixture(scope="session")
def fake_bins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("fake-bin")
    return {
        "vllm": install_fake(LAUNCH / "fake_vllm.py", d / "fake-vllm"),
        "router": install_fake(LAUNCH / "fake_router.py", d / "fake-router"),
    }
