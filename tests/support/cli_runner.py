"""``pdlaunch ARGS`` run as the user runs it (its own process, this test's environment: state
dir, SLURM_CONF), with the one check every such run makes: no Python traceback reaches the
user. Shared by the Slurm CLI and the runtime scenario suites."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRACEBACK = "Traceback (most recent call last)"


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def json(self) -> dict:
        return json.loads(self.stdout)

    def __str__(self) -> str:
        return f"rc={self.rc}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


def pdl(*args: object, limit: float = 180.0) -> Run:
    res = subprocess.run(
        [sys.executable, "-m", "pdlaunch", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=limit,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    run = Run(res.returncode, res.stdout, res.stderr)
    assert TRACEBACK not in run.output, f"a Python traceback reached the user\n{run}"
    return run
