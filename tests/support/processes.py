"""Is anything left running? Every launched process runs in its work dir, so the processes
whose working directory is under a deployment's work root are the ones it started."""

from __future__ import annotations

import os
import time
from pathlib import Path


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
