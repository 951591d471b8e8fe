"""One record of a deployment, whichever backend started it: what runs, where it really
listens, and how the backend finds it again.

Today each backend writes its own file in ``<state dir>/<deployment>/``: `up` over SSH writes
``state.json`` (:mod:`pdlaunch.state`), a Slurm job ``slurm.json``
(:mod:`pdlaunch.backends.slurm_record`). Both are format 1. :func:`find` reads either and
migrates it to a :class:`Record` (format 2): the one shape `status`, `down`, `doctor`, `logs`
and `bench` read, so a command written against it works on every backend.

Where a process really listens is part of the record: over SSH the plan's address (the
process runs on the host the topology names); under Slurm the node the job was given, at the
address Slurm reaches it (``NodeAddr``), asked from Slurm when the record is found (a
requeued job may move). A Slurm job that does not run leaves every process unplaced
(``host`` and URLs None) and says why in ``handle.job_state``.

The record never holds a secret value (neither format-1 file does).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from pdlaunch import health
from pdlaunch.state import (
    SLURM_RECORD_FILE,
    STATE_FILE,
    DeploymentState,
    StateError,
    deployment_dir,
    list_deployments,
    load_state,
)

FORMAT = 2
BACKENDS = ("ssh", "slurm")
UNKNOWN = "UNKNOWN"  # a Slurm job's state when Slurm could not be asked


class RecordError(StateError):
    """A record cannot be found, read or trusted; the message is for the user."""


class RecordedProcess(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    role: str
    # Where it runs: the SSH host, or the Slurm node the job was given (None: not placed).
    host: str | None
    log_path: str
    # The log can be read on the control host itself (a local process; a Slurm job's work
    # dir, which the nodes share with the control host).
    log_local: bool
    work_dir: str
    pid: int | None = None
    start_time: int | None = None  # /proc/PID/stat starttime (SSH), against pid reuse
    health_url: str | None = None  # where it answers health, once placed
    metrics_url: str | None = None  # where it serves Prometheus text, once placed

    @property
    def base_url(self) -> str | None:
        return health.base_url(self.health_url) if self.health_url else None


class SshHandle(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["ssh"] = "ssh"
    topology: str
    known_hosts: str | None = None
    ssh_config: str | None = None


class SlurmHandle(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["slurm"] = "slurm"
    job_id: str
    job_dir: str
    driver_log: str
    work_dirs: list[str]
    # The job's state when the record was found (squeue/sacct), None when not asked.
    job_state: str | None = None
    job_detail: str = ""


Handle = Annotated[SshHandle | SlurmHandle, Field(discriminator="kind")]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal[2] = FORMAT
    backend: Literal["ssh", "slurm"]
    deployment: str
    status: str  # starting | submitted | up | failed | stopping
    served_model_name: str
    # The router's base URL where it really runs (None: not placed, e.g. a pending job).
    endpoint: str | None
    processes: list[RecordedProcess]
    handle: Handle
    source: str  # the file this record was read from
    # The backend's own record (DeploymentState, SlurmRecord), for its own commands.
    _native: Any = PrivateAttr(default=None)

    @property
    def native(self) -> Any:
        return self._native

    def process(self, name: str) -> RecordedProcess | None:
        return next((p for p in self.processes if p.name == name), None)

    @property
    def router(self) -> RecordedProcess | None:
        return next((p for p in self.processes if p.role == "router"), None)

    def engines(self) -> list[RecordedProcess]:
        return [p for p in self.processes if p.role in ("prefill", "decode")]

    def to_json(self) -> str:
        return self.model_dump_json(indent=2) + "\n"

    @classmethod
    def parse(cls, text: str) -> Record:
        """A format-2 record (JSON); RecordError naming the first bad field otherwise."""
        try:
            return cls.model_validate_json(text, strict=True)
        except ValidationError as exc:
            e = exc.errors(include_url=False)[0]
            where = ".".join(str(x) for x in e["loc"])
            raise RecordError(
                f"not a pdlaunch record (format {FORMAT}): {where}: {e['msg']}"
            ) from None


# -- metrics endpoints ----------------------------------------------------------------------------
def metrics_url_of(role: str, health_url: str | None, metrics_port: int | None) -> str | None:
    """Where a process serves Prometheus text: an engine on its HTTP port, vllm-router on its
    own metrics port (None when not recorded)."""
    if not health_url:
        return None
    if role != "router":
        return health.base_url(health_url) + "/metrics"
    if metrics_port is None:
        return None
    host = health_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
    return f"http://{host}:{metrics_port}/metrics"


# -- migration from format 1 ----------------------------------------------------------------------
def from_state(state: DeploymentState, source: str = "") -> Record:
    """A ``state.json`` (format 1, `up` over SSH): processes run where the plan put them."""

    def metrics_port(ports: list[int]) -> int | None:
        return ports[1] if len(ports) > 1 else None

    procs = [
        RecordedProcess(
            name=p.name,
            role=p.role,
            host=p.host,
            log_path=p.log_path,
            log_local=p.local,
            work_dir=p.work_dir,
            pid=p.pid,
            start_time=p.start_time,
            health_url=p.health_url,
            metrics_url=metrics_url_of(p.role, p.health_url, metrics_port(p.ports)),
        )
        for p in state.processes
    ]
    rec = Record(
        backend="ssh",
        deployment=state.deployment,
        status=state.status,
        served_model_name=state.served_model_name,
        endpoint=state.endpoint or None,
        processes=procs,
        handle=SshHandle(
            topology=state.topology, known_hosts=state.known_hosts, ssh_config=state.ssh_config
        ),
        source=source,
    )
    rec._native = state
    return rec


def from_slurm(
    srec: Any,
    placed: dict[str, tuple[str | None, str | None]] | None = None,
    job_state: str | None = None,
    job_detail: str = "",
    source: str = "",
) -> Record:
    """A ``slurm.json`` (format 1, a SlurmRecord). ``placed``: process name -> (node, base
    URL on it) as Slurm placed the job (None: not asked, or the job does not run)."""
    placed = placed or {}
    procs = []
    for p in srec.processes:
        node, base = placed.get(p.name, (None, None))
        url = base + (p.health_path or "/health") if base else None
        port = getattr(p, "metrics_port", None)
        procs.append(
            RecordedProcess(
                name=p.name,
                role=p.role,
                host=node,
                log_path=p.log_path,
                log_local=True,
                work_dir=p.work_dir,
                health_url=url,
                metrics_url=metrics_url_of(p.role, url, port),
            )
        )
    router = placed.get("router", (None, None))[1]
    rec = Record(
        backend="slurm",
        deployment=srec.deployment,
        status=srec.status,
        served_model_name=srec.served_model_name,
        endpoint=router,
        processes=procs,
        handle=SlurmHandle(
            job_id=srec.job_id,
            job_dir=srec.job_dir,
            driver_log=srec.driver_log,
            work_dirs=srec.work_dirs,
            job_state=job_state,
            job_detail=job_detail,
        ),
        source=source,
    )
    rec._native = srec
    return rec


def placement(srec: Any) -> tuple[dict[str, tuple[str | None, str | None]], str, str]:
    """Ask Slurm where the job's processes run: ({name: (node, base URL)}, job state,
    detail). Processes of a job that does not run are left out (not placed); a Slurm that
    does not answer leaves them out too, the state UNKNOWN and the detail saying why.
    RecordError when the job the record names is not this deployment's (an edited or stale
    record: its nodes would be taken for the deployment's)."""
    # The Slurm client; imported only when a Slurm record is placed.
    from pdlaunch.backends import slurm_record
    from pdlaunch.runtime.slurm import jobs as slurm_jobs

    try:
        info = slurm_jobs.job_info(srec.job_id)
        if info.active and (why := slurm_jobs.not_ours(srec)):
            path = slurm_record.record_path(srec.deployment)
            raise RecordError(
                f"the record {path} names job {srec.job_id}, which is not this deployment's "
                f"job ({why}). {slurm_record.by_hand(srec.deployment, path)}"
            )
        if not info.running:
            return {}, info.state, info.detail
        urls = slurm_jobs.endpoints(srec, info)
    except slurm_jobs.SlurmRunError as exc:
        return {}, UNKNOWN, str(exc)
    placed: dict[str, tuple[str | None, str | None]] = {}
    for p in srec.processes:
        nodes = info.components[p.component].nodes
        node = nodes[p.node] if p.node < len(nodes) else None
        placed[p.name] = (node, urls.get(p.name))
    return placed, info.state, info.detail


