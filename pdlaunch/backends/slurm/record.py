"""The Slurm runtime's working view of its job (:class:`SlurmRecord`; stored in the
deployment's one record by :mod:`pdlaunch.runtime.record_store`, format 1 was ``slurm.json``),
checked by a schema: every field of its declared type (pydantic, no coercion), the job id a Slurm
job id, every path the one the plan gives it in the deployment's own work dirs. A record that
is not so is refused with the file, the field and what to do by hand, never a traceback: a
record that names the wrong job or file is worse than none (`down` cancels and deletes).
"""

from __future__ import annotations

import json
import os
import posixpath
import pwd
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pdlaunch.backends.slurm import job as slurm
from pdlaunch.plan.build import Plan, Process
from pdlaunch.runtime import record_store
from pdlaunch.runtime.record import (
    Record,
    RecordedProcess,
    SlurmHandle,
    SlurmProcessHandle,
    metrics_url_of,
)
from pdlaunch.runtime.state import DEPLOYMENT_NAME, check_name, check_own_path, parse_json_as


class SlurmRunError(Exception):
    """A Slurm command failed or the job did not come up; the message is for users."""


@dataclass
class ProcessRecord:
    name: str
    role: str
    component: int
    node: int  # index within the component's nodes
    port: int | None
    health_path: str | None
    log_path: str
    work_dir: str
    script_path: str
    secrets_path: str
    # vllm-router's Prometheus port (doctor, watch); None for engines (their HTTP port
    # serves /metrics) and in records written before it was kept.
    metrics_port: int | None = None
    # The DP ranks its API server fronts (plan.Process.dp_ranks), so `pdlaunch canary` pins
    # each on a running job as `up` does; empty: one engine, and in older records.
    dp_ranks: list[int] = field(default_factory=list)


@dataclass
class SlurmRecord:
    deployment: str
    job_id: str
    script: str
    driver_log: str
    model: str
    served_model_name: str
    components: list[list[str]]  # per component: its topology hosts
    processes: list[ProcessRecord]
    status: str = "submitted"  # submitted | up | failed
    # the hash of the job's rendered files: a second `up` of the same topology keeps the job
    scripts_hash: str = ""
    submitted_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    backend: str = "slurm"  # how a format-1 slurm.json said which backend it was

    def process(self, name: str) -> ProcessRecord | None:
        return next((p for p in self.processes if p.name == name), None)

    def by_role(self, role: str) -> list[ProcessRecord]:
        return [p for p in self.processes if p.role == role]

    @property
    def work_dirs(self) -> list[str]:
        return sorted({p.work_dir for p in self.processes})

    @property
    def job_name(self) -> str:
        return slurm.job_name(self.deployment)

    @property
    def job_dir(self) -> str:
        return posixpath.dirname(self.script)

    @classmethod
    def from_json(cls, data: Any) -> SlurmRecord:
        return cls.parse(json.dumps(data))

    @classmethod
    def parse(cls, text: str, deployment: str | None = None) -> SlurmRecord:
        """The record in ``text`` (JSON), every field of its declared type (pydantic, no
        coercion), of ``deployment`` (the directory it was found in), the job id a Slurm job
        id and every path the one the plan gives it in the deployment's own work dirs (`down`
        deletes the secrets files; `logs` reads the logs); ValueError naming the first bad
        field otherwise."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("backend") != "slurm":
            raise ValueError("not a pdlaunch Slurm record (no \"backend\": \"slurm\")")
        rec = parse_json_as(cls, text)
        if deployment is not None and rec.deployment != deployment:
            raise ValueError(
                f"deployment is {rec.deployment!r}, in the directory of {deployment!r}"
            )
        if not is_job_id(rec.job_id):
            raise ValueError(f"job_id {rec.job_id!r} is not a Slurm job id")
        dep = rec.deployment
        check_name("deployment", dep, DEPLOYMENT_NAME)
        for i, p in enumerate(rec.processes):
            check_name(f"processes[{i}].name", p.name)
        if len({p.name for p in rec.processes}) != len(rec.processes):
            raise ValueError("processes: a name is recorded twice")
        router = rec.process("router")
        if router is None:
            raise ValueError("processes: no router")
        check_own_path("script", rec.script, router.work_dir, dep, slurm.DRIVER_NAME)
        check_own_path(
            "driver_log", rec.driver_log, router.work_dir, dep, "logs", f"slurm-{rec.job_id}.log"
        )
        for i, p in enumerate(rec.processes):
            for key, parts in (
                ("script_path", (f"{p.name}.sh",)),
                ("log_path", ("logs", f"{p.name}.log")),
                ("secrets_path", ("run", f"{p.name}.secrets.env")),
            ):
                check_own_path(f"processes[{i}].{key}", getattr(p, key), p.work_dir, dep, *parts)
            if p.component < 0 or p.node < 0 or p.component >= max(1, len(rec.components)):
                raise ValueError(f"processes[{i}]: component {p.component} node {p.node}")
            for key in ("port", "metrics_port"):
                v = getattr(p, key)
                if v is not None and not 0 < v < 65536:
                    raise ValueError(f"processes[{i}].{key} is {v}: not a port")
        return rec


def is_job_id(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` takes other scripts' digits too)."""
    return text.isascii() and text.isdigit()


