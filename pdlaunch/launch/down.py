"""`down`: stop a deployment, router first, and forget it only once nothing of it runs."""

from __future__ import annotations

import os
import time

from pdlaunch.hosts import ConnectOptions, HostPool
from pdlaunch.hosts.pool import Opener
from pdlaunch.plan import Plan
from pdlaunch.state import (
    STATE_FILE,
    DeploymentLock,
    DeploymentState,
    StateError,
    deployment_dir,
    load_state,
    remove_state,
    save_state,
)

from .model import DownResult, LaunchError, Reporter
from .records import survey, unknown_message, unrecorded_state
from .stopping import stop_processes


def down(
    deployment: str,
    *,
    plan: Plan | None = None,
    connect: ConnectOptions | None = None,
    grace: float = 10.0,
    reporter: Reporter | None = None,
    opener: Opener | None = None,
) -> DownResult:
    """Stop a deployment (router, decode, prefill) and forget it. Idempotent.

    The record's processes, and any of its processes whose pid only reached a pid file (an
    `up` killed at the wrong moment), are stopped. With nothing recorded, or a record that
    cannot be read, and a ``plan`` (the CLI passes one when given the topology file), the
    plan's hosts are searched by the pid files instead. A record is deleted only when every
    process of it is proven gone; an unreachable host keeps it.
    """
    reporter = reporter or Reporter()
    connect = connect or ConnectOptions()
    if not deployment_dir(deployment).is_dir():
        # Nothing was ever recorded here: do not create a directory (or lock) for a typo.
        if plan is None:
            return DownResult([], f"{deployment}: nothing recorded; nothing to stop")
        return _down_searched(plan, connect, grace, reporter, None, opener)
    with DeploymentLock(deployment, "down"):
        try:
            state = load_state(deployment)
        except StateError as exc:
            if plan is None:
                raise LaunchError(
                    f"{exc}. Nothing was stopped. Run `pdlaunch down FILE` with the topology "
                    "file: it finds the processes on their hosts by their pid files."
                ) from None
            return _down_searched(plan, connect, grace, reporter, str(exc), opener)
        if state is None:
            if plan is None:
                return DownResult([], f"{deployment}: nothing recorded; nothing to stop")
            return _down_searched(plan, connect, grace, reporter, None, opener)
        return _down_recorded(state, connect, grace, reporter, opener)


def _down_recorded(
    state: DeploymentState,
    connect: ConnectOptions,
    grace: float,
    reporter: Reporter,
    opener: Opener | None,
) -> DownResult:
    dep = state.deployment
    options = connect.or_recorded(state.known_hosts, state.ssh_config)
    with HostPool(options, opener=opener) as pool:
        found = survey(state, pool)
        names = [p.name for p in state.started()] + [s.name for s in found.strangers]
        state.status = "stopping"
        save_state(state)  # pids found by their pid files are on record before any signal
        reporter.step(f"stopping {len(names)} process(es): router, decode, prefill")
        errors = stop_processes(state, pool, reporter, grace=grace, extra=found.strangers)
    if errors or not found.complete:
        state.status = "failed"
        save_state(state)
        why = "; ".join(errors) if errors else unknown_message(found, dep)
        raise LaunchError(f"could not stop: {why} (record kept; run `pdlaunch down {dep}` again)")
    remove_state(dep)
    return DownResult(names, f"{dep} is down ({len(names)} process(es) stopped)")


def _down_searched(
    plan: Plan,
    connect: ConnectOptions,
    grace: float,
    reporter: Reporter,
    unreadable: str | None,
    opener: Opener | None,
) -> DownResult:
    """No usable record: find the plan's processes by their pid files and stop them."""
    state = unrecorded_state(plan)
    with HostPool(connect, opener=opener) as pool:
        found = survey(state, pool)
        if not found.complete:
            raise LaunchError(unknown_message(found, plan.deployment) + "; nothing was stopped")
        names = [p.name for p in state.started()] + [s.name for s in found.strangers]
        errors = (
            stop_processes(state, pool, reporter, grace=grace, extra=found.strangers)
            if names
            else []
        )
    if errors:
        raise LaunchError("could not stop: " + "; ".join(errors) + " (run `down` again)")
    note = ""
    if unreadable is not None:
        # Proven gone: the unreadable record is kept aside for inspection, not deleted.
        src = deployment_dir(plan.deployment) / STATE_FILE
        aside = src.with_name(f"{STATE_FILE}.unreadable-{int(time.time())}")
        try:
            os.replace(src, aside)
            note = f"; the unreadable record was moved to {aside}"
        except OSError as exc:
            note = f"; the unreadable record {src} could not be moved aside: {exc}"
    if not names:
        return DownResult(
            [],
            f"{plan.deployment}: nothing recorded, and no process of it runs on its hosts "
            f"(pid files checked); nothing to stop{note}",
        )
    return DownResult(
        names,
        f"{plan.deployment} is down ({len(names)} process(es) found by their pid files and "
        f"stopped; nothing usable was recorded on this control host){note}",
    )
