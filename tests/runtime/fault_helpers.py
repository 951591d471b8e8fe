"""Helpers for the fault suite (tests/runtime/test_faults.py).

pdlaunch runs as a real process here (``python -m pdlaunch ...``), never in-process: the
faults are signals and kills of that process, a hang must be boundable by a wall-clock limit,
and a crash must show as the user would see it (a traceback on stderr). It also keeps the
suite independent of where the CLI's modules live.

The orphan check is :func:`unaccounted`: a process running under a deployment's work dir
that neither the state file nor a pid file points to is one nobody can ever stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdlaunch.runtime.record import RECORD_FILE
from pdlaunch.runtime.state import deployment_dir
from tests.support.deployments import Deployment
from tests.support.processes import procs_under

TRACEBACK = "Traceback (most recent call last)"
ENGINES = ("prefill-0", "decode-0")  # the engines of conftest's 1P1D topology
PLANNED = 3  # prefill-0, decode-0, router


@dataclass
class Result:
    rc: int | None  # None: killed at the wall-clock limit
    output: str  # stdout and stderr, interleaved as written
    elapsed: float

    def __str__(self) -> str:
        return f"rc={self.rc} after {self.elapsed:.1f}s\n--- output ---\n{self.output}"


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    # The autouse `state_dir` fixture put PDLAUNCH_STATE_DIR (and COLUMNS) in os.environ.
    env = dict(os.environ)
    env.update(extra or {})
    return env


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``pdlaunch ARGS`` in its own session (a test can signal or kill its whole group;
    the engines it starts are in sessions of their own, as on a real host), output to
    ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pdlaunch", *map(str, args)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(env),
            start_new_session=True,
        )


def finish(proc: subprocess.Popen, log: Path, t0: float, limit: float) -> Result:
    """Wait for a spawned pdlaunch at most ``limit`` s (then kill its group: rc None)."""
    try:
        rc: int | None = proc.wait(timeout=max(0.0, limit - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        kill_group(proc)
        rc = None
    return Result(rc, log.read_text(errors="replace"), time.monotonic() - t0)


def pdl(*args: Any, tmp: Path, limit: float = 120.0, env: dict[str, str] | None = None) -> Result:
    """Run ``pdlaunch ARGS`` to its end (or ``limit``)."""
    log = _log_path(tmp)
    t0 = time.monotonic()
    return finish(spawn([str(a) for a in args], log, env), log, t0, limit)


def _log_path(tmp: Path) -> Path:
    d = tmp / "pdlaunch-out"
    d.mkdir(exist_ok=True)
    return d / f"{len(list(d.iterdir())):03d}.log"


def up_args(dep: Deployment, *extra: Any, timeout: float = 60) -> list[str]:
    return ["up", str(dep.path), "--skip-check", "--timeout", str(timeout), *map(str, extra)]


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_for(cond: Callable[[], bool], timeout: float, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def settle(root: Path, quiet: float = 1.0, timeout: float = 20.0) -> list[int]:
    """Processes under ``root`` once the set has not changed for ``quiet`` s: what a killed
    `up` leaves behind includes start scripts still finishing their work."""
    deadline = time.monotonic() + timeout
    last = sorted(procs_under(root))
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = sorted(procs_under(root))
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


# -- records --------------------------------------------------------------------------------------
def state_path(name: str) -> Path:
    return deployment_dir(name) / RECORD_FILE


def read_state(name: str) -> Any:
    """The state file as JSON, or None when absent or unreadable."""
    try:
        return json.loads(state_path(name).read_text())
    except (OSError, ValueError):
        return None


def _ints_at(obj: Any, key: str) -> Iterator[int]:
    # Walks the JSON instead of using DeploymentState: the suite must keep working whatever
    # fields the state format grows, and must read a state the product can no longer parse.
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key and isinstance(v, int) and not isinstance(v, bool):
                yield v
            else:
                yield from _ints_at(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from _ints_at(v, key)


def state_pids(name: str) -> set[int]:
    return set(_ints_at(read_state(name), "pid"))


def pid_files(dep: Deployment) -> dict[str, int]:
    """{process name: pid} from ``<work_dir>/<deployment>/run/*.pid``."""
    found = {}
    for f in sorted((dep.work_dir / "run").glob("*.pid")):
        try:
            text = f.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            found[f.name[: -len(".pid")]] = int(text)
    return found


def unaccounted(dep: Deployment) -> list[int]:
    """Live processes under the work dir that no record and no pid file points to."""
    known = state_pids(dep.name) | set(pid_files(dep).values())
    return sorted(set(procs_under(dep.work_root)) - known)


def alive(pid: int) -> bool:
    """Running (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


# -- what the user reads --------------------------------------------------------------------------
NEXT_COMMAND = r"pdlaunch (down|status|up)\b"


def lacks(res: Result, *patterns: str) -> list[str]:
    """What the output lacks: a regex (case-insensitive) not found, or it has a traceback."""
    problems = [f"a Python traceback reached the user\n{res}"] if TRACEBACK in res.output else []
    missing = [p for p in patterns if not re.search(p, res.output, re.IGNORECASE)]
    if missing:
        problems.append(f"output lacks {missing}\n{res}")
    return problems


def says(res: Result, *patterns: str) -> None:
    """Every regex (case-insensitive) is in the output; the output never has a traceback."""
    problems = lacks(res, *patterns)
    assert not problems, "\n".join(problems)


def no_traceback(res: Result) -> None:
    assert TRACEBACK not in res.output, f"a Python traceback reached the user\n{res}"
