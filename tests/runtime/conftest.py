"""Fixtures of the runtime scenario suite: the state dir per test, and the real Slurm cluster
of tests/slurm (imported, so this directory runs on its own; it is the same session fixture
when both directories run together only if pytest sees one definition, so run them apart or
accept a second cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.slurm.conftest import slurm_cluster  # noqa: F401 (a fixture)


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("PDLAUNCH_STATE_DIR", str(d))
    monkeypatch.setenv("COLUMNS", "200")
    return d
