"""`up`: reconcile with what already runs, then start the deployment, or roll back.

render -> survey what the record (or the pid files) says runs -> adopt / refuse / replace ->
connect every host (parallel) -> private work dirs, scripts, secret env files (parallel) ->
start prefill and decode everywhere (parallel) -> wait for health -> router -> canary
(every prefill -> decode pair, then through the router: launch/canary.py) ->
record. A pid is in the state file before the start of the next process; any failure, or
SIGINT/SIGTERM/SIGHUP, stops everything this run holds, router first, then decode, then
prefill, and a second signal during that says truthfully what still runs.
"""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pdlaunch import health
from pdlaunch.hosts import CommandTimeout, HostError, HostPool, Upload, containers, parallel
from pdlaunch.hosts.pool import MAX_WORKERS, HostKey, Opener
from pdlaunch.hosts.shell import exec_owned_script
from pdlaunch.interrupts import Signalled, signal_name, signals_interrupt
from pdlaunch.plan import Plan, Process
from pdlaunch.render import RenderedFile, render_plan
from pdlaunch.state import (
    DeploymentLock,
    DeploymentState,
    file_hashes,
    load_state,
    remove_state,
    save_state,
    scripts_hash,
)

from . import readiness
from .canary import run_canary
from .model import Failure, Interrupted, LaunchError, Reporter, UpOptions, UpResult, View
from .records import (
    describe_changes,
    endpoints,
    log_tail,
    missing_secrets,
    proc_host,
    proc_key,
    process_state,
    secrets_file,
    survey,
    unknown_message,
    unrecorded_state,
)
from .rollback import roll_back
from .stopping import stop_processes

ALIVE_EVERY = 1.0  # s between liveness checks (one command on the host) while not healthy
COMMAND_TIMEOUT = 60.0  # upper bound of one host command during `up`, within --timeout


