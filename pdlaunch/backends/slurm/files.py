"""The Slurm job's files on the control host, whose paths the nodes share: the work-dir check
`up` over SSH runs (before anything is written), no link where the job appends, the scripts,
the driver and the secrets files, and their removal on every failure."""

from __future__ import annotations

import glob
import os
import posixpath
from pathlib import Path

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.backends.slurm.record import SlurmRunError
from pdlaunch.fsutil import atomic_write
from pdlaunch.hosts.errors import HostError
from pdlaunch.hosts.local import LocalHost
from pdlaunch.plan.build import Plan
from pdlaunch.plan.render import render_secrets


def _secrets(plan: Plan, environ: dict[str, str]) -> dict[str, dict[str, str]]:
    """Process name -> {variable: value} read here, on the control host (as `up` does)."""
    missing = sorted(
        {src for p in plan.processes for src in p.secret_env.values() if src not in environ}
    )
    if missing:
        raise SlurmRunError(
            f"secret variable(s) {', '.join(missing)} are not set in this shell: export them "
            "before submitting (their values go to mode-0600 files in the work dir, never "
            "into the job script)"
        )
    return {
        p.name: {var: environ[src] for var, src in p.secret_env.items()}
        for p in plan.processes
        if p.secret_env
    }


def job_dirs(plan: Plan) -> list[str]:
    """Every directory the job writes into: the processes' work, log and run dirs and the
    driver's log dir."""
    dirs = {d for p in plan.processes for d in p.dirs}
    dirs.add(posixpath.dirname(slurm.driver_log(plan, "0")))
    return sorted(dirs)


def check_dirs(plan: Plan) -> None:
    """The check `up` over SSH runs on each host (`Host.private_dirs`: OpenSSH's StrictModes
    rule), here on the control host, whose paths the nodes share: each dir made 0700 if
    missing, and refused if it is a link, not ours, writable by others, or under a parent
    someone else could rename it in. Before anything is written: on a shared file system,
    another user who made the dir first could swap a script while the job waits in the queue,
    or read the secrets."""
    try:
        LocalHost().private_dirs(job_dirs(plan))
    except HostError as exc:
        raise SlurmRunError(
            f"{exc}; nothing was written or submitted. Set the topology's work_dir to a "
            "directory of yours on the file system the nodes share"
        ) from None


def _no_links(plan: Plan) -> None:
    """No link stays at a path the job appends to (srun --open-mode=append, and the driver's
    log, follow one): a log from an earlier run becomes ``.prev``, a link is removed."""
    for p in plan.processes:
        log = Path(p.log_path)
        if log.is_symlink():
            log.unlink()
        elif log.exists():
            log.replace(log.with_name(log.name + ".prev"))
    pattern = glob.escape(posixpath.dirname(slurm.driver_log(plan, "0"))) + "/slurm-*.log"
    for path in glob.glob(pattern):
        if os.path.islink(path):
            os.unlink(path)


def remove_secrets(plan: Plan) -> list[str]:
    """Delete the secrets files of the plan's processes; the ones that could not be."""
    left = []
    for p in plan.processes:
        if p.secret_env:
            try:
                os.unlink(p.secrets_path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                left.append(f"{p.secrets_path}: {exc.strerror}")
    return left


def write_job(plan: Plan, opts: slurm.SlurmOptions, environ: dict[str, str] | None = None) -> Path:
    """Write every file the job needs where the plan puts it (each process's work dir, which
    the nodes must share), after `check_dirs`; returns the driver script's path. On a
    failure no secrets file is left behind."""
    files = {f.name: f for f in slurm.render_job(plan, opts)}
    secrets = _secrets(plan, dict(os.environ if environ is None else environ))
    check_dirs(plan)
    try:
        _no_links(plan)
        for p in plan.processes:
            atomic_write(p.script_path, files[f"{p.name}.sh"].content, 0o755)
            if p.name in secrets:
                atomic_write(p.secrets_path, render_secrets(secrets[p.name]), 0o600)
        driver = Path(slurm.job_dir(plan)) / slurm.DRIVER_NAME
        atomic_write(driver, files[slurm.DRIVER_NAME].content, 0o755)
    except BaseException as exc:
        remove_secrets(plan)
        if isinstance(exc, OSError):
            raise SlurmRunError(f"cannot write the job's files: {exc}") from None
        raise
    return driver