# -- finding a deployment -------------------------------------------------------------------------
def files(deployment: str) -> dict[str, Path]:
    """Backend -> its record file of ``deployment`` that exists."""
    d = deployment_dir(deployment)
    found = {"ssh": d / STATE_FILE, "slurm": d / SLURM_RECORD_FILE}
    return {b: p for b, p in found.items() if p.is_file()}


def backend_of(deployment: str, backend: str | None = None) -> str | None:
    """The backend ``backend`` names, else the one whose record the deployment has; None
    when it has none. RecordError when it has both and none is named."""
    if backend is not None:
        return backend
    have = files(deployment)
    if len(have) > 1:
        raise RecordError(
            f"{deployment} has both an SSH record and a Slurm record in "
            f"{deployment_dir(deployment)}: pass --backend ssh or --backend slurm"
        )
    return next(iter(have), None)


def find(deployment: str, backend: str | None = None, *, place: bool = True) -> Record | None:
    """The record of ``deployment`` (None: nothing recorded), from whichever backend's file
    it has (``backend`` picks one). ``place``: ask Slurm where a job's processes run (else a
    Slurm record's processes are unplaced). RecordError for a record that cannot be read or
    trusted (the message says what to do by hand)."""
    which = backend_of(deployment, backend)
    if which == "ssh":
        state = load_state(deployment)
        path = deployment_dir(deployment) / STATE_FILE
        return None if state is None else from_state(state, str(path))
    if which == "slurm":
        from pdlaunch.backends import slurm_record

        srec = slurm_record.load_record(deployment)
        if srec is None:
            return None
        placed, state, detail = placement(srec) if place else ({}, None, "")
        return from_slurm(srec, placed, state, detail, str(slurm_record.record_path(deployment)))
    if which is None:
        return None
    raise RecordError(f"unknown backend {which!r} (known: {', '.join(BACKENDS)})")