# -- the deployment under way ---------------------------------------------------------------------
class _Run:
    """One `up`: what it holds (for rollback) and the live view."""

    def __init__(
        self,
        plan: Plan,
        state: DeploymentState,
        pool: HostPool,
        reporter: Reporter,
        *,
        grace: float,
        deadline: float,
        adopted: frozenset[str] = frozenset(),
    ):
        self.plan = plan
        self.state = state
        self.pool = pool
        self.reporter = reporter
        self.grace = grace
        self.deadline = deadline
        self.adopted = adopted
        self.uploaded = False
        self.lock = threading.Lock()  # guards self.state: every change and its serialization
        self._write_lock = threading.Lock()  # one write at a time
        self._asked = 0  # save() calls so far
        self._written = 0  # the last call whose change is on disk
        self.views = {p.name: View(p.name, p.role, p.host) for p in plan.processes}
        for name in adopted:
            ps = state.process(name)
            self.views[name].state, self.views[name].pid = "starting", ps.pid if ps else None
            self.views[name].detail = "already running (adopted)"
        reporter.views(list(self.views.values()))

    def set(self, name: str, state: str, detail: str = "", pid: int | None = None) -> None:
        v = self.views[name]
        if pid is not None:  # first: a reporter thread that sees the new detail sees the pid
            v.pid = pid
        v.state, v.detail = state, detail
        self.reporter.update()

    def save(self) -> None:
        """Put every change made so far on disk before returning. Parallel starts each call
        this: a caller whose change a write begun after it already holds returns at once, so
        N starts cost a few writes (each an fsync of the whole record), not N in a row. The
        write works on a copy, so other starts record their pids meanwhile (and the next
        write takes them all)."""
        with self.lock:
            self._asked += 1
            mine = self._asked
        with self._write_lock:
            if self._written >= mine:
                return
            with self.lock:
                upto = self._asked
                snapshot = copy.deepcopy(self.state)
            save_state(snapshot)
            self._written = upto

    def command_timeout(self) -> float:
        """What is left of --timeout for one host command (at least 1 s, at most 60 s)."""
        return max(1.0, min(COMMAND_TIMEOUT, self.deadline - time.monotonic()))

    # steps ----------------------------------------------------------------------------------
    def prepare(self, files: dict[str, RenderedFile]) -> None:
        """Per host in parallel, in one command each: private work dirs (0700, owner
        checked), the previous logs kept as .prev, then the scripts (0755) and secret env
        files (0600) of the processes to start."""
        by_host: dict[HostKey, list[Process]] = {}
        for p in self.plan.processes:
            by_host.setdefault(proc_key(p), []).append(p)

        def one(procs: list[Process]) -> None:
            host = proc_host(self.pool, procs[0])
            dirs = sorted({d for p in procs for d in p.dirs})
            fresh = [p for p in procs if p.name not in self.adopted]
            uploads = []
            for p in fresh:
                uploads.append(Upload(files[f"{p.name}.sh"].content, p.script_path, 0o755))
                if p.secret_env:
                    uploads.append(Upload(secrets_file(p), p.secrets_path, 0o600))
            host.put_files(
                uploads,
                private_dirs=dirs,
                keep_previous=[p.log_path for p in fresh],
                timeout=self.command_timeout(),
            )

        parallel(one, by_host.values())

    def start(self, procs: list[Process]) -> None:
        procs = [p for p in procs if p.name not in self.adopted]

        def one(p: Process) -> None:
            host = proc_host(self.pool, p)
            self.set(p.name, "starting", "launching")
            started = host.start_tracked(
                exec_owned_script(p.script_path),  # the pid is the engine's own
                pid_file=p.pid_path,
                log_file=p.log_path,
                cwd=p.work_dir,
                timeout=self.command_timeout(),
            )
            pid, start_time = started.pid, started.start_time
            ps = self.state.process(p.name)
            assert ps is not None
            with self.lock:
                ps.pid, ps.start_time, ps.started_at = pid, start_time, time.time()
            # On disk before anything else starts: a kill -9 of pdlaunch right now must still
            # leave `down` a record (and the pid file on the host covers the gap before this).
            self.save()
            self.set(p.name, "starting", "waiting for health" if p.health_url else "", pid=pid)

        errors: list[tuple[Process, BaseException]] = []

        def guarded(p: Process) -> None:
            try:
                one(p)
            except HostError as exc:
                self.set(p.name, "failed", str(exc))
                errors.append((p, exc))

        parallel(guarded, procs)
        if errors:
            p, exc = errors[0]
            host = proc_host(self.pool, p)
            raise LaunchError(
                f"{p.name} on {p.host} could not be started: {exc}",
                [Failure(p.name, p.host, str(exc), p.log_path, log_tail(host, p.log_path))],
            )

    def wait_healthy(self, procs: list[Process], interval: float) -> None:
        """Until every process answers 200 on /health (headless ones: alive), any exits, or
        the deadline passes. Fails fast on the first failure."""
        abort = threading.Event()
        failures: list[Failure] = []

        def watch(p: Process) -> None:
            host = proc_host(self.pool, p)
            ps = self.state.process(p.name)
            assert ps is not None and ps.pid is not None
            pid, start_time = ps.pid, ps.start_time

            def probe(timeout: float) -> tuple[bool, str]:
                pr = health.probe(p.health_url, timeout=timeout)
                return pr.ok, pr.describe()

            try:
                out = readiness.wait_until(
                    probe if p.health_url else None,
                    lambda: host.is_alive(pid, start_time),
                    deadline=self.deadline,
                    interval=interval,
                    alive_every=ALIVE_EVERY,
                    sleep=abort.wait,
                    aborted=abort.is_set,
                    on_wait=lambda detail: self.set(p.name, "starting", detail),
                )
            except HostError as exc:
                failures.append(Failure(p.name, p.host, f"cannot check process: {exc}"))
                self.set(p.name, "failed", str(exc))
                abort.set()
                return
            if out.status == readiness.READY:
                if p.health_url:
                    self.set(p.name, "healthy", p.health_url)
                else:
                    self.set(p.name, "running", out.detail)
                return
            if out.status == readiness.ABORTED:
                return
            if out.status == readiness.EXITED:
                reason = "exited during start"
                self.set(p.name, "failed", reason)
            else:
                reason = f"not healthy before the deadline ({out.detail} at {p.health_url})"
                self.set(p.name, "failed", "health deadline passed")
            failures.append(Failure(p.name, p.host, reason, p.log_path, log_tail(host, p.log_path)))
            abort.set()

        # Own executor (not parallel()): on Ctrl-C the watchers must stop at once, not at the
        # deadline, so `abort` is set before waiting for them.
        executor = ThreadPoolExecutor(max_workers=min(MAX_WORKERS, max(1, len(procs))))
        try:
            for f in [executor.submit(watch, p) for p in procs]:
                f.result()
        finally:
            abort.set()
            executor.shutdown(wait=True)
        if failures:
            first = failures[0]
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            raise LaunchError(f"{first.name} on {first.host}: {first.reason}{more}", failures)

    def started_here(self) -> set[str]:
        """What this run may have started: everything but the processes it adopted (those ran
        before it and keep running, recorded, whatever happens to this run)."""
        return {p.name for p in self.plan.processes} - self.adopted

    def rollback(self) -> list[str]:
        """Stop what this run started (router, decode, prefill); returns errors."""
        return stop_processes(
            self.state,
            self.pool,
            self.reporter,
            self.views,
            grace=self.grace,
            only=self.started_here(),
        )