def current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def by_hand(deployment: str, path: Path) -> str:
    """What to do when the record cannot be trusted: nothing was cancelled or deleted."""
    name, user = slurm.job_name(deployment), current_user()
    return (
        f"Nothing was cancelled or deleted. `squeue -u {user} --name {name}` shows the "
        f"deployment's job; `scancel -u {user} --name {name}` cancels it; then remove {path}"
    )


def record_of(plan: Plan, job_id: str) -> SlurmRecord:
    """What the control host must remember of a submitted plan (pure)."""
    comps = slurm.components(plan)
    procs = []
    for c in comps:
        for p in c.processes:
            procs.append(_process_record(p, c.index, c.node_of(p)))
    procs.append(_process_record(plan.router, 0, 0))
    return SlurmRecord(
        deployment=plan.deployment,
        job_id=job_id,
        script=f"{slurm.job_dir(plan)}/{slurm.DRIVER_NAME}",
        driver_log=slurm.driver_log(plan, job_id),
        model=plan.model,
        served_model_name=plan.served_model_name,
        components=[list(c.hosts) for c in comps],
        processes=procs,
    )


def _process_record(p: Process, component: int, node: int) -> ProcessRecord:
    url = urlsplit(p.health_url) if p.health_url else None
    return ProcessRecord(
        name=p.name,
        role=p.role,
        component=component,
        node=node,
        port=url.port if url else None,
        health_path=url.path if url else None,
        log_path=p.log_path,
        work_dir=p.work_dir,
        script_path=p.script_path,
        secrets_path=p.secrets_path,
        metrics_port=p.ports[1].port if p.role == "router" and len(p.ports) > 1 else None,
        dp_ranks=list(p.dp_ranks),
    )


# -- the format-2 record <-> SlurmRecord ---------------------------------------------------------
def from_slurm(
    srec: SlurmRecord,
    placed: dict[str, tuple[str | None, str | None]] | None = None,
    job_state: str | None = None,
    job_detail: str = "",
    source: str = "",
) -> Record:
    """The Slurm runtime's working view (also what a format-1 ``slurm.json`` holds) as a
    record. ``placed``: process name -> (node, base URL on it) as Slurm placed the job (None:
    not asked, or the job does not run)."""
    placed = placed or {}
    procs = []
    for p in srec.processes:
        node, base = placed.get(p.name, (None, None))
        url = base + (p.health_path or "/health") if base else None
        procs.append(
            RecordedProcess(
                name=p.name,
                role=p.role,
                host=node,
                log_path=p.log_path,
                log_local=True,
                work_dir=p.work_dir,
                health_url=url,
                metrics_url=metrics_url_of(p.role, url, p.metrics_port),
                dp_ranks=list(p.dp_ranks),
                handle=SlurmProcessHandle(
                    component=p.component,
                    node=p.node,
                    port=p.port,
                    health_path=p.health_path,
                    script_path=p.script_path,
                    secrets_path=p.secrets_path,
                    metrics_port=p.metrics_port,
                ),
            )
        )
    rec = Record(
        backend="slurm",
        deployment=srec.deployment,
        status=srec.status,
        served_model_name=srec.served_model_name,
        endpoint=placed.get("router", (None, None))[1],
        created_at=srec.submitted_at,
        updated_at=srec.updated_at,
        processes=procs,
        handle=SlurmHandle(
            job_id=srec.job_id,
            script=srec.script,
            driver_log=srec.driver_log,
            model=srec.model,
            components=[list(c) for c in srec.components],
            scripts_hash=srec.scripts_hash,
            job_state=job_state,
            job_detail=job_detail,
            job_dir=srec.job_dir,
            work_dirs=srec.work_dirs,
        ),
        source=source,
    )
    rec._native = srec
    return rec


def to_slurm(rec: Record) -> SlurmRecord:
    """The Slurm runtime's working view of ``rec``, through its own checks (ValueError naming
    the first bad field: a job id that is not one, a path outside the deployment's dirs)."""
    h = rec.handle
    assert isinstance(h, SlurmHandle)
    procs = []
    for p in rec.processes:
        ph = p.handle
        assert isinstance(ph, SlurmProcessHandle)
        procs.append({
            "name": p.name, "role": p.role, "component": ph.component, "node": ph.node,
            "port": ph.port, "health_path": ph.health_path, "log_path": p.log_path,
            "work_dir": p.work_dir, "script_path": ph.script_path,
            "secrets_path": ph.secrets_path, "metrics_port": ph.metrics_port,
            "dp_ranks": p.dp_ranks,
        })  # fmt: skip
    data = {
        "deployment": rec.deployment, "job_id": h.job_id, "script": h.script,
        "driver_log": h.driver_log, "model": h.model,
        "served_model_name": rec.served_model_name, "components": h.components,
        "processes": procs, "status": rec.status, "scripts_hash": h.scripts_hash,
        "submitted_at": rec.created_at, "updated_at": rec.updated_at, "backend": "slurm",
    }  # fmt: skip
    return SlurmRecord.parse(json.dumps(data), rec.deployment)


def load_slurm(deployment: str) -> SlurmRecord | None:
    """The Slurm runtime's record of ``deployment`` (None: nothing recorded)."""
    rec = record_store.read(deployment, "slurm")
    return None if rec is None else rec.native


def save_slurm(srec: SlurmRecord) -> Path:
    srec.updated_at = time.time()
    return record_store.write(from_slurm(srec))
