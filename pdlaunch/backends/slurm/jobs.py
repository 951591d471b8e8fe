"""The Slurm runtime's parts: submit the job (sbatch), wait for the allocation, where each
process listens once placed, read logs, cancel (scancel) and prove gone. The lifecycle
(readiness, canary, rollback, status, down) is :mod:`pdlaunch.runtime.lifecycle`'s.

The job's files go where the plan puts them (each process's work dir): the nodes must see
them at the same paths (a shared file system), as the driver runs them there. The job is
recorded in the deployment's record (:mod:`pdlaunch.runtime.record_store`), so `status`,
`logs` and `down` work from another shell. Slurm is driven only through its own
commands (sbatch, squeue, sacct, scontrol, scancel), with the environment's ``SLURM_CONF``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm.client import (
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
from pdlaunch.backends.slurm.files import (
    check_dirs,
    job_dirs,
    remove_secrets,
    write_job,
)
from pdlaunch.backends.slurm.record import (
    ProcessRecord,
    SlurmRecord,
    SlurmRunError,
    by_hand,
    current_user,
    is_job_id,
    load_slurm,
    record_of,
    save_slurm,
)
from pdlaunch.fsutil import atomic_write
from pdlaunch.plan.build import Plan
from pdlaunch.runtime import record_store
from pdlaunch.runtime.interrupts import signals_ignored
from pdlaunch.runtime.record import UNKNOWN
from pdlaunch.runtime.record_store import OtherBackendError, RecordError, record_path

# What callers (the CLI, tests) reach through this module.
__all__ = [
    "ACTIVE",
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
    "load_slurm",
    "node_address",
    "partition_limits",
    "record_of",
    "record_path",
    "remove_secrets",
    "run_slurm",
    "save_slurm",
    "write_job",
]


# -- submit ---------------------------------------------------------------------------------------
def _refuse_if_running(deployment: str) -> None:
    try:
        rec = load_slurm(deployment)
    except OtherBackendError as exc:
        raise SlurmRunError(exc.refusal()) from None
    if rec is not None:
        info = job_info(rec.job_id)
        if info.active:
            raise SlurmRunError(
                f"deployment {deployment!r} is Slurm job {rec.job_id} ({info.state}): "
                f"`pdlaunch down {deployment}` first"
            )


def submit(plan: Plan, opts: slurm.SlurmOptions, environ: dict[str, str] | None = None) -> str:
    """Write the job's files and submit them (`sbatch`); the job id."""
    _refuse_if_running(plan.deployment)
    return sbatch(plan, write_job(plan, opts, environ))


def sbatch(plan: Plan, driver: Path, scripts_hash: str = "") -> str:
    """``sbatch --parsable`` the driver written by `write_job`, record the job; the job id.
    Whatever fails before the job is recorded (sbatch refusing it, an interrupt, the record
    not written) removes the secrets files first; a job sbatch accepted but that could not be
    recorded is cancelled."""
    job_id = ""
    try:
        out = slurm_output(["sbatch", "--parsable", str(driver)], timeout=60).strip()
        job_id = out.split(";", 1)[0]
        if not is_job_id(job_id):
            raise SlurmRunError(f"sbatch answered {out!r}, not a job id")
        rec = record_of(plan, job_id)
        rec.scripts_hash = scripts_hash
        _check_as_submitted(rec, driver)
        save_slurm(rec)
    except BaseException as exc:
        with signals_ignored():
            remove_secrets(plan)
            if is_job_id(job_id):
                # Accepted but not recorded: nothing could find it later. Only our job of
                # this name is cancelled (the filters make scancel skip any other), or the
                # job squeue shows running our driver (NotAsSubmitted).
                argv = (
                    exc.scancel
                    if isinstance(exc, NotAsSubmitted)
                    else _scancel_argv(plan.deployment, job_id)
                )
                if argv:
                    with contextlib.suppress(SlurmRunError):
                        run_slurm(argv)
                        _wait_gone(job_id, 60.0)
        raise
    return job_id


class NotAsSubmitted(SlurmRunError):
    """The job sbatch accepted is not named, owned or placed as pdlaunch submitted it (an
    #SBATCH option or the site's job_submit plugin changed it): `down` could not tell it from
    another job. ``scancel``: the command that cancels it (by id: squeue shows it runs our
    driver), or [] when it is not our driver's job."""

    def __init__(self, message: str, scancel: list[str]):
        super().__init__(message)
        self.scancel = scancel


