"""Stopping recorded processes: router, then decode, then prefill, each role in parallel."""

from __future__ import annotations

import threading

from pdlaunch.hosts import (
    CommandTimeout,
    Host,
    HostError,
    HostPool,
    ProcessSurvived,
    containers,
    parallel,
    sh_quote_path,
)
from pdlaunch.hosts.containers import ContainerRef
from pdlaunch.runtime.lifecycle.model import STOP_ORDER, Reporter, View
from pdlaunch.runtime.state import DeploymentState, ProcessState

from .records import proc_host, proc_key


def stop_processes(
    state: DeploymentState,
    pool: HostPool,
    reporter: Reporter,
    views: dict[str, View] | None = None,
    *,
    grace: float = 10.0,
    extra: list[ProcessState] | None = None,
    only: set[str] | None = None,
    removed: list[str] | None = None,
) -> list[str]:
    """Stop ``state``'s processes (and ``extra`` ones: second copies a survey found), remove
    their containers and secret env files, and clear each pid once its process is proven
    gone. ``only``: names to stop (default: all). ``removed``: gets the ids of the containers
    removed. Returns one message per process that could not be stopped (its pid stays
    recorded)."""
    errors: list[str] = []
    lock = threading.Lock()

    def one(ps: ProcessState) -> None:
        view = views.get(ps.name) if views and ps.pid is not None else None
        failed = view is not None and view.state == "failed"
        try:
            host = proc_host(pool, ps)
            if ps.pid is not None:
                if view and not failed:
                    view.state = "stopping"
                    reporter.update()
                _stop_patiently(host, ps, grace)
            if ps.container is not None:
                # Also when the runtime's client was gone (killed, or never recorded): the
                # container runs on without it. Proven removed, or HostError.
                ids = containers.remove(host, ContainerRef.from_json(ps.container), grace)
                if removed is not None:
                    with lock:
                        removed.extend(i for i in ids if i not in removed)
            host.run(f"rm -f -- {sh_quote_path(ps.secrets_path)}", timeout=60)
            with lock:
                ps.pid = None
                ps.start_time = None
            if view and not failed:
                view.state, view.detail = "stopped", ""
                reporter.update()
        except HostError as exc:
            with lock:
                errors.append(f"{ps.name} on {ps.host}: {exc}")

    mine = [p for p in state.processes if only is None or p.name in only]
    everything = mine + list(extra or [])
    for role in STOP_ORDER:
        procs = [p for p in everything if p.role == role]
        if procs:
            parallel(one, procs)
    return errors


def sweep_containers(
    state: DeploymentState, pool: HostPool, grace: float, removed: list[str]
) -> list[str]:
    """Remove every container of the deployment that the runtimes on its container hosts
    still hold by pdlaunch's labels (:func:`pdlaunch.hosts.containers.sweep`), beyond those
    the record names: one per (host, runtime), in parallel. ``removed`` gets their ids.
    Returns one message per host where that could not be proven."""
    errors: list[str] = []
    lock = threading.Lock()
    targets: dict[tuple[object, str], ProcessState] = {}
    for ps in state.processes:
        if ps.container is not None:
            targets.setdefault((proc_key(ps), ps.container["runtime"]), ps)

    def one(item: tuple[tuple[object, str], ProcessState]) -> None:
        (_, runtime), ps = item
        try:
            ids = containers.sweep(proc_host(pool, ps), runtime, state.deployment, grace)
        except HostError as exc:
            with lock:
                errors.append(f"containers on {ps.host}: {exc}")
            return
        with lock:
            removed.extend(i for i in ids if i not in removed)

    parallel(one, list(targets.items()))
    return errors


# A stop that timed out proved nothing either way, and a group still alive after SIGKILL may
# be finishing its exit. Under heavy load (engines dying on a 2-core host, as in CI) both were
# seen: a command stalled for a minute; two workers of a DP engine alive 10 s after SIGKILL.
# The stop script is idempotent, so asking again costs little and usually settles it ("none"
# if the first try finished the job).
STOP_ATTEMPTS = 3


def _stop_patiently(host: Host, ps: ProcessState, grace: float) -> None:
    assert ps.pid is not None
    for attempt in range(1, STOP_ATTEMPTS + 1):
        try:
            host.stop(ps.pid, grace=grace, start_time=ps.start_time, log_file=ps.log_path)
            return
        except (CommandTimeout, ProcessSurvived) as exc:
            if attempt == STOP_ATTEMPTS:
                raise type(exc)(f"{exc} ({attempt} tries)", host=exc.host) from exc
