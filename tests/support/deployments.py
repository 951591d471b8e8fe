"""Helpers shared by the launch tests (importable, unlike conftest)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from typer.testing import CliRunner

from pdlaunch.cli import app

SECRET_ENV = "PDLAUNCH_TEST_SECRET"


def procs_under(root: Path) -> list[int]:
    """Live processes whose working directory is under ``root`` (every launched process runs
    in its work dir), zombies excluded."""
    root_s = str(root)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        state = stat[stat.rfind(b")") + 2 :].split()[0]
        if (cwd == root_s or cwd.startswith(root_s + "/")) and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def wait_no_procs(root: Path, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        left = procs_under(root)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


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
