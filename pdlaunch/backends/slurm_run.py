"""Running a deployment as a Slurm job from the control host: submit, wait for health, the PD
canary, status, logs, down.

The job's files go where the plan puts them (each process's work dir): the nodes must see
them at the same paths (a shared file system), as the driver runs them there. The record of
the job is ``<state dir>/<deployment>/slurm.json`` (beside the SSH backend's state.json), so
`status`, `logs` and `down` work from another shell. Slurm is driven only through its own
commands (sbatch, squeue, sacct, scontrol, scancel), with the environment's ``SLURM_CONF``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdlaunch import health
from pdlaunch.backends import slurm
from pdlaunch.backends.slurm_client import (
    ACTIVE,
    GONE,
    JobComponent,
    JobInfo,
    expand_hostlist,
    gpus_in_gres,
    job_info,
    node_address,
    partition_limits,
    run_slurm,
    slurm_output,
)
from pdlaunch.backends.slurm_files import (
    check_dirs,
    job_dirs,
    remove_secrets,
    write_job,
)
from pdlaunch.backends.slurm_record import (
    FORMAT,
    ProcessRecord,
    SlurmRecord,
    SlurmRunError,
    by_hand,
    current_user,
    is_job_id,
    load_record,
    record_of,
    record_path,
    save_record,
)
from pdlaunch.fsutil import atomic_write
from pdlaunch.interrupts import signals_ignored
from pdlaunch.launch.readiness import Outcome, wait_until
from pdlaunch.plan import Plan
from pdlaunch.state import STATE_FILE, DeploymentLock, StateError, deployment_dir

# What callers (the CLI, tests) reach through this module.
__all__ = [
    "ACTIVE",
    "FORMAT",
    "GONE",
    "JobComponent",
    "JobInfo",
    "ProcessRecord",
    "SlurmRecord",
    "SlurmRunError",
    "check_dirs",
    "expand_hostlist",
    "gpus_in_gres",
    "job_dirs",
    "job_info",
    "load_record",
    "node_address",
    "partition_limits",
    "record_of",
    "record_path",
    "remove_secrets",
    "run_slurm",
    "save_record",
    "write_job",
]

# -- submit ---------------------------------------------------------------------------------------
def _refuse_if_running(deployment: str) -> None:
    if (deployment_dir(deployment) / STATE_FILE).is_file():
        raise SlurmRunError(
            f"deployment {deployment!r} has a record of processes started over SSH: "
            f"`pdlaunch down {deployment}` first"
        )
    rec = load_record(deployment)
    if rec is not None:
        info = job_info(rec.job_id)
        if info.active:
            raise SlurmRunError(
                f"deployment {deployment!r} is Slurm job {rec.job_id} ({info.state}): "
                f"`pdlaunch down {deployment}` first"
            )


def submit(plan: Plan, opts: slurm.SlurmOptions, environ: dict[str, str] | None = None) -> str:
    """Write the job's files, ``sbatch --parsable`` the driver, record the job; the job id.
    Whatever fails before the job is recorded (sbatch refusing it, an interrupt, the record
    not written) removes the secrets files first; a job sbatch accepted but that could not be
    recorded is cancelled."""
    _refuse_if_running(plan.deployment)
    driver = write_job(plan, opts, environ)
    job_id = ""
    try:
        out = slurm_output(["sbatch", "--parsable", str(driver)], timeout=60).strip()
        job_id = out.split(";", 1)[0]
        if not is_job_id(job_id):
            raise SlurmRunError(f"sbatch answered {out!r}, not a job id")
        save_record(record_of(plan, job_id))
    except BaseException:
        with signals_ignored():
            remove_secrets(plan)
            if is_job_id(job_id):
                # Accepted but not recorded: nothing could find it later. Only our job of
                # this name is cancelled (the filters make scancel skip any other).
                with contextlib.suppress(SlurmRunError):
                    run_slurm(_scancel_argv(plan.deployment, job_id))
        raise
    return job_id


def sbatch_test_only(plan: Plan, opts: slurm.SlurmOptions, directory: Path) -> str:
    """``sbatch --test-only`` of the driver written to ``directory``: Slurm's own verdict on
    the request (nothing runs); sbatch's message, or SlurmRunError with it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / slurm.DRIVER_NAME
    atomic_write(path, slurm.sbatch_script(plan, opts), 0o755)
    res = run_slurm(["sbatch", "--test-only", str(path)], timeout=60)
    text = (res.stderr + res.stdout).strip()
    if res.returncode != 0:
        raise SlurmRunError(f"sbatch --test-only refused the job: {text}")
    return text


