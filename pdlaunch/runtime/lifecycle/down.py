"""`down`, written once: stop a deployment (router, decode, prefill) and forget it only once
the runtime has proven that nothing of it runs. Idempotent."""

from __future__ import annotations

from pdlaunch.plan.build import Plan
from pdlaunch.runtime.base import Runtime
from pdlaunch.runtime.state import DeploymentLock, deployment_dir

from .model import DownResult, LaunchError, Reporter


def down(
    runtime: Runtime,
    deployment: str,
    *,
    plan: Plan | None = None,
    grace: float = 10.0,
    reporter: Reporter | None = None,
) -> DownResult:
    """Stop what the record holds (or, ``plan`` given and nothing usable recorded, what runs
    of the plan, found on its hosts) and forget it. LaunchError when something could not be
    stopped or proven gone: the record is kept for the next `down`."""
    reporter = reporter or Reporter()
    if not deployment_dir(deployment).is_dir() and plan is None:
        # Nothing was ever recorded here: do not create a directory (or lock) for a typo.
        return DownResult([], f"{deployment}: nothing recorded; nothing to stop")
    with DeploymentLock(deployment, "down"):
        held = runtime.held(deployment, plan)
        if held is None:
            return DownResult([], f"{deployment}: nothing recorded; nothing to stop")
        reporter.step(f"stopping {len(held.names)} process(es): router, decode, prefill")
        errors = held.stop_all(reporter, grace)
        if errors:
            held.keep_failed()
            raise LaunchError(
                f"could not stop: {'; '.join(errors)} (record kept; run `pdlaunch down "
                f"{deployment}` again)"
            )
        note = held.forget()
        return DownResult(list(held.names), held.message(note), dict(held.handle))