def find_all(*, place: bool = False) -> Iterator[Record | RecordError]:
    """Every recorded deployment (a record that cannot be read: its RecordError)."""
    for name in list_deployments():
        for backend in files(name):
            try:
                rec = find(name, backend, place=place)
            except StateError as exc:
                yield RecordError(str(exc))
                continue
            if rec is not None:
                yield rec


def read_migrated(path: Path) -> Record:
    """The record in the file ``path`` as format 2, whichever format it is in (state.json,
    slurm.json format 1, or format 2); Slurm processes unplaced. For tools and tests."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RecordError(f"cannot read the record {path}: {exc}") from None
    if isinstance(data, dict) and data.get("format") == FORMAT:
        return Record.parse(text)
    deployment = path.parent.name
    try:
        if isinstance(data, dict) and data.get("backend") == "slurm":
            from pdlaunch.backends.slurm_record import SlurmRecord

            return from_slurm(SlurmRecord.parse(text, deployment), source=str(path))
        return from_state(DeploymentState.parse(text, deployment), str(path))
    except ValueError as exc:
        raise RecordError(f"the record {path} is damaged: {exc}") from None


# -- logs on the control host ---------------------------------------------------------------------
def log_path(rec: Record, name: str) -> str:
    """The log of process ``name`` (``driver``: a Slurm job's batch script's own)."""
    paths = {p.name: p.log_path for p in rec.processes}
    if isinstance(rec.handle, SlurmHandle):
        paths["driver"] = rec.handle.driver_log
    if name not in paths:
        raise RecordError(f"no process {name!r} in {rec.deployment}; known: {', '.join(paths)}")
    return paths[name]


def follow_recorded_log(
    deployment: str, name: str, lines: int, backend: str | None = None
) -> Iterator[str]:
    """Follow the log of process ``name`` of ``deployment`` where its record says it is, for
    a log this host can read (a Slurm job's; over SSH `launch.logs` follows a remote one)."""
    rec = find(deployment, backend, place=False)
    if rec is None:
        raise RecordError(f"no deployment {deployment!r} is recorded on this control host")
    path = log_path(rec, name)
    p = rec.process(name)
    if p is not None and not p.log_local:
        raise RecordError(f"{name}'s log is on {p.host}, not on this host: {path}")
    yield from follow_local_log(path, lines)


def follow_local_log(path: str, lines: int) -> Iterator[str]:
    """``tail -F`` of a log on this host: its last ``lines`` lines, then each new one, until
    the caller stops iterating. A log that is a symbolic link is refused (pdlaunch makes
    none: one there was planted, and could point at any file of the user's)."""
    from pdlaunch.hosts import LocalHost  # the hosts layer pulls in fabric

    if os.path.islink(path):
        raise RecordError(f"{path} is a symbolic link; not read")
    host = LocalHost()
    try:
        with host.follow_log(path, lines=lines) as followed:
            yield from followed
    finally:
        host.close()
