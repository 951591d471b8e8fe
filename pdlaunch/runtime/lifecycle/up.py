"""`up`, written once over :class:`pdlaunch.runtime.base.Runtime`.

lock -> survey what runs (adopt / nothing to do / refuse / replace: the runtime decides from
its record) -> preflight -> provision -> per stage (engines, then router): start, wait for
health (deadline + liveness) -> canary -> record as up. Any failure, or SIGINT/SIGTERM/SIGHUP,
after the survey rolls back (:mod:`.rollback`): what this run started is stopped and proven
gone before the record goes; a second signal meanwhile says truthfully what is left.
"""

from __future__ import annotations

import time

from pdlaunch.observe import health
from pdlaunch.plan.build import Plan
from pdlaunch.runtime.base import STAGES, Launch, Runtime, stage_processes
from pdlaunch.runtime.interrupts import Signalled, signal_name, signals_interrupt
from pdlaunch.runtime.state import DeploymentLock

from . import readiness
from .canary import run_canary
from .model import Interrupted, LaunchError, Reporter, UpOptions, UpResult
from .rollback import roll_back
from .run import Run


def up(runtime: Runtime, plan: Plan, opts: UpOptions, reporter: Reporter | None = None) -> UpResult:
    """Start the deployment on ``runtime`` (see the module docstring). Raises LaunchError
    (Interrupted on a signal) or StateError."""
    reporter = reporter or Reporter()
    t0 = time.monotonic()
    with DeploymentLock(plan.deployment, "up"), signals_interrupt():
        launch = runtime.launch(plan, opts)
        try:
            try:
                done = launch.survey(reporter)
            except (KeyboardInterrupt, Signalled) as exc:
                raise Interrupted(
                    signal_name(exc),
                    f"interrupted by {signal_name(exc)} while checking what already runs; "
                    "nothing was started",
                ) from None
            if done is not None:
                done.backend = runtime.name
                done.endpoints = done.endpoints or endpoints_of(launch)
                return done
            adopted = sorted(launch.adopted)
            if opts.preflight is not None:
                if adopted:
                    reporter.step(
                        f"preflight skipped: {len(adopted)} process(es) of the deployment run "
                        "and hold their ports"
                    )
                else:
                    reporter.step("preflight check")
                    opts.preflight(launch)
            run = Run(launch, reporter, opts, t0 + opts.timeout)
            try:
                result = _steps(run, t0)
            except BaseException as exc:
                raise roll_back(run, exc) from None
            result.adopted = adopted
            result.backend = runtime.name
            return result
        finally:
            launch.close()


def _steps(run: Run, t0: float) -> UpResult:
    launch, plan, reporter = run.launch, run.plan, run.reporter
    run.provisioned = True  # from here on something may run (or a secret file exist)
    launch.provision(reporter)
    for stage, roles in STAGES:
        procs = stage_processes(plan, roles)
        fresh = [p for p in procs if p.name not in launch.adopted]
        reporter.step(f"starting {len(fresh)} {stage} process(es)")

        for p in fresh:
            run.set(p.name, "starting", "launching")
        try:
            pids = launch.start(stage, fresh)
        except LaunchError as exc:
            for f in exc.failures:
                if f.name in run.views:
                    run.set(f.name, "failed", f.reason)
            raise
        for p in fresh:
            run.set(p.name, "starting", "waiting for health" if p.health_url else "",
                    pid=pids.get(p.name))  # fmt: skip
        reporter.step(f"waiting for {stage} health")
        readiness.wait_healthy(run, procs)
    healthy_s = time.monotonic() - t0
    canary = run_canary(run)
    launch.record_up()
    endpoint = endpoint_of(launch)
    return UpResult(
        changed=True,
        message=f"{plan.deployment} is up: {len(plan.processes)} process(es) healthy",
        endpoint=endpoint,
        endpoints=endpoints_of(launch),
        canary=canary,
        elapsed_s=time.monotonic() - t0,
        healthy_s=healthy_s,
        handle=getattr(launch, "handle", {}),
    )


def endpoint_of(launch: Launch) -> str:
    """The router's base URL where it really listens."""
    url = launch.health_url(launch.plan.router)
    return health.base_url(url) if url else launch.plan.endpoint()


def endpoints_of(launch: Launch) -> list[tuple[str, str]]:
    """The OpenAI API, then each engine's base URL, where each really listens."""
    out = [("router (OpenAI API)", endpoint_of(launch) + "/v1")]
    for p in launch.plan.processes:
        url = launch.health_url(p) if p.role != "router" else None
        if url:
            out.append((p.name, health.base_url(url)))
    return out
