"""Orchestration: `up`, `down`, `status`, `logs` over the hosts layer.

`up`: render -> check secrets -> connect every host (parallel) -> put scripts and secret env
files (parallel) -> start prefill and decode everywhere (parallel) -> wait for health with a
deadline, watching for early exits -> start the router -> wait for it -> canary -> record.
Anything failing (or Ctrl-C) stops everything this run started, router first, then decode,
then prefill, and the error names the process and carries the tail of its log.

State is written after every start, so a crash of pdlaunch itself still leaves a record that
`down` can use. No secret value is ever stored, logged or returned: only variable names.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pdlaunch import health, render
from pdlaunch.hosts import Host, HostError, LocalHost, SshSettings, open_host, sh_quote_path
from pdlaunch.plan import Plan, Process
from pdlaunch.render import RenderedFile, render_plan
from pdlaunch.state import (
    DeploymentLock,
    DeploymentState,
    ProcessState,
    StateError,
    file_hashes,
    load_state,
    remove_state,
    save_state,
    scripts_hash,
)

STOP_ORDER = ("router", "decode", "prefill")
LOG_TAIL_LINES = 30
ALIVE_EVERY = 1.0  # s between liveness checks (one command on the host) while not healthy
MAX_WORKERS = 64


# -- errors and results ---------------------------------------------------------------------------
class LaunchError(Exception):
    """A failed operation; ``str()`` is the user-facing message. ``failures`` name processes
    (or hosts) with the last lines of their logs."""

    def __init__(self, message: str, failures: list[Failure] | None = None):
        super().__init__(message)
        self.message = message
        self.failures = failures or []
        # None: nothing had been started; True: everything started was stopped again;
        # False: some processes could not be stopped (they stay recorded for `down`).
        self.rolled_back: bool | None = None

    def __str__(self) -> str:
        return self.message


@dataclass
class Failure:
    name: str
    host: str
    reason: str
    log_path: str | None = None
    log_tail: str = ""


@dataclass
class View:
    """One row of the live view."""

    name: str
    role: str
    host: str
    state: str = "pending"  # pending | starting | healthy | running | failed | stopped
    pid: int | None = None
    detail: str = ""


class Reporter:
    """What `up`/`down` tell the user while they run; the CLI renders it (rich). No-op here."""

    def step(self, message: str) -> None:
        pass

    def views(self, views: list[View]) -> None:
        pass

    def update(self) -> None:
        pass

    def warn(self, message: str) -> None:
        pass


@dataclass
class UpOptions:
    timeout: float = 600.0
    canary: bool = True
    replace: bool = False
    accept_new_host_keys: bool = False
    known_hosts: str | None = None
    ssh_config: str | None = None  # replaces ~/.ssh/config (like ssh -F)
    stop_grace: float = 10.0
    topology_path: str = ""
    poll_interval: float = 0.2
    canary_timeout: float = 300.0  # a PD request can stall for minutes on a loaded host


@dataclass
class UpResult:
    changed: bool
    message: str
    endpoint: str
    endpoints: list[tuple[str, str]] = field(default_factory=list)
    canary: health.CanaryResult | None = None
    elapsed_s: float = 0.0
    healthy_s: float = 0.0  # until every engine and the router were healthy


# -- hosts ----------------------------------------------------------------------------------------
def ssh_settings(ssh: dict[str, Any] | Any) -> SshSettings:
    d = ssh if isinstance(ssh, dict) else ssh.model_dump()
    return SshSettings(
        user=d.get("user"),
        port=d.get("port"),
        key_file=d.get("key"),
        connect_timeout=float(d.get("connect_timeout") or 10.0),
        jump=d.get("jump"),
    )


HostKey = tuple[str, bool, tuple]


def _host_key(host: str, local: bool, ssh: dict[str, Any]) -> HostKey:
    return (host, local, () if local else tuple(sorted(ssh.items())))


class HostPool:
    """One connection per (host, ssh settings), opened in parallel, shared by threads."""

    def __init__(
        self,
        *,
        accept_new_host_keys: bool = False,
        known_hosts: str | None = None,
        ssh_config: str | None = None,
    ):
        self.accept_new_host_keys = accept_new_host_keys
        self.known_hosts = known_hosts
        self.ssh_config = ssh_config
        self._hosts: dict[HostKey, Host] = {}
        self._failed: dict[HostKey, HostError] = {}
        self._key_locks: dict[HostKey, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, host: str, local: bool, ssh: dict[str, Any]) -> Host:
        """The connected host (connecting once, even when asked from many threads); a host
        that failed to connect raises the same HostError again without a second attempt."""
        key = _host_key(host, local, ssh)
        with self._lock:
            h = self._hosts.get(key)
            if h is not None:
                return h
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                h = self._hosts.get(key)
                failed = self._failed.get(key)
            if h is not None:
                return h
            if failed is not None:
                raise failed
            try:
                if local:
                    h = LocalHost(host)
                else:
                    h = open_host(
                        host,
                        ssh=ssh_settings(ssh),
                        force_ssh=True,
                        accept_new_host_keys=self.accept_new_host_keys,
                        known_hosts=self.known_hosts,
                        ssh_config_file=self.ssh_config,
                    )
            except HostError as exc:
                with self._lock:
                    self._failed[key] = exc
                raise
            with self._lock:
                self._hosts[key] = h
            return h

    def connect_all(self, targets: Iterable[tuple[str, bool, dict[str, Any]]]) -> dict[str, str]:
        """Connect to every target in parallel; returns {host: error message} for failures."""
        unique = {_host_key(*t): t for t in targets}
        errors: dict[str, str] = {}

        def one(t: tuple[str, bool, dict[str, Any]]) -> None:
            try:
                self.get(*t)
            except HostError as exc:
                errors[t[0]] = str(exc)

        _parallel(one, unique.values())
        return errors

    def close(self) -> None:
        with self._lock:
            hosts, self._hosts = list(self._hosts.values()), {}
        for h in hosts:
            with contextlib.suppress(Exception):
                h.close()


def _parallel(fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    """Run ``fn`` over ``items`` in threads; returns results in order; re-raises the first
    exception after all finished."""
    items = list(items)
    if not items:
        return []
    if len(items) == 1:
        return [fn(items[0])]
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(items))) as pool:
        futures = [pool.submit(fn, it) for it in items]
        results, first_exc = [], None
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as exc:
                results.append(None)
                first_exc = first_exc or exc
    if first_exc is not None:
        raise first_exc
    return results


def _proc_host(pool: HostPool, p: Process | ProcessState) -> Host:
    ssh = p.ssh if isinstance(p, ProcessState) else p.ssh.model_dump()
    return pool.get(p.host, p.local, ssh)


def _log_tail(host: Host, path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return host.read_log(path, lines)
    except HostError as exc:
        return f"(cannot read {path}: {exc})"


# -- secrets --------------------------------------------------------------------------------------
def missing_secrets(plan: Plan, environ: dict[str, str] | None = None) -> dict[str, list[str]]:
    """{control-host variable: [processes needing it]} for every secret not set here."""
    env = os.environ if environ is None else environ
    missing: dict[str, list[str]] = {}
    for p in plan.processes:
        for src in p.secret_env.values():
            if src not in env:
                missing.setdefault(src, []).append(p.name)
    return missing


def secrets_file(p: Process, environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return render.render_secrets({var: env[src] for var, src in p.secret_env.items()})


# -- state helpers --------------------------------------------------------------------------------
def _process_state(p: Process, script: RenderedFile | None) -> ProcessState:
    """``script``: the rendered script whose hash is recorded (None: not known, as for a
    process found by :func:`find_running`)."""
    return ProcessState(
        name=p.name,
        role=p.role,
        host=p.host,
        local=p.local,
        ssh=p.ssh.model_dump(mode="json"),
        work_dir=p.work_dir,
        script_path=p.script_path,
        log_path=p.log_path,
        pid_path=p.pid_path,
        secrets_path=p.secrets_path,
        health_url=p.health_url,
        ports=[x.port for x in p.ports],
        script_hash=file_hashes([script])[script.name] if script is not None else "",
    )


def describe_changes(
    old: DeploymentState, files: list[RenderedFile], max_lines: int = 6
) -> list[str]:
    """Per rendered script: added, removed, or the changed lines (a short diff)."""
    new = {f.name: f.content for f in files}
    new_hashes = file_hashes(files)
    changes = []
    for name in sorted(set(old.file_hashes) | set(new)):
        if not name.endswith(".sh"):
            continue  # index.md and plan.json only restate the scripts
        if name not in old.file_hashes:
            changes.append(f"new process {name[:-3]}")
        elif name not in new:
            changes.append(f"process {name[:-3]} removed")
        elif old.file_hashes[name] != new_hashes[name]:
            before = old.scripts.get(name)
            if before is None:
                changes.append(f"{name[:-3]}: script changed")
                continue
            diff = [
                line
                for line in difflib.unified_diff(
                    before.splitlines(), new[name].splitlines(), lineterm="", n=0
                )
                if line[:1] in "+-" and not line.startswith(("+++", "---"))
            ]
            shown = [" ".join(d.split()) for d in diff[:max_lines]]
            more = f" (+{len(diff) - max_lines} more)" if len(diff) > max_lines else ""
            changes.append(f"{name[:-3]}: " + ", ".join(shown) + more)
    return changes or ["rendered files differ"]


# -- the deployment under way ---------------------------------------------------------------------
class _Run:
    """One `up`: what it started (for rollback) and the live view."""

    def __init__(
        self,
        plan: Plan,
        state: DeploymentState,
        pool: HostPool,
        reporter: Reporter,
        grace: float = 10.0,
    ):
        self.plan = plan
        self.grace = grace
        self.uploaded = False
        self.state = state
        self.pool = pool
        self.reporter = reporter
        self.lock = threading.Lock()
        self.views = {p.name: View(p.name, p.role, p.host) for p in plan.processes}
        reporter.views(list(self.views.values()))

    def set(self, name: str, state: str, detail: str = "", pid: int | None = None) -> None:
        v = self.views[name]
        v.state, v.detail = state, detail
        if pid is not None:
            v.pid = pid
        self.reporter.update()

    def save(self) -> None:
        with self.lock:
            save_state(self.state)
            self._saved = time.monotonic()

    def save_soon(self, every: float = 0.5) -> None:
        """Save unless saved within ``every`` s (starting 64 processes must not mean 64 state
        writes); callers save() once more when their batch is done."""
        if time.monotonic() - getattr(self, "_saved", 0.0) >= every:
            self.save()

    # steps ----------------------------------------------------------------------------------
    def prepare(self, files: dict[str, RenderedFile]) -> None:
        """Per host in parallel: work dirs, scripts (0755), secret env files (0600)."""
        by_host: dict[HostKey, list[Process]] = {}
        for p in self.plan.processes:
            by_host.setdefault(_host_key(p.host, p.local, p.ssh.model_dump()), []).append(p)

        def one(procs: list[Process]) -> None:
            host = _proc_host(self.pool, procs[0])
            dirs = sorted(
                {d for p in procs for d in (p.work_dir, _dirname(p.log_path), _dirname(p.pid_path))}
            )
            rotate = "; ".join(
                f"if [ -f {sh_quote_path(p.log_path)} ]; then mv -f -- "
                f"{sh_quote_path(p.log_path)} {sh_quote_path(p.log_path + '.prev')}; fi"
                for p in procs
            )
            host.run(
                "mkdir -p -- " + " ".join(sh_quote_path(d) for d in dirs) + "; " + rotate,
                timeout=60,
                check=True,
            )
            for p in procs:
                host.put(files[f"{p.name}.sh"].content, p.script_path, mode=0o755)
                if p.secret_env:
                    host.put(secrets_file(p), p.secrets_path, mode=0o600)

        _parallel(one, by_host.values())

    def start(self, procs: list[Process]) -> None:
        def one(p: Process) -> None:
            host = _proc_host(self.pool, p)
            self.set(p.name, "starting", "launching")
            pid = host.start_detached(
                "exec " + sh_quote_path(p.script_path),  # the pid is the engine's own
                pid_file=p.pid_path,
                log_file=p.log_path,
                cwd=p.work_dir,
            )
            start_time = None
            with contextlib.suppress(HostError):
                start_time = host.process_start_time(pid)
            ps = self.state.process(p.name)
            assert ps is not None
            with self.lock:
                ps.pid, ps.start_time, ps.started_at = pid, start_time, time.time()
            self.save_soon()
            self.set(p.name, "starting", "waiting for health" if p.health_url else "", pid=pid)

        errors: list[tuple[Process, BaseException]] = []

        def guarded(p: Process) -> None:
            try:
                one(p)
            except HostError as exc:
                self.set(p.name, "failed", str(exc))
                errors.append((p, exc))

        try:
            _parallel(guarded, procs)
        finally:
            self.save()
        if errors:
            p, exc = errors[0]
            host = _proc_host(self.pool, p)
            raise LaunchError(
                f"{p.name} on {p.host} could not be started: {exc}",
                [Failure(p.name, p.host, str(exc), p.log_path, _log_tail(host, p.log_path))],
            )

    def wait_healthy(self, procs: list[Process], deadline: float, interval: float) -> None:
        """Until every process answers 200 on /health (headless ones: alive), any exits, or
        the deadline passes. Fails fast on the first failure."""
        abort = threading.Event()
        failures: list[Failure] = []

        def watch(p: Process) -> None:
            host = _proc_host(self.pool, p)
            ps = self.state.process(p.name)
            assert ps is not None and ps.pid is not None
            last_alive_check = time.monotonic()
            while not abort.is_set():
                now = time.monotonic()
                if p.health_url:
                    pr = health.probe(p.health_url, timeout=min(2.0, max(0.2, deadline - now)))
                    if pr.ok:
                        self.set(p.name, "healthy", p.health_url)
                        return
                    detail = pr.describe()
                else:
                    detail = "headless"
                if now - last_alive_check >= ALIVE_EVERY or not p.health_url or now >= deadline:
                    last_alive_check = now
                    try:
                        alive = host.is_alive(ps.pid, ps.start_time)
                    except HostError as exc:
                        failures.append(Failure(p.name, p.host, f"cannot check process: {exc}"))
                        self.set(p.name, "failed", str(exc))
                        abort.set()
                        return
                    if not alive:
                        reason = "exited during start"
                        failures.append(
                            Failure(p.name, p.host, reason, p.log_path, _log_tail(host, p.log_path))
                        )
                        self.set(p.name, "failed", reason)
                        abort.set()
                        return
                    if not p.health_url:
                        self.set(p.name, "running", "headless (no HTTP server): alive")
                        return
                if time.monotonic() >= deadline:
                    reason = f"not healthy before the deadline ({detail} at {p.health_url})"
                    failures.append(
                        Failure(p.name, p.host, reason, p.log_path, _log_tail(host, p.log_path))
                    )
                    self.set(p.name, "failed", "health deadline passed")
                    abort.set()
                    return
                self.set(p.name, "starting", detail)
                abort.wait(max(0.0, min(interval, deadline - time.monotonic())))

        # Own executor (not _parallel): on Ctrl-C the watchers must stop at once, not at the
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

    def rollback(self) -> list[str]:
        """Stop everything this run started (router, decode, prefill); returns errors."""
        return stop_processes(self.state, self.pool, self.reporter, self.views, grace=self.grace)


def _dirname(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else "."


def stop_processes(
    state: DeploymentState,
    pool: HostPool,
    reporter: Reporter,
    views: dict[str, View] | None = None,
    *,
    grace: float = 10.0,
) -> list[str]:
    """Stop the recorded processes role by role (router, decode, prefill; each role in
    parallel), remove their secret env files, and drop them from ``state``. Returns one message
    per process that could not be stopped (those stay in the state)."""
    errors: list[str] = []
    lock = threading.Lock()

    def one(ps: ProcessState) -> None:
        view = views.get(ps.name) if views and ps.pid is not None else None
        failed = view is not None and view.state == "failed"
        try:
            host = _proc_host(pool, ps)
            if ps.pid is not None:
                if view and not failed:
                    view.state = "stopping"
                    reporter.update()
                host.stop(ps.pid, grace=grace, start_time=ps.start_time)
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

    for role in STOP_ORDER:
        procs = [p for p in state.processes if p.role == role]
        if procs:
            _parallel(one, procs)
    return errors


# -- up -------------------------------------------------------------------------------------------
def _all_alive(state: DeploymentState, pool: HostPool) -> tuple[list[str], list[str]]:
    """(names alive, names not alive/unknown) of the recorded processes."""
    alive: list[str] = []
    dead: list[str] = []

    def one(ps: ProcessState) -> None:
        try:
            ok = ps.pid is not None and _proc_host(pool, ps).is_alive(ps.pid, ps.start_time)
        except HostError:
            ok = False
        (alive if ok else dead).append(ps.name)

    _parallel(one, state.processes)
    return alive, dead


def up(plan: Plan, opts: UpOptions, reporter: Reporter | None = None) -> UpResult:
    """Start the deployment (see the module docstring). Raises LaunchError/StateError."""
    reporter = reporter or Reporter()
    t0 = time.monotonic()
    files = render_plan(plan)
    by_name = {f.name: f for f in files}
    digest = scripts_hash(files)
    endpoints = _endpoints(plan)
    with DeploymentLock(plan.deployment, "up"):
        pool = HostPool(
            accept_new_host_keys=opts.accept_new_host_keys,
            known_hosts=opts.known_hosts,
            ssh_config=opts.ssh_config,
        )
        try:
            old = load_state(plan.deployment)
            if old is not None and old.started():
                result = _existing(plan, old, files, digest, opts, pool, reporter)
                if result is not None:
                    result.endpoints = endpoints
                    return result
            elif old is not None:
                remove_state(plan.deployment)

            missing = missing_secrets(plan)
            if missing:
                lines = [f"{var} (for {', '.join(procs)})" for var, procs in missing.items()]
                raise LaunchError(
                    "secret(s) not set in this shell: "
                    + "; ".join(lines)
                    + ". Export them before `pdlaunch up`; nothing was started."
                )

            state = DeploymentState(
                deployment=plan.deployment,
                topology=opts.topology_path,
                scripts_hash=digest,
                endpoint=plan.endpoint(),
                served_model_name=plan.served_model_name,
                known_hosts=opts.known_hosts,
                ssh_config=opts.ssh_config,
                file_hashes=file_hashes(files),
                scripts={f.name: f.content for f in files if f.name.endswith(".sh")},
                processes=[_process_state(p, by_name[f"{p.name}.sh"]) for p in plan.processes],
            )
            run = _Run(plan, state, pool, reporter, grace=opts.stop_grace)
            try:
                return _up_steps(run, plan, opts, by_name, t0, endpoints)
            except BaseException as exc:
                _rollback(run, exc, reporter)
                raise
        finally:
            pool.close()


def _up_steps(
    run: _Run,
    plan: Plan,
    opts: UpOptions,
    files: dict[str, RenderedFile],
    t0: float,
    endpoints: list[tuple[str, str]],
) -> UpResult:
    reporter = run.reporter
    deadline = t0 + opts.timeout
    targets = [(p.host, p.local, p.ssh.model_dump()) for p in plan.processes]
    n_hosts = len({_host_key(*t) for t in targets})
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
    reporter.step("uploading scripts")
    run.uploaded = True
    try:
        run.prepare(files)
    except HostError as exc:
        raise LaunchError(f"preparing the hosts failed: {exc}") from None
    run.save()

    engines = [p for p in plan.processes if p.role in ("prefill", "decode")]
    reporter.step(f"starting {len(engines)} prefill/decode process(es)")
    run.start(engines)
    reporter.step("waiting for prefill/decode health")
    run.wait_healthy(engines, deadline, opts.poll_interval)

    router = plan.by_role("router")
    reporter.step("starting the router")
    run.start(router)
    run.wait_healthy(router, deadline, opts.poll_interval)
    healthy_s = time.monotonic() - t0

    canary = None
    if opts.canary:
        reporter.step("canary request through the router")
        canary = health.canary(
            plan.endpoint(),
            plan.served_model_name,
            [p.health_url for p in plan.by_role("prefill") if p.health_url],
            [p.health_url for p in plan.by_role("decode") if p.health_url],
            timeout=min(opts.canary_timeout, max(5.0, deadline - time.monotonic())),
        )
        if not canary.ok:
            r = plan.router
            host = _proc_host(run.pool, r)
            fails = [
                Failure("router", r.host, canary.message, r.log_path, _log_tail(host, r.log_path))
            ]
            for d in plan.by_role("decode")[:1]:
                fails.append(
                    Failure(
                        d.name,
                        d.host,
                        "decode log",
                        d.log_path,
                        _log_tail(_proc_host(run.pool, d), d.log_path),
                    )
                )
            raise LaunchError(f"canary failed: {canary.message}", fails)

    run.state.status = "up"
    run.save()
    return UpResult(
        changed=True,
        message=f"{plan.deployment} is up: {len(plan.processes)} process(es) healthy",
        endpoint=plan.endpoint(),
        endpoints=endpoints,
        canary=canary,
        elapsed_s=time.monotonic() - t0,
        healthy_s=healthy_s,
    )


def _rollback(run: _Run, exc: BaseException, reporter: Reporter) -> None:
    if not run.state.started():
        if run.uploaded and any(p.secret_env for p in run.plan.processes):
            # Nothing runs, but secret env files may have been written: take them back.
            stop_processes(run.state, run.pool, Reporter(), grace=0)
        remove_state(run.plan.deployment)
        return
    reporter.step("rolling back: stopping what this run started")
    errors = run.rollback()
    if errors:
        run.state.status = "failed"
        with contextlib.suppress(StateError):
            run.save()
        msg = "rollback could not stop: " + "; ".join(errors) + " (retry with `pdlaunch down`)"
        reporter.warn(msg)
        if isinstance(exc, LaunchError):
            exc.message += f"\n{msg}"
            exc.rolled_back = False
    else:
        remove_state(run.plan.deployment)
        if isinstance(exc, LaunchError):
            exc.rolled_back = True


def _existing(
    plan: Plan,
    old: DeploymentState,
    files: list[RenderedFile],
    digest: str,
    opts: UpOptions,
    pool: HostPool,
    reporter: Reporter,
) -> UpResult | None:
    """Decide what to do about a recorded deployment; None means: go on and start."""
    reporter.step("checking the running deployment")
    alive, dead = _all_alive(old, pool)
    same = old.scripts_hash == digest
    if same and not dead and old.status == "up":
        return UpResult(
            changed=False,
            message=f"{plan.deployment} is already up and unchanged "
            f"({len(alive)} process(es) running); nothing to do",
            endpoint=old.endpoint,
        )
    if not alive:
        reporter.step("recorded processes are gone; starting afresh")
        remove_state(plan.deployment)
        return None
    if same:
        reasons = [f"not running: {', '.join(sorted(dead))}"] if dead else []
        if old.status != "up":
            reasons.append(f"previous up ended as {old.status!r}")
    else:
        reasons = describe_changes(old, files)
    if not opts.replace:
        raise LaunchError(
            f"{plan.deployment} is already running ({len(alive)} process(es) alive) and "
            + ("differs from this topology: " if not same else "is not healthy: ")
            + "; ".join(reasons)
            + ". Re-run with --replace to stop it and start this topology."
        )
    reporter.step("replacing: " + "; ".join(reasons))
    errors = stop_processes(old, pool, reporter, grace=opts.stop_grace)
    if errors:
        save_state(old)
        raise LaunchError("cannot stop the running deployment: " + "; ".join(errors))
    remove_state(plan.deployment)
    return None


def _endpoints(plan: Plan) -> list[tuple[str, str]]:
    out = [("router (OpenAI API)", plan.endpoint() + "/v1")]
    for p in plan.processes:
        if p.role != "router" and p.health_url:
            out.append((p.name, health.base_url(p.health_url)))
    return out


def _pool_for(
    state: DeploymentState,
    accept_new_host_keys: bool,
    known_hosts: str | None,
    ssh_config: str | None,
) -> HostPool:
    """Hosts for a recorded deployment: options given now, else those `up` used."""
    return HostPool(
        accept_new_host_keys=accept_new_host_keys,
        known_hosts=known_hosts or state.known_hosts,
        ssh_config=ssh_config or state.ssh_config,
    )


# -- down -----------------------------------------------------------------------------------------
@dataclass
class DownResult:
    stopped: list[str]
    message: str


# A pid file alone is not proof: the pid may have been reused. The process `up` started has its
# log open as stdout (the start script redirects it; `up` rotates an old log to .prev).
_FIND_SCRIPT = """pidf={pid}; logf={log}
[ -f "$pidf" ] || exit 0
read -r pid < "$pidf" || exit 0
case $pid in ''|*[!0-9]*) exit 0 ;; esac
if [ "/proc/$pid/fd/1" -ef "$logf" ] || [ "/proc/$pid/fd/1" -ef "$logf.prev" ]; then
  echo "$pid"
