"""The SSH runtime's `up`: survey what already runs by the record and the pid files (adopt,
nothing to do, replace or refuse), connect every host (parallel), private work dirs, scripts
and secret env files (parallel), start each stage's processes with a pid on record before
the next starts, and stop them again (proven gone by the pid files) on rollback.

The order, waiting, canary and rollback decisions are the lifecycle's
(:mod:`pdlaunch.runtime.lifecycle.up`); this module answers its questions over the host
pool (:mod:`pdlaunch.hosts`).
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

from pdlaunch.hosts import CommandTimeout, HostError, HostPool, Upload, containers, parallel
from pdlaunch.hosts.pool import HostKey, Opener
from pdlaunch.hosts.shell import exec_owned_script
from pdlaunch.plan.build import Plan, Process
from pdlaunch.plan.render import RenderedFile, render_plan
from pdlaunch.runtime.base import Launch
from pdlaunch.runtime.lifecycle.model import (
    Failure,
    LaunchError,
    Reporter,
    UpOptions,
    UpResult,
    View,
)
from pdlaunch.runtime.record_store import load_state, remove, save_state
from pdlaunch.runtime.state import DeploymentState, file_hashes, scripts_hash

from .records import (
    describe_changes,
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
from .stopping import stop_processes

COMMAND_TIMEOUT = 60.0  # upper bound of one host command during `up`, within --timeout


class SshLaunch(Launch):
    """One `up` over SSH: the record, the connected hosts."""

    def __init__(self, plan: Plan, opts: UpOptions, opener: Opener | None = None):
        self.plan = plan
        self.opts = opts
        self.files = render_plan(plan)
        self.by_name = {f.name: f for f in self.files}
        self.digest = scripts_hash(self.files)
        self.deadline = time.monotonic() + opts.timeout
        self.old = load_state(plan.deployment)
        connect = opts.connect
        if self.old is not None:
            connect = connect.or_recorded(self.old.known_hosts, self.old.ssh_config)
        self.connect = connect
        given = opts.pool
        if given is not None and opener is None and given.options == connect:
            self.pool = given
        else:
            if given is not None:
                given.close()
            self.pool = HostPool(connect, opener=opener)
        self.state: DeploymentState | None = None
        self.adopted = frozenset()
        self.lock = threading.Lock()  # guards self.state: every change and its serialization
        self._write_lock = threading.Lock()  # one write at a time
        self._asked = 0  # save() calls so far
        self._written = 0  # the last call whose change is on disk

    def close(self) -> None:
        self.pool.close()

    # -- survey ---------------------------------------------------------------------------------
    def survey(self, reporter: Reporter) -> UpResult | None:
        plan = self.plan
        missing = missing_secrets(plan, self.opts.environ)
        if missing:
            lines = [f"{var} (for {', '.join(procs)})" for var, procs in missing.items()]
            raise LaunchError(
                "secret(s) not set in this shell: "
                + "; ".join(lines)
                + ". Export them before `pdlaunch up`; nothing was started."
            )
        decided = _reconcile(plan, self.old, self.files, self.digest, self.opts, self.pool,
                             reporter)  # fmt: skip
        if isinstance(decided, UpResult):
            return decided
        state, adopted = decided
        state.topology = self.opts.topology_path
        state.scripts_hash = self.digest
        state.endpoint = plan.endpoint()
        state.served_model_name = plan.served_model_name
        state.known_hosts = self.connect.known_hosts
        state.ssh_config = self.connect.ssh_config
        state.file_hashes = file_hashes(self.files)
        state.scripts = {f.name: f.content for f in self.files if f.name.endswith(".sh")}
        state.status = "starting"
        self.state = state
        self.adopted = frozenset(adopted)
        return None

    # -- provision, start -------------------------------------------------------------------------
    def provision(self, reporter: Reporter) -> None:
        plan = self.plan
        targets = [(p.host, p.local, p.ssh.model_dump()) for p in plan.processes]
        n_hosts = len(set(map(proc_key, plan.processes)))
        reporter.step(f"connecting to {n_hosts} host(s)")
        errors = self.pool.connect_all(targets)
        if errors:
            raise LaunchError(
                f"cannot reach {len(errors)} host(s): {'; '.join(errors.values())}",
                [Failure("(host)", h, e) for h, e in errors.items()],
            )
        self._check_images()
        reporter.step("uploading scripts")
        try:
            self._prepare(self.by_name)
        except CommandTimeout as exc:
            raise LaunchError(
                f"preparing the hosts failed: {exc} (every host command is bounded by "
                f"--timeout {self.opts.timeout:g}s)"
            ) from None
        except HostError as exc:
            raise LaunchError(f"preparing the hosts failed: {exc}") from None
        self.save()

    def _check_images(self) -> None:
        """Every docker/podman image on its node before anything starts (run never pulls)."""
        missing = containers.plan_images(self.plan.processes, lambda p: proc_host(self.pool, p))
        if missing:
            raise LaunchError(
                "container image(s) missing: "
                + "; ".join(msg for _, msg in missing)
                + " (load or pull them on those nodes first)",
                [Failure("(image)", host, msg) for host, msg in missing],
            )

    def save(self) -> None:
        """Put every change made so far on disk before returning. Parallel starts each call
        this: a caller whose change a write begun after it already holds returns at once, so
        N starts cost a few writes (each an fsync of the whole record), not N in a row. The
        write works on a copy, so other starts record their pids meanwhile (and the next
        write takes them all)."""
        assert self.state is not None
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

    def _prepare(self, files: dict[str, RenderedFile]) -> None:
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

    def start(self, stage: str, procs: list[Process]) -> dict[str, int | None]:
        pids: dict[str, int | None] = {}

        def one(p: Process) -> None:
            host = proc_host(self.pool, p)
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
            pids[p.name] = pid

        errors: list[tuple[Process, BaseException]] = []

        def guarded(p: Process) -> None:
            try:
                one(p)
            except HostError as exc:
                errors.append((p, exc))

        parallel(guarded, procs)
        if errors:
            p, exc = errors[0]
            host = proc_host(self.pool, p)
            raise LaunchError(
                f"{p.name} on {p.host} could not be started: {exc}",
                [Failure(p.name, p.host, str(exc), p.log_path, log_tail(host, p.log_path))],
            )
        return pids

    def command_timeout(self) -> float:
        """What is left of --timeout for one host command (at least 1 s, at most 60 s)."""
        return max(1.0, min(COMMAND_TIMEOUT, self.deadline - time.monotonic()))

    # -- what the lifecycle asks while it waits ---------------------------------------------------
    def health_url(self, p: Process) -> str | None:
        return p.health_url  # over SSH a process listens where the topology says

    def is_alive(self, p: Process) -> bool:
        assert self.state is not None
        ps = self.state.process(p.name)
        if ps is None or ps.pid is None:
            return False
        return proc_host(self.pool, p).is_alive(ps.pid, ps.start_time)

    def where(self, p: Process) -> str:
        return p.host

    def log_tail(self, p: Process) -> str:
        return log_tail(proc_host(self.pool, p), p.log_path)

    def explain(self, names: list[str]) -> list[Any]:
        assert self.state is not None
        return self.opts.explain(self) if self.opts.explain is not None else []

    def record_up(self) -> None:
        assert self.state is not None
        self.state.status = "up"
        self.save()

    # -- rollback -------------------------------------------------------------------------------
    def started(self) -> list[str]:
        if self.state is None:
            return []
        return [p.name for p in self.state.started() if p.name not in self.adopted]

    def stop_started(self, reporter: Reporter, views: dict[str, View], grace: float) -> list[str]:
        """Stop what this run started (router, decode, prefill), then prove by the pid files
        that nothing it may have started runs (a second copy included)."""
        assert self.state is not None
        mine = {p.name for p in self.plan.processes} - self.adopted
        errors = stop_processes(self.state, self.pool, reporter, views, grace=grace, only=mine)
        if errors:
            return errors
        check = survey(self.state, self.pool)
        left = {n for n in check.alive if n in mine}
        if left or check.strangers:
            errors = stop_processes(self.state, self.pool, Reporter(), grace=grace,
                                    extra=check.strangers, only=left)  # fmt: skip
        return errors + [f"{name}: {why}" for name, why in check.unknown.items()]

    def keep_failed(self) -> None:
        if self.state is not None:
            self.state.status = "failed"
            self.save()

    def forget(self) -> None:
        remove(self.plan.deployment, "ssh")


# -- what already runs decides what `up` does ----------------------------------------------------
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
            remove(plan.deployment, "ssh")  # every recorded process is proven gone
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
            remove(plan.deployment, "ssh")  # what was left of it is stopped: nothing runs
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
    remove(plan.deployment, "ssh")
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


def _file(opts: UpOptions) -> str:
    return opts.topology_path or "FILE"
