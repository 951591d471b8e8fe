"""`status` and `logs`, written once: read a recorded deployment without changing it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pdlaunch.hosts import parallel
from pdlaunch.observe import health
from pdlaunch.runtime.base import Observation, Observed, Runtime

from .model import LaunchError

HEALTHY = ("healthy", "headless")


@dataclass
class StatusReport:
    observation: Observation
    rows: list[dict[str, Any]]

    @property
    def healthy(self) -> bool:
        # alive None (its host could not be asked) is not healthy: unknown is not up
        return self.observation.running and all(
            r["alive"] and r["health"] in HEALTHY for r in self.rows
        )

    @property
    def endpoint(self) -> str | None:
        router = next((r for r in self.rows if r["role"] == "router"), None)
        url = router and router["health_url"]
        return health.base_url(url) if url else None


def _row(o: Observed) -> dict[str, Any]:
    row: dict[str, Any] = {
        "process": o.name,
        "role": o.role,
        "host": o.host,
        "pid": o.pid,
        "alive": o.alive,
        "health": o.health,
        "uptime_s": o.uptime_s,
        "log": o.log,
        "health_url": o.url,
        "error": o.error,
        # pids still running of a process whose leader died (partly dead)
        "left_running": o.left_running,
    }
    if o.container is not None:
        row["container"] = o.container
    if row["health"] is not None:
        return row
    if o.left_running:
        pids = " ".join(map(str, o.left_running))
        row["health"] = f"partly dead: leader gone, still running: {pids}"
    elif o.alive is False and o.pid is None:
        row["health"] = "not started"
    elif o.url:
        row["health"] = health.probe(o.url, timeout=5.0).describe()
    else:
        row["health"] = "headless"
    return row


def status(runtime: Runtime, deployment: str) -> StatusReport | None:
    """Every recorded process: where, pid, alive, health at the URL it really listens at."""
    seen = runtime.observe(deployment)
    if seen is None:
        return None
    return StatusReport(seen, parallel(_row, seen.processes))


def logs(
    runtime: Runtime,
    deployment: str,
    name: str,
    *,
    lines: int = 50,
    follow: bool = False,
    stop: threading.Event | None = None,
) -> Iterator[str]:
    """The last ``lines`` of a process's log, then (``follow``) each new line."""
    names = runtime.process_names(deployment)  # LaunchError when nothing is recorded
    if name not in names:
        raise LaunchError(f"{deployment} has no process {name!r}; known: {', '.join(names)}")
    if follow:
        yield from runtime.follow_log(deployment, name, lines, stop)
    else:
        yield from runtime.read_log(deployment, name, lines).splitlines()