fi
"""


def find_running(plan: Plan, pool: HostPool) -> DeploymentState:
    """The plan's processes that still run on their hosts, found by their pid files and
    confirmed by the log each one writes: what `down` stops when nothing is recorded (state
    lost, or `up` ran on another control host). Raises HostError for an unreachable host."""
    state = DeploymentState(
        deployment=plan.deployment,
        topology="",
        scripts_hash="",
        endpoint=plan.endpoint(),
        served_model_name=plan.served_model_name,
        status="stopping",
    )
    lock = threading.Lock()

    def one(p: Process) -> None:
        host = _proc_host(pool, p)
        script = _FIND_SCRIPT.format(pid=sh_quote_path(p.pid_path), log=sh_quote_path(p.log_path))
        out = host.run(script, timeout=60).stdout.strip()
        if not out.isdigit():
            return
        start = host.process_start_time(int(out))
        if start is None:
            return
        ps = _process_state(p, None)
        ps.pid, ps.start_time = int(out), start
        with lock:
            state.processes.append(ps)

    unreachable = pool.connect_all((p.host, p.local, p.ssh.model_dump()) for p in plan.processes)
    if unreachable:
        host, why = next(iter(unreachable.items()))
        raise HostError(f"cannot look for running processes on {host}: {why}", host=host)
    _parallel(one, plan.processes)
    order = {p.name: i for i, p in enumerate(plan.processes)}
    state.processes.sort(key=lambda ps: order[ps.name])
    return state


def down(
    deployment: str,
    *,
    plan: Plan | None = None,
    accept_new_host_keys: bool = False,
    known_hosts: str | None = None,
    ssh_config: str | None = None,
    grace: float = 10.0,
    reporter: Reporter | None = None,
) -> DownResult:
    """Stop a recorded deployment (router, decode, prefill) and forget it. Idempotent.

    With nothing recorded and a ``plan`` (the CLI passes one when given the topology file),
    the plan's hosts are searched for its processes by their pid files (:func:`find_running`).
    """
    reporter = reporter or Reporter()
    with DeploymentLock(deployment, "down"):
        state = load_state(deployment)
        if state is None and plan is not None:
            return _down_unrecorded(plan, accept_new_host_keys, known_hosts, ssh_config, grace)
        if state is None:
            return DownResult([], f"{deployment}: nothing recorded; nothing to stop")
        names = [p.name for p in state.started()]
        pool = _pool_for(state, accept_new_host_keys, known_hosts, ssh_config)
        try:
            pool.connect_all((p.host, p.local, p.ssh) for p in state.started())
            state.status = "stopping"
            reporter.step(f"stopping {len(names)} process(es): router, decode, prefill")
            errors = stop_processes(state, pool, reporter, grace=grace)
        finally:
            pool.close()
        if errors:
            state.status = "failed"
            save_state(state)
            raise LaunchError(
                "could not stop: " + "; ".join(errors) + " (state kept; run `down` again)"
            )
        remove_state(deployment)
        return DownResult(names, f"{deployment} is down ({len(names)} process(es) stopped)")


def _down_unrecorded(
    plan: Plan,
    accept_new_host_keys: bool,
    known_hosts: str | None,
    ssh_config: str | None,
    grace: float,
) -> DownResult:
    pool = HostPool(
        accept_new_host_keys=accept_new_host_keys, known_hosts=known_hosts, ssh_config=ssh_config
    )
    try:
        state = find_running(plan, pool)
        names = [p.name for p in state.processes]
        if not names:
            return DownResult(
                [],
                f"{plan.deployment}: nothing recorded, and no process of it runs on its hosts "
                "(pid files checked); nothing to stop",
            )
        errors = stop_processes(state, pool, Reporter(), grace=grace)
    finally:
        pool.close()
    if errors:
        raise LaunchError("could not stop: " + "; ".join(errors) + " (run `down` again)")
    return DownResult(
        names,
        f"{plan.deployment} is down ({len(names)} process(es) found by their pid files and "
        "stopped; nothing was recorded on this control host)",
    )


# -- status ---------------------------------------------------------------------------------------
def status(
    deployment: str,
    *,
    accept_new_host_keys: bool = False,
    known_hosts: str | None = None,
    ssh_config: str | None = None,
) -> tuple[DeploymentState | None, list[dict[str, Any]]]:
    state = load_state(deployment)
    if state is None:
        return None, []
    pool = _pool_for(state, accept_new_host_keys, known_hosts, ssh_config)
    now = time.time()

    def one(ps: ProcessState) -> dict[str, Any]:
        row: dict[str, Any] = {
            "process": ps.name,
            "role": ps.role,
            "host": ps.host,
            "pid": ps.pid,
            "alive": None,
            "health": None,
            "uptime_s": None,
            "log": ps.log_path,
            "health_url": ps.health_url,
            "error": None,
        }
        if ps.pid is None:
            row["alive"] = False
            row["health"] = "not started"
            return row
        try:
            row["alive"] = _proc_host(pool, ps).is_alive(ps.pid, ps.start_time)
        except HostError as exc:
            row["error"] = str(exc)
        if row["alive"] and ps.started_at:
            row["uptime_s"] = round(now - ps.started_at, 1)
        if ps.health_url:
            pr = health.probe(ps.health_url, timeout=5.0)
            row["health"] = pr.describe()
        else:
            row["health"] = "headless"
        return row

    try:
        pool.connect_all((p.host, p.local, p.ssh) for p in state.started())
        rows = _parallel(one, state.processes)
    finally:
        pool.close()
    return state, rows


# -- logs -----------------------------------------------------------------------------------------
def logs(
    deployment: str,
    name: str,
    *,
    lines: int = 50,
    follow: bool = False,
    accept_new_host_keys: bool = False,
    known_hosts: str | None = None,
    ssh_config: str | None = None,
    stop: threading.Event | None = None,
) -> Iterator[str]:
    """The last ``lines`` of a process's log, then (``follow``) each new line."""
    state = load_state(deployment)
    if state is None:
        raise LaunchError(f"{deployment}: nothing recorded (was it started with `pdlaunch up`?)")
    ps = state.process(name)
    if ps is None:
        names = ", ".join(p.name for p in state.processes)
        raise LaunchError(f"{deployment} has no process {name!r} (processes: {names})")
    pool = _pool_for(state, accept_new_host_keys, known_hosts, ssh_config)
    try:
        host = _proc_host(pool, ps)
        if follow:
            yield from host.follow_log(ps.log_path, lines=lines, stop=stop)
        else:
            text = host.read_log(ps.log_path, lines)
            yield from text.splitlines()
    finally:
        pool.close()