# -- health ---------------------------------------------------------------------------------------
def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (an exception may quote a peer's bytes, newlines too)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _url_host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


def endpoints(rec: SlurmRecord, info: JobInfo) -> dict[str, str]:
    """Process name -> its base URL on the node Slurm gave it (for the ones with HTTP)."""
    if len(info.components) < len(rec.components):
        raise SlurmRunError(
            f"job {rec.job_id} has {len(info.components)} component(s) in {info.source}, "
            f"the record {len(rec.components)}"
        )
    addr: dict[str, str] = {}
    out = {}
    for p in rec.processes:
        if p.port is None:
            continue
        nodes = info.components[p.component].nodes
        if p.node >= len(nodes):
            raise SlurmRunError(f"{p.name}: component {p.component} has no node {p.node} yet")
        node = nodes[p.node]
        if node not in addr:
            addr[node] = node_address(node)
        out[p.name] = f"http://{_url_host(addr[node])}:{p.port}"
    return out


def health_url(rec: SlurmRecord, urls: dict[str, str], name: str) -> str | None:
    p = rec.process(name)
    if p is None or name not in urls:
        return None
    return urls[name] + (p.health_path or "/health")


def wait_running(
    job_id: str,
    timeout: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> JobInfo:
    """Until every component runs; SlurmRunError when the job ends or the time is up."""
    deadline = clock() + timeout
    while True:
        info = job_info(job_id)
        if info.running:
            return info
        if not info.active:
            raise SlurmRunError(f"job {job_id} ended before it ran: {info.state} {info.detail}")
        if clock() >= deadline:
            reasons = ", ".join(f"{c.job_id} {c.state} ({c.reason})" for c in info.components)
            raise SlurmRunError(f"job {job_id} still not running after {timeout:g}s: {reasons}")
        sleep(0.5)


def wait_healthy(
    rec: SlurmRecord,
    timeout: float,
    *,
    interval: float = 0.5,
    on_wait: Callable[[str, str], None] = lambda name, detail: None,
) -> tuple[dict[str, str], dict[str, Outcome]]:
    """Wait for the job to run, then for each engine's health and the router's (the driver
    starts the router last); the endpoints and each process's outcome. Stops at the first
    process that is not ready."""
    deadline = time.monotonic() + timeout
    info = wait_running(rec.job_id, timeout)
    urls = endpoints(rec, info)
    outcomes: dict[str, Outcome] = {}

    def alive() -> bool:
        return job_info(rec.job_id).running

    order = [p for p in rec.processes if p.role != "router"] + rec.by_role("router")
    for p in order:
        url = health_url(rec, urls, p.name)

        def probe(t: float, url: str | None = url) -> tuple[bool, str]:
            try:
                r = health.probe(url, timeout=t) if url else health.Probe(True)
            except Exception as exc:  # an answer that is not HTTP: unhealthy, said where
                return False, f"{url}: {one_line(exc)}"
            return r.ok, r.describe()

        outcome = wait_until(
            probe if url else None,
            alive,
            deadline=deadline,
            interval=interval,
            on_wait=lambda detail, name=p.name: on_wait(name, detail),
        )
        outcomes[p.name] = outcome
        if not outcome.ready:
            break
    return urls, outcomes


def run_canary(rec: SlurmRecord, urls: dict[str, str], timeout: float = 120.0):
    """The same PD canary as `up`: one completion through the router, proven disaggregated
    by the engines' counters and equal to a prefill's own answer."""
    prefill = [u for p in rec.by_role("prefill") if (u := health_url(rec, urls, p.name))]
    decode = [u for p in rec.by_role("decode") if (u := health_url(rec, urls, p.name))]
    return health.canary(
        urls["router"],
        rec.served_model_name,
        prefill,
        decode,
        timeout=timeout,
        reference_health=prefill,
    )


def _open_log(path: str):
    """A log for reading, never through a link (pdlaunch makes none: one there was planted,
    and could point at any file of the user's)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    return os.fdopen(fd, "rb")


def _why(path: str, exc: OSError) -> str:
    if os.path.islink(path):
        return f"{path} is a symbolic link; not read"
    return f"cannot read {path}: {exc.strerror}"


def tail(path: str, lines: int = 30) -> str:
    if lines <= 0:
        return ""  # [-0:] would be the whole file
    try:
        with _open_log(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"({_why(path, exc)})"
    return "\n".join(data.splitlines()[-lines:])


@dataclass
class UpResult:
    ok: bool
    job_id: str
    message: str
    endpoint: str | None = None
    healthy_s: float | None = None
    canary: health.CanaryResult | None = None
    outcomes: dict[str, str] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)  # tails, on failure


def up(
    plan: Plan,
    opts: slurm.SlurmOptions,
    *,
    timeout: float = 900.0,
    canary: bool = True,
    canary_timeout: float = 120.0,
    environ: dict[str, str] | None = None,
    on_step: Callable[[str], None] = lambda msg: None,
) -> UpResult:
    """Submit, wait for every process's health, send the PD canary; on any failure cancel
    the job (and wait until Slurm says it is gone) and say why, with the logs' tails. Any
    exception after the submit (an interrupt, an engine answering garbage, a bug) cancels
    the job too, like `up`'s rollback over SSH: an interrupt is raised again once the job is
    gone, anything else becomes the failure's message."""
    t0 = time.monotonic()
    with DeploymentLock(plan.deployment, "slurm up"):
        on_step("submitting the job")
        job_id = submit(plan, opts, environ)
        result = UpResult(False, job_id, "")
        rec: SlurmRecord | None = None
        try:
            rec = load_record(plan.deployment)
            if rec is None:
                raise SlurmRunError(f"the record of job {job_id} vanished")
            on_step(f"job {job_id}: waiting for the allocation and for health")
            failure = _bring_up(rec, result, t0, timeout, canary, canary_timeout, on_step)
            if failure is None:
                rec.status = "up"
                save_record(rec)
                result.ok = True
                result.message = f"{plan.deployment} is up as Slurm job {job_id}"
                return result
        except (SlurmRunError, StateError) as exc:
            failure = str(exc)
        except Exception as exc:  # whatever it was, the job must not stay
            failure = f"unexpected {one_line(exc)}"
        except BaseException:
            with signals_ignored():
                _roll_back(plan, rec or record_of(plan, job_id), job_id)
            raise
        with signals_ignored():
            stopped = _roll_back(plan, rec or record_of(plan, job_id), job_id, result, on_step,
                                 failure)  # fmt: skip
        result.message = f"{failure} (job {job_id} {stopped})"
        return result


def _bring_up(
    rec: SlurmRecord,
    result: UpResult,
    t0: float,
    timeout: float,
    canary: bool,
    canary_timeout: float,
    on_step: Callable[[str], None],
) -> str | None:
    """Wait for health, then the canary, filling ``result``; the failure, or None."""
    urls, outcomes = wait_healthy(rec, timeout)
    result.outcomes = {k: f"{v.status}: {v.detail}" for k, v in outcomes.items()}
    bad = [(k, v) for k, v in outcomes.items() if not v.ready]
    if bad or "router" not in outcomes:
        name, o = bad[0] if bad else ("router", Outcome("not started"))
        return f"{name} is not healthy ({o.status}: {o.detail})"
    result.healthy_s = round(time.monotonic() - t0, 2)
    result.endpoint = urls["router"]
    if canary:
        on_step("canary request through the router")
        result.canary = run_canary(rec, urls, canary_timeout)
        if not result.canary.ok:
            return f"canary failed: {result.canary.message}"
    return None


def _roll_back(
    plan: Plan,
    rec: SlurmRecord,
    job_id: str,
    result: UpResult | None = None,
    on_step: Callable[[str], None] = lambda msg: None,
    failure: str = "interrupted",
) -> str:
    """Cancel the job (proven gone), remove the secrets files, keep the record as failed
    (`down` forgets it); the logs' tails into ``result``. What happened to the job, in
    words; a job that could not be cancelled says so (the record stays for `down`)."""
    if result is not None:
        result.logs = {p.name: tail(p.log_path) for p in rec.processes}
        result.logs["driver"] = tail(rec.driver_log)
    on_step(f"failed: {failure}; cancelling job {job_id}")
    try:
        stopped = _cancel(rec, timeout=120.0)
    except SlurmRunError as exc:
        stopped = f"NOT cancelled: {exc}; run `pdlaunch down {plan.deployment}`"
    else:
        remove_secrets(plan)
    rec.status = "failed"
    with contextlib.suppress(StateError):
        save_record(rec)
    return stopped


# -- status, logs, down ---------------------------------------------------------------------------
@dataclass
class ProcessStatus:
    name: str
    role: str
    node: str | None
    url: str | None
    health: str


@dataclass
class Status:
    deployment: str
    job: JobInfo
    processes: list[ProcessStatus]

    @property
    def healthy(self) -> bool:
        # A headless DP rank serves no HTTP: running is all it can show (as for `up` over SSH).
        return self.job.running and all(p.health in ("healthy", "headless") for p in self.processes)


def _need_record(deployment: str) -> SlurmRecord:
    rec = load_record(deployment)
    if rec is None:
        raise SlurmRunError(f"no Slurm job is recorded for deployment {deployment!r}")
    return rec


def status(deployment: str) -> Status:
    """The job as Slurm sees it, and every process's health on its node; SlurmRunError when
    the job the record names is another's (its state would be shown as this deployment's)."""
    rec = _need_record(deployment)
    info = job_info(rec.job_id)
    if info.active and (why := not_ours(rec)):
        raise SlurmRunError(
            f"the record {record_path(deployment)} names job {rec.job_id}, which is not this "
            f"deployment's job ({why}). {by_hand(deployment, record_path(deployment))}"
        )
    urls: dict[str, str] = {}
    if info.running:
        urls = endpoints(rec, info)
    procs = []
    for p in rec.processes:
        nodes = info.components[p.component].nodes if p.component < len(info.components) else ()
        node = nodes[p.node] if p.node < len(nodes) else None
        url = health_url(rec, urls, p.name)
        if url:
            state = health.probe(url).describe()
        else:
            state = "headless" if info.running and p.port is None else info.state.lower()
        procs.append(ProcessStatus(p.name, p.role, node, url, state))
    return Status(deployment, info, procs)


def logs(deployment: str, name: str, lines: int | None = None) -> str:
    """A process's log (``driver``: the batch script's own), whole or its last ``lines``."""
    rec = _need_record(deployment)
    paths = {p.name: p.log_path for p in rec.processes} | {"driver": rec.driver_log}
    if name not in paths:
        raise SlurmRunError(f"no process {name!r} in {deployment}; known: {', '.join(paths)}")
    if lines is not None:
        return tail(paths[name], lines)
    try:
        with _open_log(paths[name]) as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError as exc:
        raise SlurmRunError(_why(paths[name], exc)) from None


def processes_under(roots: Sequence[str]) -> list[tuple[int, str]]:
    """Live processes on this host whose working directory is under one of ``roots`` (every
    step runs in its process's work dir): (pid, command line)."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2 :].split()[:1] in ([b"Z"], [b"X"]):
            continue
        if any(cwd == r or cwd.startswith(r.rstrip("/") + "/") for r in roots):
            found.append((int(entry), cmd[:200]))
    return found


def _scancel_argv(deployment: str, job_id: str) -> list[str]:
    # scancel applies its filters to the job id given: a job of another name or user is left.
    return ["scancel", f"--name={slurm.job_name(deployment)}", f"--user={current_user()}", job_id]


def not_ours(rec: SlurmRecord) -> str | None:
    """Why the job the record names is not this deployment's job (its name, owner or work
    dir as squeue shows them differ), or None: it is ours, or squeue no longer holds it."""
    res = run_slurm(["squeue", "-h", "-j", rec.job_id, "-o", "%i|%j|%u|%Z"])
    if res.returncode != 0:
        return None  # an unknown job id: nothing to cancel
    want = (rec.job_name, current_user())
    for line in res.stdout.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) != 4:
            continue
        jid, name, user, work = parts
        if jid.split("+")[0] != rec.job_id:
            continue
        first = "+" not in jid or jid.endswith("+0")
        if (name, user) != want or (first and work.rstrip("/") != rec.job_dir.rstrip("/")):
            return (
                f"job {jid} is {name!r} of user {user} in {work}, not {want[0]!r} of {want[1]} "
                f"in {rec.job_dir}"
            )
    return None


def _cancel(rec: SlurmRecord, timeout: float) -> str:
    """scancel the job once squeue shows it is this deployment's (name, owner, work dir),
    then poll until Slurm no longer holds it; what happened, in words. SlurmRunError when the
    record names another job (nothing is cancelled then)."""
    why = not_ours(rec)
    if why:
        raise SlurmRunError(
            f"the record {record_path(rec.deployment)} names job {rec.job_id}, which is not "
            f"this deployment's job ({why}); it was not cancelled. "
            f"{by_hand(rec.deployment, record_path(rec.deployment))}"
        )
    res = run_slurm(_scancel_argv(rec.deployment, rec.job_id))
    deadline = time.monotonic() + timeout
    while True:
        info = job_info(rec.job_id)
        if not info.active:
            return f"cancelled ({info.state} in {info.source})"
        if time.monotonic() >= deadline:
            why = res.stderr.strip()
            raise SlurmRunError(
                f"job {rec.job_id} is still {info.state} {timeout:g}s after scancel"
                + (f" ({why})" if why else "")
            )
        time.sleep(0.5)


@dataclass
class DownResult:
    deployment: str
    job_id: str | None
    message: str
    left: list[tuple[int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.left


def down(deployment: str, *, timeout: float = 120.0, settle: float = 15.0) -> DownResult:
    """Cancel the job, wait until squeue/sacct no longer hold it, then prove that no process
    is left in the deployment's work dirs on this host (Slurm's process tracking kills the
    steps; this is the check, not the mechanism). Idempotent: nothing recorded, nothing
    done. The record is forgotten only once nothing is left."""
    with DeploymentLock(deployment, "slurm down"):
        rec = load_record(deployment)
        if rec is None:
            return DownResult(deployment, None, f"no Slurm job recorded for {deployment}")
        what = _cancel(rec, timeout)
        end = time.monotonic() + settle
        while (left := processes_under(rec.work_dirs)) and time.monotonic() < end:
            time.sleep(0.2)
        if left:
            return DownResult(
                deployment,
                rec.job_id,
                f"job {rec.job_id} {what}, but {len(left)} process(es) still run in "
                f"{', '.join(rec.work_dirs)}",
                left,
            )
        # The record's paths were checked on read (`SlurmRecord.parse`): each secrets file
        # is in the deployment's own run dir, so nothing else is deleted here.
        for p in rec.processes:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p.secrets_path)
        with contextlib.suppress(FileNotFoundError):
            record_path(deployment).unlink()
        return DownResult(deployment, rec.job_id, f"job {rec.job_id} {what}; nothing left")
