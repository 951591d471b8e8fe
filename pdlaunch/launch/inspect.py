"""`status` and `logs`: read a recorded deployment without changing it."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from typing import Any

from pdlaunch import health
from pdlaunch.hosts import ConnectOptions, HostError, HostPool, containers, parallel
from pdlaunch.hosts.containers import ContainerRef
from pdlaunch.hosts.pool import Opener
from pdlaunch.state import DeploymentState, ProcessState, StateError, load_state

from .model import LaunchError
from .records import proc_host, survey


def _load(deployment: str) -> DeploymentState | None:
    try:
        return load_state(deployment)
    except StateError as exc:
        raise LaunchError(
            f"{exc}. Run `pdlaunch down FILE` with the topology file to stop its processes "
            "(it finds them by their pid files)."
        ) from None


def status(
    deployment: str,
    *,
    connect: ConnectOptions | None = None,
    opener: Opener | None = None,
) -> tuple[DeploymentState | None, list[dict[str, Any]]]:
    state = _load(deployment)
    if state is None:
        return None, []
    connect = connect or ConnectOptions()
    now = time.time()
    options = connect.or_recorded(state.known_hosts, state.ssh_config)
    with HostPool(options, opener=opener) as pool:
        seen = copy.deepcopy(state)  # the survey fills in pids; the record is not rewritten
        found = survey(seen, pool)
        by_name = {p.name: p for p in seen.processes}

        def one(ps: ProcessState) -> dict[str, Any]:
            now_ps = by_name[ps.name]
            row: dict[str, Any] = {
                "process": ps.name,
                "role": ps.role,
                "host": ps.host,
                "pid": now_ps.pid if now_ps.pid is not None else ps.pid,
                "alive": None,
                "health": None,
                "uptime_s": None,
                "log": ps.log_path,
                "health_url": ps.health_url,
                "error": found.unknown.get(ps.name),
                # pids still running of a process whose leader died (partly dead)
                "left_running": found.partial.get(ps.name, []),
            }
            if row["error"] is None:
                row["alive"] = ps.name in found.alive
            if ps.container is not None:
                # The container runs on without its client (`run` killed): alive all the same.
                row["container"] = _container_state(pool, ps)
                if row["container"] == "running":
                    row["alive"] = True
                    if ps.name not in found.alive:
                        row["health"] = "container running without its client"
                        if ps.health_url:
                            probe = health.probe(ps.health_url, timeout=5.0).describe()
                            row["health"] += f"; {probe}"
                        return row
            if row["left_running"]:
                pids = " ".join(map(str, row["left_running"]))
                row["health"] = f"partly dead: leader gone, still running: {pids}"
                return row
            if ps.pid is None and ps.name not in found.alive:
                row["alive"] = False if row["error"] is None else None
                row["health"] = "not started"
                return row
            if row["alive"] and ps.started_at:
                row["uptime_s"] = round(now - ps.started_at, 1)
            if ps.health_url:
                row["health"] = health.probe(ps.health_url, timeout=5.0).describe()
            else:
                row["health"] = "headless"
            return row

        rows = parallel(one, state.processes)
    return state, rows


def _container_state(pool: HostPool, ps: ProcessState) -> str:
    assert ps.container is not None
    try:
        return containers.state(proc_host(pool, ps), ContainerRef.from_json(ps.container))
    except HostError as exc:
        return f"unknown: {exc}"


def logs(
    deployment: str,
    name: str,
    *,
    lines: int = 50,
    follow: bool = False,
    connect: ConnectOptions | None = None,
    stop: threading.Event | None = None,
) -> Iterator[str]:
    """The last ``lines`` of a process's log, then (``follow``) each new line."""
    state = _load(deployment)
    if state is None:
        raise LaunchError(f"{deployment}: nothing recorded (was it started with `pdlaunch up`?)")
    ps = state.process(name)
    if ps is None:
        names = ", ".join(p.name for p in state.processes)
        raise LaunchError(f"{deployment} has no process {name!r} (processes: {names})")
    connect = connect or ConnectOptions()
    pool = HostPool(connect.or_recorded(state.known_hosts, state.ssh_config))
    try:
        host = proc_host(pool, ps)
        if follow:
            yield from host.follow_log(ps.log_path, lines=lines, stop=stop)
        else:
            text = host.read_log(ps.log_path, lines)
            yield from text.splitlines()
    finally:
        pool.close()
