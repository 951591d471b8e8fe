"""Fixtures of the runtime scenario suite: the state dir per test. The real Slurm cluster
(``slurm_cluster``) is the session's one, from tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("PDLAUNCH_STATE_DIR", str(d))
    monkeypatch.setenv("COLUMNS", "200")
    return d
