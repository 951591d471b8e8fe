"""Launch-test helpers: topologies built per test with free ports and their own work dir (on
the fake engine/router executables, ``fake_bins`` of tests/conftest.py), the CLI in-process,
and an orphan check through /proc."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from tests.support.deployments import Deployment, procs_under
from tests.support.sshd import free_port


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("PDLAUNCH_STATE_DIR", str(d))
    monkeypatch.setenv("COLUMNS", "200")
    return d


@pytest.fixture
def make_deployment(tmp_path, fake_bins):
    """Factory: a 1P1D (+ router) topology on ``host`` with fresh ports. ``ssh``: forced-SSH
    settings for that host (dict of the topology's Ssh fields)."""
    made: list[Deployment] = []

    def make(
        name: str = "t",
        *,
        host: str = "127.0.0.1",
        ssh: dict | None = None,
        prefill_env: dict | None = None,
        decode_env: dict | None = None,
        router_env: dict | None = None,
        env: dict | None = None,
    ) -> Deployment:
        ports = {k: free_port() for k in ("prefill", "decode", "router", "side")}
        work_root = tmp_path / f"work-{name}"
        spec: dict = {
            "deployment": name,
            "model": {"name": "fake-model"},
            "defaults": {
                "work_dir": str(work_root),
                "vllm_bin": str(fake_bins["vllm"]),
                "env": dict(env or {}),
            },
            "prefill": [
                {
                    "host": host,
                    "device": "cpu",
                    "port": ports["prefill"],
                    "bind": host,
                    "env": dict(prefill_env or {}),
                }
            ],
            "decode": [
                {
                    "host": host,
                    "device": "cpu",
                    "port": ports["decode"],
                    "bind": host,
                    "env": dict(decode_env or {}),
                }
            ],
            "kv_connector": {"side_channel_port": ports["side"]},
            "router": {
                "host": host,
                "bind": host,
                "port": ports["router"],
                "binary": str(fake_bins["router"]),
                "env": dict(router_env or {}),
            },
        }
        if ssh is not None:
            spec["hosts"] = {host: {"local": False, "ssh": ssh}}
        dep = Deployment(name, tmp_path / f"{name}.yaml", work_root, ports, spec)
        dep.write()
        made.append(dep)
        return dep

    yield make
    for dep in made:  # never leave processes behind, whatever a test did
        for pid in procs_under(dep.work_root):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
