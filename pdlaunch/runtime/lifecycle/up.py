"""`up`, written once over :class:`pdlaunch.runtime.base.Runtime`.

lock -> survey what runs (adopt / nothing to do / refuse / replace: the runtime decides from
its record) -> preflight -> provision -> per stage (engines, then router): start, wait for
health (deadline + liveness) -> canary -> record as up. Any failure, or SIGINT/SIGTERM/SIGHUP,
after the survey rolls back (:mod:`.rollback`): what this run started is stopped and proven
gone before the record goes; a second signal meanwhile says truthfully what is left.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pdlaunch import health
from pdlaunch.hosts import HostError
from pdlaunch.hosts.pool import MAX_WORKERS
from pdlaunch.interrupts import Signalled, signal_name, signals_interrupt
from pdlaunch.plan import Plan, Process
from pdlaunch.runtime.base import STAGES, Launch, Runtime, stage_processes
from pdlaunch.state import DeploymentLock

from . import readiness
from .canary import run_canary
from .model import Failure, Interrupted, LaunchError, Reporter, UpOptions, UpResult, View
from .rollback import roll_back

ALIVE_EVERY = 1.0  # s between liveness checks (one command on the host) while not healthy


class Run:
    """One `up` under way: the runtime's Launch, the live view and the deadline."""

    def __init__(self, launch: Launch, reporter: Reporter, opts: UpOptions, deadline: float):
        self.launch = launch
        self.plan = launch.plan
        self.reporter = reporter
        self.opts = opts
        self.deadline = deadline
        self.provisioned = False
        self.views = {p.name: View(p.name, p.role, p.host) for p in self.plan.processes}
        for name in launch.adopted:
            self.set(name, "starting", "already running (adopted)")
        reporter.views(list(self.views.values()))

    def set(self, name: str, state: str, detail: str = "", pid: int | None = None) -> None:
        v = self.views[name]
        if pid is not None:  # first: a reporter thread that sees the new detail sees the pid
            v.pid = pid
        v.state, v.detail = state, detail
        self.reporter.update()

    def failure(self, p: Process, reason: str) -> Failure:
        return Failure(p.name, self.launch.where(p), reason, p.log_path, self.launch.log_tail(p))

    def wait_healthy(self, procs: list[Process]) -> None:
        """Until every process answers 200 on /health where it really listens (headless ones:
        alive), any exits (fail fast), or the deadline passes (every one not healthy named)."""
        abort = threading.Event()
        failures: list[Failure] = []
        launch = self.launch

        def watch(p: Process) -> None:
            url = launch.health_url(p)

            def probe(timeout: float) -> tuple[bool, str]:
                try:
                    pr = health.probe(url, timeout=timeout)  # type: ignore[arg-type]
                except Exception as exc:  # an answer that is not HTTP: unhealthy, said where
                    return False, f"{url}: {' '.join(str(exc).split())[:200]}"
                return pr.ok, pr.describe()

            try:
                out = readiness.wait_until(
                    probe if url else None,
                    lambda: launch.is_alive(p),
                    deadline=self.deadline,
                    interval=self.opts.poll_interval,
                    alive_every=ALIVE_EVERY,
                    sleep=abort.wait,
                    aborted=abort.is_set,
                    on_wait=lambda detail: self.set(p.name, "starting", detail),
                )
            except (HostError, LaunchError) as exc:
                failures.append(Failure(p.name, launch.where(p), f"cannot check process: {exc}"))
                self.set(p.name, "failed", str(exc))
                abort.set()
                return
            if out.status == readiness.READY:
                self.set(p.name, "healthy" if url else "running", url or out.detail)
                return
            if out.status == readiness.ABORTED:
                return
            if out.status == readiness.EXITED:
                reason = "exited during start"
                self.set(p.name, "failed", reason)
                abort.set()  # fail fast: the others need not be waited for
            else:
                # No abort: the others reach the same deadline now, and each that is not
                # healthy is named with its own last answer.
                reason = f"not healthy before the deadline ({out.detail} at {url})"
                self.set(p.name, "failed", "health deadline passed")
            failures.append(self.failure(p, reason))

        # Own executor: on Ctrl-C the watchers must stop at once, not at the deadline, so
        # `abort` is set before waiting for them.
        executor = ThreadPoolExecutor(max_workers=min(MAX_WORKERS, max(1, len(procs))))
        try:
            for f in [executor.submit(watch, p) for p in procs]:
                f.result()
        finally:
            abort.set()
            executor.shutdown(wait=True)
        if failures:
            order = {p.name: i for i, p in enumerate(procs)}
            failures.sort(key=lambda f: order.get(f.name, len(order)))  # plan order, not racy
            first = failures[0]
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise LaunchError(
                f"{first.name} on {first.host}: {first.reason}{more}",
                failures + self.launch.context(),
            )


def up(
    runtime: Runtime, plan: Plan, opts: UpOptions, reporter: Reporter | None = None
) -> UpResult:
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
        run.wait_healthy(procs)
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
