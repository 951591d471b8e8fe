"""Launch-test deployments: a 1P1D (+ router) topology of the stand-in engine and router with
fresh ports and its own work dir (``make_deployment``), pdlaunch's state in the test's own
tmp dir (``state_dir``, autouse where a conftest imports it), and the CLI in-process (``cli``)."""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pdlaunch.cli import app
from tests.support.processes import procs_under
from tests.support.sshd import free_ports

SECRET_ENV = "PDLAUNCH_TEST_SECRET"


@dataclass
class Deployment:
    name: str
    path: Path
    work_root: Path
    ports: dict[str, int]
    spec: dict = field(default_factory=dict)

    def write(self) -> Path:
        self.path.write_text(yaml.safe_dump(self.spec, sort_keys=False))
        return self.path

    @property
    def work_dir(self) -> Path:
        return self.work_root / self.name


_runner = CliRunner()


def cli(*args: str):
    """Run pdlaunch in-process; ``result.output`` has stdout and stderr.

    `up` here drives fake engines, which the preflight check rightly refuses (no vLLM behind
    them), so it runs with --skip-check unless a test passes --with-check."""
    argv = [str(a) for a in args]
    if argv and argv[0] == "up":
        if "--with-check" in argv:
            argv.remove("--with-check")
        else:
            argv.append("--skip-check")
    return _runner.invoke(app, argv, catch_exceptions=False)


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
        ports = free_ports("prefill", "decode", "router", "side")
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