def _first_component(job_id: str) -> list[str] | None:
    """[name, user, work dir, command] squeue shows for the job's first component; None when
    squeue does not answer (the check is then left to `down`'s, as before)."""
    res = run_slurm(["squeue", "-h", "-j", job_id, "-o", "%i|%j|%u|%Z|%o"])
    if res.returncode != 0:
        return None
    for line in res.stdout.splitlines():
        parts = line.strip().split("|", 4)
        if len(parts) == 5 and parts[0] in (job_id, f"{job_id}+0"):
            return parts[1:]
    return None


def _check_as_submitted(rec: SlurmRecord, driver: Path) -> None:
    """The job is what `down` will look for (name, owner, work dir), checked before it is
    recorded: a job that is not would be refused by every later cancel."""
    seen = _first_component(rec.job_id)
    if seen is None:
        return
    name, user, work, command = seen
    want = (rec.job_name, current_user(), rec.job_dir.rstrip("/"))
    if (name, user, work.rstrip("/")) == want:
        return
    ours = command in (str(driver), str(driver.resolve()))
    message = (
        f"Slurm job {rec.job_id} was submitted as {name!r} of user {user} in {work}, not "
        f"{want[0]!r} of {want[1]} in {want[2]}: an #SBATCH option or the site's job_submit "
        "plugin changed it, and pdlaunch could not find or cancel it later"
    )
    if ours:
        message += "; it is cancelled by its id (squeue shows it running the driver just submitted)"
        scancel = ["scancel", rec.job_id]
    else:
        message += f"; squeue shows it running {command!r}, not {driver}: it was not cancelled"
        scancel = []
    raise NotAsSubmitted(message, scancel)


def _wait_gone(job_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while job_info(job_id).active and time.monotonic() < deadline:
        time.sleep(0.5)


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


def open_log(path: str):
    """A log for reading, never through a link (pdlaunch makes none: one there was planted,
    and could point at any file of the user's)."""
    # O_NONBLOCK: a FIFO planted there opens at once (and is refused below) instead of
    # waiting for a writer; a regular file reads the same with it.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return os.fdopen(fd, "rb")


def why_unreadable(path: str, exc: OSError) -> str:
    if os.path.islink(path):
        return f"{path} is a symbolic link; not read"
    return f"cannot read {path}: {exc.strerror}"


TAIL_BYTES = 64 * 1024


def tail(path: str, lines: int = 30) -> str:
    if lines <= 0:
        return ""  # [-0:] would be the whole file
    try:
        with open_log(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            # Bounded even if the file grows meanwhile.
            data = f.read(TAIL_BYTES).decode("utf-8", errors="replace")
    except OSError as exc:
        return f"({why_unreadable(path, exc)})"
    return "\n".join(data.splitlines()[-lines:])


# -- status, logs, down ---------------------------------------------------------------------------
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


def cancel(rec: SlurmRecord, timeout: float = 120.0) -> str:
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


def placement(srec: SlurmRecord) -> tuple[dict[str, tuple[str | None, str | None]], str, str]:
    """Ask Slurm where the job's processes run: ({name: (node, base URL)}, job state,
    detail). Processes of a job that does not run are left out (not placed); a Slurm that
    does not answer leaves them out too, the state UNKNOWN and the detail saying why.
    RecordError when the job the record names is not this deployment's (an edited or stale
    record: its nodes would be taken for the deployment's)."""
    try:
        info = job_info(srec.job_id)
        if info.active and (why := not_ours(srec)):
            path = record_store.locate(srec.deployment) or record_path(srec.deployment)
            raise RecordError(
                f"the record {path} names job {srec.job_id}, which is not this deployment's "
                f"job ({why}). {by_hand(srec.deployment, path)}"
            )
        if not info.running:
            return {}, info.state, info.detail
        urls = endpoints(srec, info)
    except SlurmRunError as exc:
        return {}, UNKNOWN, str(exc)
    placed: dict[str, tuple[str | None, str | None]] = {}
    for p in srec.processes:
        nodes = info.components[p.component].nodes
        node = nodes[p.node] if p.node < len(nodes) else None
        placed[p.name] = (node, urls.get(p.name))
    return placed, info.state, info.detail