# -- up -------------------------------------------------------------------------------------------
def up(
    plan: Plan,
    opts: UpOptions,
    reporter: Reporter | None = None,
    *,
    opener: Opener | None = None,
) -> UpResult:
    """Start the deployment (see the module docstring). Raises LaunchError/StateError.
    ``opener``: how hosts are opened (tests pass test doubles)."""
    reporter = reporter or Reporter()
    t0 = time.monotonic()
    files = render_plan(plan)
    by_name = {f.name: f for f in files}
    digest = scripts_hash(files)
    eps = endpoints(plan)
    with DeploymentLock(plan.deployment, "up"), signals_interrupt():
        old = load_state(plan.deployment)
        connect = opts.connect
        if old is not None:
            connect = connect.or_recorded(old.known_hosts, old.ssh_config)
        pool = HostPool(connect, opener=opener)
        try:
            missing = missing_secrets(plan)
            if missing:
                lines = [f"{var} (for {', '.join(procs)})" for var, procs in missing.items()]
                raise LaunchError(
                    "secret(s) not set in this shell: "
                    + "; ".join(lines)
                    + ". Export them before `pdlaunch up`; nothing was started."
                )
            try:
                decided = _reconcile(plan, old, files, digest, opts, pool, reporter)
            except (KeyboardInterrupt, Signalled) as exc:
                raise Interrupted(
                    signal_name(exc),
                    f"interrupted by {signal_name(exc)} while checking what already runs; "
                    "nothing was started",
                ) from None
            if isinstance(decided, UpResult):
                decided.endpoints = eps
                return decided
            state, adopted = decided
            if opts.preflight is not None:
                if adopted:
                    reporter.step(
                        f"preflight skipped: {len(adopted)} process(es) of the deployment run "
                        "and hold their ports"
                    )
                else:
                    reporter.step("preflight check")
                    opts.preflight(pool)
            state.topology = opts.topology_path
            state.scripts_hash = digest
            state.endpoint = plan.endpoint()
            state.served_model_name = plan.served_model_name
            state.known_hosts = connect.known_hosts
            state.ssh_config = connect.ssh_config
            state.file_hashes = file_hashes(files)
            state.scripts = {f.name: f.content for f in files if f.name.endswith(".sh")}
            state.status = "starting"
            run = _Run(
                plan,
                state,
                pool,
                reporter,
                grace=opts.stop_grace,
                deadline=t0 + opts.timeout,
                adopted=frozenset(adopted),
            )
            try:
                result = _up_steps(run, plan, opts, by_name, t0)
            except BaseException as exc:
                raise roll_back(run, exc, reporter) from None
            result.endpoints = eps
            result.adopted = sorted(adopted)
            return result
        finally:
            pool.close()


