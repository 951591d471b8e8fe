"""The SSH runtime: processes started over SSH (or locally) through the host pool
(:mod:`pdlaunch.hosts`), recorded in the deployment's record
(:mod:`pdlaunch.runtime.record_store`); found again by the record or, when it is lost, by the
pid files each process leaves on its host."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator

from pdlaunch.hosts import ConnectOptions, HostError, HostPool, containers
from pdlaunch.hosts.containers import ContainerRef
from pdlaunch.hosts.pool import Opener
from pdlaunch.observe import health
from pdlaunch.plan.build import Plan
from pdlaunch.runtime import record_store
from pdlaunch.runtime.base import Held, Observation, Observed, Runtime
from pdlaunch.runtime.lifecycle.model import LaunchError, Reporter, UpOptions
from pdlaunch.runtime.record_store import load_state, save_state
from pdlaunch.runtime.state import DeploymentState, ProcessState, StateError

from .launch import SshLaunch
from .records import proc_host, survey, unknown_message, unrecorded_state
from .stopping import stop_processes, sweep_containers


def _observe_container(pool: HostPool, ps: ProcessState, o: Observed, client_alive: bool) -> None:
    """A container runs on without its `run` client (killed -9): alive all the same, and
    `down` still finds it by its cid file or name + labels."""
    assert ps.container is not None
    try:
        o.container = containers.state(proc_host(pool, ps), ContainerRef.from_json(ps.container))
    except HostError as exc:
        o.container = f"unknown: {exc}"
    if o.container == "running":
        o.alive = True
        if not client_alive:
            o.health = "container running without its client"
            if ps.health_url:
                o.health += f"; {health.probe(ps.health_url, timeout=5.0).describe()}"


def _unrecorded_containers(pool: HostPool, state: DeploymentState) -> list[Observed]:
    """Containers of the deployment that its record does not name (a process since removed
    from the topology, a record rewritten without it), found by pdlaunch's labels on each
    container host: shown, so that `status` never hides what `down` will remove."""
    recorded: dict[tuple[str, str], set[str]] = {}
    first: dict[tuple[str, str], ProcessState] = {}
    for ps in state.processes:
        if ps.container is not None:
            key = (ps.host, ps.container["runtime"])
            recorded.setdefault(key, set()).add(ps.name)
            first.setdefault(key, ps)
    rows = []
    for key, ps in first.items():
        try:
            found = containers.of_deployment(proc_host(pool, ps), key[1], state.deployment)
        except HostError:
            continue  # the recorded processes' rows already say the runtime cannot answer
        for cid, proc, status in found:
            if proc in recorded[key]:
                continue
            rows.append(Observed(
                f"{proc} (container {cid[:12]})", "container", ps.host,
                alive=status == "running", container=status,
                health="a container of this deployment its record does not name; "
                       "`pdlaunch down` removes it",
            ))  # fmt: skip
    return rows


def _load(deployment: str) -> DeploymentState | None:
    try:
        return load_state(deployment)
    except (record_store.RecordFormatError, record_store.OtherBackendError) as exc:
        raise LaunchError(str(exc)) from None
    except StateError as exc:
        raise LaunchError(
            f"{exc}. Run `pdlaunch down FILE` with the topology file to stop its processes "
            "(it finds them by their pid files)."
        ) from None


class SshRuntime(Runtime):
    name = "ssh"

    def __init__(self, connect: ConnectOptions | None = None, opener: Opener | None = None):
        self.connect = connect or ConnectOptions()
        self.opener = opener  # how hosts are opened (tests pass test doubles)

    def _pool(self, state: DeploymentState | None) -> HostPool:
        options = self.connect
        if state is not None:
            options = options.or_recorded(state.known_hosts, state.ssh_config)
        return HostPool(options, opener=self.opener)

    def launch(self, plan: Plan, opts: UpOptions) -> SshLaunch:
        return SshLaunch(plan, opts, self.opener)

    # -- down -----------------------------------------------------------------------------------
    def held(self, deployment: str, plan: Plan | None) -> Held | None:
        try:
            state = load_state(deployment)
            unreadable = None
        except (record_store.RecordFormatError, record_store.OtherBackendError) as exc:
            raise LaunchError(f"{exc}. Nothing was stopped.") from None
        except StateError as exc:
            if plan is None:
                raise LaunchError(
                    f"{exc}. Nothing was stopped. Run `pdlaunch down FILE` with the topology "
                    "file: it finds the processes on their hosts by their pid files."
                ) from None
            state, unreadable = None, str(exc)
        if state is not None:
            return _SshHeld(state, self._pool(state), recorded=True)
        if plan is None:
            return None
        return _SshHeld(unrecorded_state(plan), self._pool(None), recorded=False,
                        unreadable=unreadable)  # fmt: skip

    # -- status, logs ---------------------------------------------------------------------------
    def observe(self, deployment: str) -> Observation | None:
        state = _load(deployment)
        if state is None:
            return None
        now = time.time()
        with self._pool(state) as pool:
            seen = copy.deepcopy(state)  # the survey fills in pids; the record is not rewritten
            found = survey(seen, pool)
            by_name = {p.name: p for p in seen.processes}
            rows = []
            for ps in state.processes:
                now_ps = by_name[ps.name]
                error = found.unknown.get(ps.name)
                alive = None if error is not None else ps.name in found.alive
                o = Observed(
                    ps.name,
                    ps.role,
                    ps.host,
                    pid=now_ps.pid if now_ps.pid is not None else ps.pid,
                    alive=alive,
                    url=ps.health_url,
                    log=ps.log_path,
                    error=error,
                    left_running=found.partial.get(ps.name, []),
                )
                if ps.pid is None and ps.name not in found.alive and not o.left_running:
                    o.pid = None
                if ps.container is not None:
                    _observe_container(pool, ps, o, client_alive=ps.name in found.alive)
                if o.alive and ps.started_at:
                    o.uptime_s = round(now - ps.started_at, 1)
                rows.append(o)
            rows += _unrecorded_containers(pool, state)
        return Observation(deployment, self.name, state.status, rows,
                           title=f"{deployment} ({state.status}) {state.endpoint}")  # fmt: skip

    def process_names(self, deployment: str) -> list[str]:
        state = _load(deployment)
        if state is None:
            raise LaunchError(
                f"{deployment}: nothing recorded (was it started with `pdlaunch up`?)"
            )
        return [p.name for p in state.processes]

    def read_log(self, deployment: str, name: str, lines: int) -> str:
        return "\n".join(self._log(deployment, name, lines, False, None))

    def follow_log(
        self, deployment: str, name: str, lines: int, stop: threading.Event | None
    ) -> Iterator[str]:
        yield from self._log(deployment, name, lines, True, stop)

    def _log(
        self, deployment: str, name: str, lines: int, follow: bool, stop: threading.Event | None
    ) -> Iterator[str]:
        state = _load(deployment)
        ps = state.process(name) if state else None
        if state is None or ps is None:
            raise LaunchError(f"{deployment} has no process {name!r}")
        pool = self._pool(state)
        try:
            host = proc_host(pool, ps)
            if follow:
                yield from host.follow_log(ps.log_path, lines=lines, stop=stop)
            else:
                yield from host.read_log(ps.log_path, lines).splitlines()
        finally:
            pool.close()


class _SshHeld(Held):
    """A deployment `down` stops over SSH: the record's processes, and any of its processes
    whose pid only reached a pid file (an `up` killed at the wrong moment); with nothing
    usable recorded, the plan's processes found by their pid files."""

    def __init__(
        self,
        state: DeploymentState,
        pool: HostPool,
        *,
        recorded: bool,
        unreadable: str | None = None,
    ):
        self.deployment = state.deployment
        self.state, self.pool = state, pool
        self.recorded, self.unreadable = recorded, unreadable
        self.handle = {}
        self.found = survey(state, pool)
        self.names = [p.name for p in state.started()] + [s.name for s in self.found.strangers]
        self.containers: list[str] = []  # ids of the containers `stop_all` removed

    def stop_all(self, reporter: Reporter, grace: float) -> list[str]:
        try:
            if not self.recorded and not self.found.complete:
                return [unknown_message(self.found, self.deployment) + "; nothing was stopped"]
            if self.recorded:
                self.state.status = "stopping"
                save_state(self.state)  # pids found by pid files are on record before a signal
            errors = []
            in_containers = any(p.container is not None for p in self.state.processes)
            # A container outlives its `run` client (killed, or a host rebooted into it): with
            # no pid left alive, its processes must still be removed, by the record and by
            # the runtime's labels, before the record is forgotten.
            if self.names or in_containers:
                errors = stop_processes(self.state, self.pool, reporter, grace=grace,
                                        extra=self.found.strangers,
                                        removed=self.containers)  # fmt: skip
            if not errors and in_containers and self.found.complete:
                errors = sweep_containers(self.state, self.pool, grace, self.containers)
            if not errors and not self.found.complete:
                errors = [unknown_message(self.found, self.deployment)]
            return errors
        finally:
            self.pool.close()

    def keep_failed(self) -> None:
        if self.recorded:
            self.state.status = "failed"
            save_state(self.state)

    def forget(self) -> str:
        if self.recorded:
            record_store.remove(self.deployment, "ssh")
            return ""
        if self.unreadable is None:
            return ""
        # Proven gone: the unreadable record is kept aside for inspection, not deleted.
        return record_store.move_aside(self.deployment, "ssh")

    def message(self, note: str) -> str:
        dep, n = self.deployment, len(self.names)
        if self.containers:
            note = f"; {len(self.containers)} container(s) removed{note}"
        if self.recorded:
            return f"{dep} is down ({n} process(es) stopped){note}"
        if not self.names and not self.containers:
            return (
                f"{dep}: nothing recorded, and no process of it runs on its hosts "
                f"(pid files checked); nothing to stop{note}"
            )
        if not self.names:
            return f"{dep} is down (nothing recorded; no process found by its pid files{note})"
        return (
            f"{dep} is down ({n} process(es) found by their pid files and stopped; nothing "
            f"usable was recorded on this control host){note}"
        )


__all__ = ["SshLaunch", "SshRuntime"]
