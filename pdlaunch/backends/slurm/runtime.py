"""The Slurm runtime: the deployment as one heterogeneous batch job (its driver script,
:mod:`pdlaunch.backends.slurm.job`, starts every process on the nodes Slurm gives it), recorded
in the deployment's record (:mod:`pdlaunch.runtime.record_store`); driven only through
Slurm's own commands (:mod:`.jobs`).

Stages: the first ``start`` submits the job (or resumes the one a killed `up` left PENDING)
and waits for the allocation (the nodes, so the
URLs each process listens at, are known only then); the driver starts the router itself once
the engines answer, so the router's ``start`` has nothing to do and the lifecycle just waits
for its health, as over SSH. A process is alive while the job runs: Slurm ends the job when
any of its steps exits (the driver's own rule), so a job that is not RUNNING is an exited
process, whichever one it was (its log says).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm.client import JobInfo, job_info
from pdlaunch.backends.slurm.files import remove_secrets, write_job
from pdlaunch.backends.slurm.record import (
    SlurmRecord,
    SlurmRunError,
    by_hand,
    load_slurm,
    save_slurm,
)
from pdlaunch.plan.build import Plan, Process
from pdlaunch.runtime import record_store
from pdlaunch.runtime.base import Held, Launch, Observation, Observed, Runtime
from pdlaunch.runtime.lifecycle.model import (
    Failure,
    LaunchError,
    Reporter,
    UpOptions,
    UpResult,
    View,
)
from pdlaunch.runtime.record_store import follow_local_log
from pdlaunch.runtime.state import StateError, scripts_hash

from . import jobs

SETTLE_S = 15.0  # how long the steps' processes may take to go once Slurm says the job ended


def _load(deployment: str) -> SlurmRecord | None:
    try:
        return load_slurm(deployment)
    except StateError as exc:
        raise LaunchError(str(exc)) from None


def _gone(rec: SlurmRecord, timeout: float = 120.0) -> tuple[str, list[tuple[int, str]]]:
    """Cancel the job (once squeue shows it is ours), wait until Slurm no longer holds it,
    then until no process is left in the deployment's work dirs on this host (Slurm's process
    tracking kills the steps; this is the check, not the mechanism): what happened, and what
    is left."""
    what = jobs.cancel(rec, timeout)
    end = time.monotonic() + SETTLE_S
    while (left := jobs.processes_under(rec.work_dirs)) and time.monotonic() < end:
        time.sleep(0.2)
    return what, left


class SlurmLaunch(Launch):
    """One `up` as a Slurm job."""

    def __init__(self, plan: Plan, opts: UpOptions):
        if opts.slurm is None:
            raise LaunchError("the Slurm runtime needs its options (UpOptions.slurm)")
        self.plan, self.opts = plan, opts
        self.sopts: slurm.SlurmOptions = opts.slurm
        self.digest = scripts_hash(slurm.render_job(plan, self.sopts))
        self.driver: Path | None = None
        self.rec: SlurmRecord | None = None
        self.urls: dict[str, str] = {}
        self.placed = False  # the job runs and its processes' nodes are known
        self.resumed = False  # the job is one a killed `up` submitted, still waiting to run
        self.adopted = frozenset()
        self.handle: dict[str, object] = {"job_id": None}
        self.deadline = time.monotonic() + opts.timeout

    def close(self) -> None:
        pass  # no connection is held: every call is one Slurm command

    def survey(self, reporter: Reporter) -> UpResult | None:
        dep = self.plan.deployment
        reporter.step("checking what already runs")
        try:
            rec = load_slurm(dep)
        except record_store.OtherBackendError as exc:
            raise LaunchError(exc.refusal()) from None
        except StateError as exc:
            raise LaunchError(str(exc)) from None
        if rec is None:
            return None
        info = job_info(rec.job_id)
        if not info.active:
            return None  # a job that ended: its record is replaced by the new job's
        if (why := jobs.not_ours(rec)) is not None:
            path = record_store.record_path(dep)
            raise LaunchError(
                f"the record {path} names job {rec.job_id}, which is not this "
                f"deployment's job ({why}). {by_hand(dep, path)}"
            )
        same = rec.scripts_hash == self.digest
        if same and info.active and not info.running and not self.opts.replace:
            # Submitted by an `up` that was killed while it waited for the allocation: this
            # `up` takes the job over as its own submit (waits for the allocation in `start`,
            # cancels it on failure), instead of refusing it or submitting a second one.
            why = "; ".join(sorted({c.reason for c in info.components if c.reason}))
            reporter.step(
                f"resuming Slurm job {rec.job_id} ({info.state}{': ' + why if why else ''}), "
                "submitted by an `up` that did not finish: waiting for its allocation"
            )
            self.rec, self.handle["job_id"], self.resumed = rec, rec.job_id, True
            return None
        if same and info.running and not self.opts.replace:
            self.rec, self.handle["job_id"] = rec, rec.job_id
            self.urls, self.placed = jobs.endpoints(rec, info), True
            if rec.status == "up":
                return UpResult(
                    changed=False,
                    message=f"{dep} is already up and unchanged (Slurm job {rec.job_id} "
                    f"{info.state}); nothing to do",
                    endpoint=self._router_base(),
                    handle=dict(self.handle),
                )
            # The same job, left by an `up` that did not finish (killed, or its shell gone):
            # kept and waited for, as SSH adopts running processes of the same scripts.
            reporter.step(f"adopting Slurm job {rec.job_id} ({info.state}, the same job)")
            self.adopted = frozenset(p.name for p in self.plan.processes)
            return None
        if not self.opts.replace:
            differs = "runs" if same else "runs a different job"
            raise LaunchError(
                f"deployment {dep!r} is Slurm job {rec.job_id} ({info.state}) and {differs}. "
                f"`pdlaunch down {dep}` first, or re-run with --replace"
            )
        reporter.step(f"replacing: cancelling Slurm job {rec.job_id}")
        what, left = _gone(rec)
        if left:
            raise LaunchError(f"job {rec.job_id} {what}, but {len(left)} process(es) still run")
        return None

    def provision(self, reporter: Reporter) -> None:
        if self.adopted or self.resumed:
            return  # the job has its files already (and reads them once it runs)
        reporter.step("writing the job's files")
        self.driver = write_job(self.plan, self.sopts, self.opts.environ)

    def start(self, stage: str, procs: list[Process]) -> dict[str, int | None]:
        if self.placed or not procs:
            return {}  # placed at the first stage: the driver starts the rest itself
        if self.rec is None:
            assert self.driver is not None
            job_id = jobs.sbatch(self.plan, self.driver, self.digest)
            self.handle["job_id"] = job_id
            self.rec = _load(self.plan.deployment)
            if self.rec is None:
                raise LaunchError(f"the record of job {job_id} vanished")
        try:
            info = jobs.wait_running(self.rec.job_id,
                                     max(1.0, self.deadline - time.monotonic()))  # fmt: skip
        except SlurmRunError as exc:
            raise LaunchError(str(exc), self.context()) from None
        self.urls, self.placed = jobs.endpoints(self.rec, info), True
        return {}  # pids are Slurm's business (its steps), on the nodes

    def context(self) -> list[Failure]:
        if self.rec is None:
            return []
        tail = jobs.tail(self.rec.driver_log)
        return [Failure("driver", f"job {self.rec.job_id}", "the job's driver log",
                        self.rec.driver_log, tail)]  # fmt: skip

    def _router_base(self) -> str:
        return self.urls.get("router", self.plan.endpoint())

    def health_url(self, p: Process) -> str | None:
        rec = self.rec
        return jobs.health_url(rec, self.urls, p.name) if rec is not None else None

    def is_alive(self, p: Process) -> bool:
        assert self.rec is not None
        return job_info(self.rec.job_id).running

    def where(self, p: Process) -> str:
        url = self.urls.get(p.name)
        return url.split("//", 1)[1].rsplit(":", 1)[0] if url else p.host

    def log_tail(self, p: Process) -> str:
        return jobs.tail(p.log_path)

    def record_up(self) -> None:
        assert self.rec is not None
        self.rec.status = "up"
        save_slurm(self.rec)

    def started(self) -> list[str]:
        if self.rec is None or self.adopted:
            return []  # an adopted job ran before this `up`: it is not ours to cancel
        return [p.name for p in self.plan.processes]

    def stop_started(self, reporter: Reporter, views: dict[str, View], grace: float) -> list[str]:
        if self.adopted:
            return []
        if self.rec is None:  # nothing submitted (or not recorded: sbatch cancelled it)
            left = remove_secrets(self.plan)
            return [f"secrets file {path} could not be removed" for path in left]
        reporter.step(f"cancelling Slurm job {self.rec.job_id}")
        try:
            what, left = _gone(self.rec)
        except SlurmRunError as exc:
            return [f"job {self.rec.job_id} NOT cancelled: {exc}"]
        for v in views.values():
            v.state, v.detail = "stopped", f"job {self.rec.job_id} {what}"
        reporter.update()
        if left:
            return [f"job {self.rec.job_id} {what}, but {len(left)} process(es) still run"]
        remove_secrets(self.plan)
        return []

    def keep_failed(self) -> None:
        if self.rec is not None:
            self.rec.status = "failed"
            save_slurm(self.rec)

    def forget(self) -> None:
        record_store.remove(self.plan.deployment, "slurm")


class _SlurmHeld(Held):
    def __init__(self, rec: SlurmRecord):
        self.deployment, self.rec = rec.deployment, rec
        self.names = [p.name for p in rec.processes]
        self.handle = {"job_id": rec.job_id, "left": []}
        self.what = ""

    def stop_all(self, reporter: Reporter, grace: float) -> list[str]:
        try:
            self.what, left = _gone(self.rec)
        except SlurmRunError as exc:
            return [str(exc)]
        self.handle["left"] = [{"pid": pid, "command": cmd} for pid, cmd in left]
        if left:
            return [
                f"job {self.rec.job_id} {self.what}, but {len(left)} process(es) still run in "
                f"{', '.join(self.rec.work_dirs)}: "
                + ", ".join(f"{pid} {cmd}" for pid, cmd in left)
            ]
        return []

    def keep_failed(self) -> None:
        pass  # the record stays as it is: `down` again once the processes end

    def forget(self) -> str:
        # The record's paths were checked on read (`SlurmRecord.parse`): each secrets file
        # is in the deployment's own run dir, so nothing else is deleted here.
        for p in self.rec.processes:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p.secrets_path)
        record_store.remove(self.deployment, "slurm")
        return ""

    def message(self, note: str) -> str:
        return f"job {self.rec.job_id} {self.what}; nothing left{note}"


class SlurmRuntime(Runtime):
    name = "slurm"

    def launch(self, plan: Plan, opts: UpOptions) -> SlurmLaunch:
        return SlurmLaunch(plan, opts)

    def held(self, deployment: str, plan: Plan | None) -> Held | None:
        rec = _load(deployment)
        return _SlurmHeld(rec) if rec is not None else None

    def observe(self, deployment: str) -> Observation | None:
        rec = _load(deployment)
        if rec is None:
            return None
        info = job_info(rec.job_id)
        if info.active and (why := jobs.not_ours(rec)):
            path = record_store.record_path(deployment)
            raise LaunchError(
                f"the record {path} names job {rec.job_id}, which is not "
                f"this deployment's job ({why}). {by_hand(deployment, path)}"
            )
        urls = jobs.endpoints(rec, info) if info.running else {}
        rows = []
        for p in rec.processes:
            nodes = info.components[p.component].nodes if p.component < len(info.components) else ()
            node = nodes[p.node] if p.node < len(nodes) else None
            url = jobs.health_url(rec, urls, p.name)
            o = Observed(p.name, p.role, node, alive=info.running, url=url, log=p.log_path)
            if not url:
                o.health = "headless" if info.running and p.port is None else info.state.lower()
            rows.append(o)
        title = f"{deployment}: Slurm job {info.job_id} {info.state}"
        if info.source != "squeue":
            title += f" ({info.source}{': ' + info.detail if info.detail else ''})"
        return Observation(deployment, self.name, rec.status, rows, title=title,
                           running=info.running, handle={"job": _job_json(info)})  # fmt: skip

    def _paths(self, deployment: str) -> dict[str, str]:
        rec = _load(deployment)
        if rec is None:
            raise LaunchError(f"no Slurm job is recorded for deployment {deployment!r}")
        return {p.name: p.log_path for p in rec.processes} | {"driver": rec.driver_log}

    def process_names(self, deployment: str) -> list[str]:
        return list(self._paths(deployment))

    def read_log(self, deployment: str, name: str, lines: int) -> str:
        # the job's logs are in its work dirs, which this host shares
        path = self._paths(deployment)[name]
        try:
            with jobs.open_log(path):
                pass
        except OSError as exc:  # never through a link; a missing log says so
            raise LaunchError(jobs.why_unreadable(path, exc)) from None
        return jobs.tail(path, lines)

    def follow_log(
        self, deployment: str, name: str, lines: int, stop: threading.Event | None
    ) -> Iterator[str]:
        yield from follow_local_log(self._paths(deployment)[name], lines)


def _job_json(job: JobInfo) -> dict[str, object]:
    return {
        "id": job.job_id,
        "state": job.state,
        "source": job.source,
        "detail": job.detail,
        "components": [
            {"id": c.job_id, "state": c.state, "nodes": list(c.nodes)}
            | ({"reason": c.reason} if c.reason else {})
            for c in job.components
        ],
    }


__all__ = ["SlurmLaunch", "SlurmRuntime", "jobs"]