def _reconcile(
    plan: Plan,
    old: DeploymentState | None,
    files: list[RenderedFile],
    digest: str,
    opts: UpOptions,
    pool: HostPool,
    reporter: Reporter,
) -> UpResult | tuple[DeploymentState, list[str]]:
    """What already runs decides what `up` does: nothing (already up), adopt the running
    processes of the same scripts and start the rest, replace, or refuse. Anything that
    cannot be verified refuses, with the record kept."""
    by_name = {f.name: f for f in files}
    reporter.step("checking what already runs")
    looked_at = old if old is not None else unrecorded_state(plan, status="starting")
    found = survey(looked_at, pool)
    if old is not None and found.found:
        save_state(old)  # pids found only by their pid files are now on record
    if not found.complete and old is None:  # nothing recorded: a plain connection failure
        errors = sorted(set(found.unknown.values()))
        raise LaunchError(f"cannot reach {len(errors)} host(s): {'; '.join(errors)}")
    if not found.complete:
        raise LaunchError(unknown_message(found, plan.deployment))
    fresh = DeploymentState(
        deployment=plan.deployment,
        topology=opts.topology_path,
        scripts_hash=digest,
        endpoint=plan.endpoint(),
        served_model_name=plan.served_model_name,
        processes=[process_state(p, by_name[f"{p.name}.sh"]) for p in plan.processes],
        # Names only: doctor's bundle redacts their values even if the topology moves.
        secret_names=sorted({v for p in plan.processes for v in p.secret_env.values()}),
    )
    if not found.alive and not found.strangers:
        if old is not None:
            remove_state(plan.deployment)  # every recorded process is proven gone
        return fresh, []

    alive = found.alive
    if old is None:
        why = (
            f"{len(alive)} process(es) of {plan.deployment} already run on their hosts "
            f"({', '.join(alive)}; found by their pid files), but nothing is recorded on this "
            "control host (started from another one, or the record was lost)"
        )
        if not opts.replace:
            raise LaunchError(
                f"{why}. Run `pdlaunch down {_file(opts)}` to stop them, or "
                f"`pdlaunch up {_file(opts)} --replace`."
            )
        reporter.step(f"replacing: {why}")
        _stop_or_keep(looked_at, found.strangers, pool, reporter, opts, save=True)
        return fresh, []

    same = old.scripts_hash == digest
    planned = {p.name for p in plan.processes}
    if same and not opts.replace:
        if found.strangers:
            reporter.step(
                "stopping processes the record does not track (second copies left by an "
                "earlier run, or what a dead leader left running): "
                + ", ".join(f"{s.name} (pid {s.pid})" for s in found.strangers)
            )
            copies = DeploymentState(
                old.deployment,
                old.topology,
                old.scripts_hash,
                old.endpoint,
                old.served_model_name,
            )
            _stop_or_keep(copies, found.strangers, pool, reporter, opts, save=False)
        if not alive:
            remove_state(plan.deployment)  # what was left of it is stopped: nothing runs
            return fresh, []
        if set(alive) >= planned and old.status == "up":
            return UpResult(
                changed=False,
                message=f"{plan.deployment} is already up and unchanged "
                f"({len(alive)} process(es) running); nothing to do",
                endpoint=old.endpoint,
            )
        reporter.step(
            f"adopting {len(alive)} running process(es) of the same scripts: {', '.join(alive)}"
        )
        for ps in fresh.processes:
            rec = old.process(ps.name)
            if rec is not None and ps.name in alive:
                ps.pid, ps.start_time, ps.started_at = rec.pid, rec.start_time, rec.started_at
        fresh.created_at = old.created_at
        save_state(fresh)
        return fresh, list(alive)

    reasons = ["--replace given"] if same else describe_changes(old, files)
    if not opts.replace:
        raise LaunchError(
            f"{plan.deployment} is already running ({len(alive)} process(es) alive) and "
            "differs from this topology: "
            + "; ".join(reasons)
            + ". Re-run with --replace to stop it and start this topology."
        )
    reporter.step("replacing: " + "; ".join(reasons))
    _stop_or_keep(old, found.strangers, pool, reporter, opts, save=True)
    remove_state(plan.deployment)
    return fresh, []


