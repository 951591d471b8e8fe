"""A Slurm job as the doctor reads it: its processes where Slurm placed them, their logs in
the job's work dirs (shared with the control host, as the job's files are), and whether
each runs by the job's state and the process's health.

The doctor's gathering reads a process's log through the hosts layer and its metrics over
HTTP: a Slurm record (:class:`pdlaunch.runtime.record.Record`) becomes the same per-process view,
with every log read on the control host (``local``) and every URL the one the job's node
answers at, not the plan's.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pdlaunch.fsutil import ReadRefused, read_bounded
from pdlaunch.observe import health
from pdlaunch.runtime.record import UNKNOWN, Record, SlurmHandle
from pdlaunch.runtime.state import DeploymentState, ProcessState

NOT_PLACED = "(not placed)"
# A rendered job script is a few KB; one larger is not what pdlaunch wrote.
SCRIPT_MAX_BYTES = 1 << 20


def slurm_state(rec: Record) -> DeploymentState:
    """The doctor's per-process view of a Slurm record (never saved: `down` and `status`
    read the Slurm record itself). Its scripts are the job's files as written for sbatch
    (they hold no secret value: those are in run/*.secrets.env, never read here)."""
    native = rec.native
    assert isinstance(rec.handle, SlurmHandle) and native is not None
    procs = []
    for p in rec.processes:
        n = native.process(p.name)
        ports = [n.port] if n.port is not None else []
        if n.metrics_port is not None:
            ports.append(n.metrics_port)
        procs.append(
            ProcessState(
                name=p.name,
                role=p.role,
                host=p.host or NOT_PLACED,
                local=True,
                ssh={},
                work_dir=p.work_dir,
                script_path=n.script_path,
                log_path=p.log_path,
                pid_path="",
                secrets_path=n.secrets_path,
                health_url=p.health_url,
                ports=ports,
                script_hash="",
                dp_ranks=list(p.dp_ranks),
            )
        )
    scripts: dict[str, str] = {}
    for path in [native.script, *(native.process(p.name).script_path for p in rec.processes)]:
        # pdlaunch wrote these as files (atomic_write): a link there was planted and could
        # lead the shared bundle to any file of the user's; a FIFO would hang the doctor.
        if os.path.islink(path):
            continue
        with contextlib.suppress(ReadRefused):
            data = read_bounded(path, SCRIPT_MAX_BYTES, what="job script")
            scripts[Path(path).name] = data.decode("utf-8", errors="replace")
    return DeploymentState(
        deployment=rec.deployment,
        topology="",
        scripts_hash="",
        endpoint=rec.endpoint or "",
        served_model_name=rec.served_model_name,
        status=rec.status,
        created_at=native.submitted_at,
        updated_at=native.updated_at,
        scripts=scripts,
        processes=procs,
    )


def slurm_running(rec: Record, timeout: float = 5.0) -> dict[str, tuple[str, str]]:
    """{process: (running, detail)}: "dead" when the job no longer runs (its state says
    why), "alive" when the job runs and the process answers health (or serves no HTTP),
    "unknown" when the job runs and the process does not answer."""
    h = rec.handle
    assert isinstance(h, SlurmHandle)
    out: dict[str, tuple[str, str]] = {}
    for p in rec.processes:
        if h.job_state != "RUNNING":
            why = h.job_said
            if h.job_state in (None, UNKNOWN):
                out[p.name] = ("unknown", why)  # Slurm did not answer: nothing is proven
            elif h.job_state in ("PENDING", "CONFIGURING"):
                out[p.name] = ("not started", why)
            else:
                out[p.name] = ("dead", why)
        elif p.health_url is None:
            out[p.name] = ("alive", f"job {h.job_id} runs; {p.name} serves no HTTP")
        else:
            r = health.probe(p.health_url, timeout=timeout)
            out[p.name] = ("alive", "") if r.ok else ("unknown", f"{p.health_url}: {r.describe()}")
    return out
