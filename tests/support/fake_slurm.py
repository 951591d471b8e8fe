"""The ``fake_slurm`` fixture: :class:`pdlaunch.testing.FakeSlurm`'s stand-in Slurm commands
first on PATH for one test, for the faults a real cluster cannot be made to show on demand
(sbatch refusing a job, a record naming another user's job, an engine port answering
garbage). The fake itself ships with the package, for users' own tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdlaunch.testing import FakeSlurm


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    slurm = FakeSlurm.install(tmp_path / "fake-slurm")
    for key, value in slurm.environ().items():
        monkeypatch.setenv(key, value)
    return slurm