def _stop_or_keep(
    state: DeploymentState,
    extra: list,
    pool: HostPool,
    reporter: Reporter,
    opts: UpOptions,
    *,
    save: bool,
) -> None:
    errors = stop_processes(state, pool, reporter, grace=opts.stop_grace, extra=extra)
    if errors:
        if save:
            state.status = "failed"
            save_state(state)
        raise LaunchError(
            "cannot stop the running deployment: "
            + "; ".join(errors)
            + f" (its record is kept: run `pdlaunch down {state.deployment}`)"
        )


def _check_images(run: _Run, plan: Plan) -> None:
    """Every docker/podman image on its node before anything starts (run never pulls)."""
    missing = containers.plan_images(plan.processes, lambda p: proc_host(run.pool, p))
    if missing:
        raise LaunchError(
            "container image(s) missing: "
            + "; ".join(msg for _, msg in missing)
            + " (load or pull them on those nodes first)",
            [Failure("(image)", host, msg) for host, msg in missing],
        )


def _file(opts: UpOptions) -> str:
    return opts.topology_path or "FILE"


def _up_steps(
    run: _Run,
    plan: Plan,
    opts: UpOptions,
    files: dict[str, RenderedFile],
    t0: float,
) -> UpResult:
    reporter = run.reporter
    targets = [(p.host, p.local, p.ssh.model_dump()) for p in plan.processes]
    n_hosts = len(set(map(proc_key, plan.processes)))
    reporter.step(f"connecting to {n_hosts} host(s)")
    errors = run.pool.connect_all(targets)
    if errors:
        for p in plan.processes:
            if p.host in errors:
                run.set(p.name, "failed", "host unreachable")
        msg = "; ".join(errors.values())
        raise LaunchError(
            f"cannot reach {len(errors)} host(s): {msg}",
            [Failure("(host)", h, e) for h, e in errors.items()],
        )
    _check_images(run, plan)
    reporter.step("uploading scripts")
    run.uploaded = True
    try:
        run.prepare(files)
    except CommandTimeout as exc:
        raise LaunchError(
            f"preparing the hosts failed: {exc} (every host command is bounded by "
            f"--timeout {opts.timeout:g}s)"
        ) from None
    except HostError as exc:
        raise LaunchError(f"preparing the hosts failed: {exc}") from None
    run.save()

    engines = [p for p in plan.processes if p.role in ("prefill", "decode")]
    reporter.step(f"starting {len(engines)} prefill/decode process(es)")
    run.start(engines)
    reporter.step("waiting for prefill/decode health")
    run.wait_healthy(engines, opts.poll_interval)

    router = plan.by_role("router")
    reporter.step("starting the router")
    run.start(router)
    run.wait_healthy(router, opts.poll_interval)
    healthy_s = time.monotonic() - t0

    canary = run_canary(plan, run.state, run.pool, reporter, opts, run.deadline)

    run.state.status = "up"
    run.save()
    return UpResult(
        changed=True,
        message=f"{plan.deployment} is up: {len(plan.processes)} process(es) healthy",
        endpoint=plan.endpoint(),
        canary=canary,
        elapsed_s=time.monotonic() - t0,
        healthy_s=healthy_s,
    )
