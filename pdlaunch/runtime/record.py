"""The record of a deployment, whichever runtime started it (format 2): what runs, where it
really listens, and everything its runtime needs to find, check and stop it again.

One file per deployment, ``<state dir>/<deployment>/record.json``, read and written only by
:mod:`pdlaunch.runtime.record_store`. This module is the model: :class:`Record` (the common
part `status`, `down`, `doctor`, `logs` and `bench` read on every backend) with a typed,
per-backend ``handle`` on the record and on each process (SSH: pids, start times, pid files,
script hashes, the SSH settings it was reached with, its container; Slurm: job id, driver
script and log, each process's component and node), and the conversions between it and each
runtime's working view (:class:`pdlaunch.runtime.state.DeploymentState` for SSH,
:class:`pdlaunch.backends.slurm.record.SlurmRecord` for Slurm). A conversion to a working
view re-runs that view's own checks (pids above 1, every path the one the plan gives it in the
deployment's own work dir, a Slurm job id): a record edited to name the wrong process or file
is refused, never acted on.

Format 1 (before this module) was two files: ``state.json`` (SSH) and ``slurm.json`` (Slurm),
each that runtime's working view as JSON; :func:`from_state` and :func:`from_slurm` migrate
them (the store reads them, and the next write replaces them by ``record.json``).

Where a process really listens is part of the record: over SSH the plan's address (the
process runs on the host the topology names); under Slurm the node the job was given, at the
address Slurm reaches it (``NodeAddr``), asked from Slurm when the record is found (a requeued
job may move), so never stored. A Slurm job that does not run leaves every process unplaced
(``host`` and URLs None) and says why in ``handle.job_state``.

The record never holds a secret value (names only).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from pdlaunch.observe import health
from pdlaunch.runtime.state import DeploymentState, StateError
from pdlaunch.spec.topology import Ssh

FORMAT = 2
RECORD_FILE = "record.json"
BACKENDS = ("ssh", "slurm")
UNKNOWN = "UNKNOWN"  # a Slurm job's state when Slurm could not be asked


class RecordError(StateError):
    """A record cannot be found, read or trusted; the message is for the user."""


class RecordFormatError(RecordError):
    """A record in a format this pdlaunch does not read (written by a newer one): not damaged,
    so never moved aside or overwritten; the message names the file and what to do."""


class OtherBackendError(RecordError):
    """The deployment's record is another backend's: acting on it from this one would run a
    second copy beside it, or hide it. ``what``: that record, in words (with its file)."""

    def __init__(self, deployment: str, what: str, wanted: str):
        self.deployment, self.what = deployment, what
        super().__init__(
            f"deployment {deployment!r} has a record of {what}, not of the {wanted} backend "
            f"(without --backend, every command finds it; `pdlaunch down {deployment}` "
            "stops it)"
        )

    def refusal(self) -> str:
        """Why `up` on the other backend is refused."""
        return (
            f"deployment {self.deployment!r} has {self.what}: `pdlaunch down "
            f"{self.deployment}` first"
        )


class _Model(BaseModel):
    # An unknown key is an error: a record is read strictly, as it is acted on.
    model_config = ConfigDict(extra="forbid")


# -- per process ----------------------------------------------------------------------------------
class ContainerHandle(_Model):
    """A process run in a docker/podman container: how `down` and `status` find it (by its
    cid file, else its name and labels) even once the `run` client is gone."""

    runtime: str
    name: str
    cid_path: str
    deployment: str
    process: str


class SshProcessHandle(_Model):
    kind: Literal["ssh"] = "ssh"
    local: bool  # started on the control host itself (no SSH)
    ssh: Ssh  # the settings it was reached with (the topology's, as `up` ran)
    script_path: str
    pid_path: str  # the pid file the process leaves on its host (found again without a record)
    secrets_path: str  # deleted by `down` (only the deployment's own file: checked on read)
    ports: list[int]
    script_hash: str  # sha256 of the script as uploaded ("" when found by its pid file)
    started_at: float | None = None  # wall clock on the control host
    container: ContainerHandle | None = None


class SlurmProcessHandle(_Model):
    kind: Literal["slurm"] = "slurm"
    component: int  # the heterogeneous job's component it runs in
    node: int  # index within the component's nodes
    port: int | None
    health_path: str | None
    script_path: str
    secrets_path: str
    # vllm-router's Prometheus port; None for engines (their HTTP port serves /metrics)
    metrics_port: int | None = None


ProcessHandle = Annotated[SshProcessHandle | SlurmProcessHandle, Field(discriminator="kind")]


class RecordedProcess(_Model):
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
    # The DP ranks its API server fronts (plan.Process.dp_ranks); empty: one engine.
    dp_ranks: list[int] = []
    handle: ProcessHandle

    @property
    def base_url(self) -> str | None:
        return health.base_url(self.health_url) if self.health_url else None


# -- per deployment -------------------------------------------------------------------------------
class SshHandle(_Model):
    kind: Literal["ssh"] = "ssh"
    topology: str  # the topology file `up` was given
    known_hosts: str | None = None
    ssh_config: str | None = None
    scripts_hash: str = ""  # a second `up` of the same scripts adopts what runs
    file_hashes: dict[str, str] = Field(default_factory=dict)
    # The rendered scripts as uploaded (they never hold a secret value), for "what changed".
    scripts: dict[str, str] = Field(default_factory=dict)
    # The control host's variables whose values are secrets (names only): the debug bundle
    # redacts their values even when the topology file has moved.
    secret_names: list[str] = Field(default_factory=list)


class SlurmHandle(_Model):
    kind: Literal["slurm"] = "slurm"
    job_id: str
    script: str  # the job's driver (batch) script
    driver_log: str
    model: str
    components: list[list[str]]  # per component: its topology hosts
    scripts_hash: str = ""  # a second `up` of the same files keeps (adopts) the job
    # As found, never stored (VIEW_ONLY): the job's state (squeue/sacct; None: not asked),
    # and its dirs, derived from the paths above.
    job_state: str | None = None
    job_detail: str = ""
    job_dir: str = ""
    work_dirs: list[str] = Field(default_factory=list)

    @property
    def job_said(self) -> str:
        """"job ID is STATE (detail)": how every command names a job as found."""
        return f"job {self.job_id} is {self.job_state}" + (
            f" ({self.job_detail})" if self.job_detail else ""
        )


Handle = Annotated[SshHandle | SlurmHandle, Field(discriminator="kind")]

# Fields of a record that say what was found, not what was started: never written.
VIEW_ONLY: dict[str, Any] = {
    "source": True,
    "handle": {"job_state", "job_detail", "job_dir", "work_dirs"},
}


class Record(_Model):
    format: Literal[2] = FORMAT
    backend: Literal["ssh", "slurm"]
    deployment: str
    status: str  # starting | submitted | up | failed | stopping
    served_model_name: str
    # The router's base URL where it really runs (None: not placed, e.g. a pending job).
    endpoint: str | None
    created_at: float
    updated_at: float
    processes: list[RecordedProcess]
    handle: Handle
    source: str = ""  # the file this record was read from (not stored)
    # The runtime's working view of it (DeploymentState, SlurmRecord), set by the store.
    _native: Any = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _one_backend(self) -> Record:
        kinds = {self.handle.kind, *(p.handle.kind for p in self.processes)}
        if kinds != {self.backend}:
            raise ValueError(f"backend is {self.backend!r} but its handles are {sorted(kinds)}")
        return self

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
        """Everything, as found (for the debug bundle and tools)."""
        return self.model_dump_json(indent=2) + "\n"

    def stored_json(self) -> str:
        """What ``record.json`` holds: the record less what is only known when found."""
        return self.model_dump_json(indent=2, exclude=VIEW_ONLY) + "\n"

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


# -- SSH: DeploymentState <-> Record --------------------------------------------------------------
def from_state(state: DeploymentState, source: str = "") -> Record:
    """The SSH runtime's working view (also what a format-1 ``state.json`` holds) as a
    record: processes run where the plan put them."""

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
            dp_ranks=list(p.dp_ranks),
            handle=SshProcessHandle(
                local=p.local,
                ssh=Ssh.model_validate(p.ssh),
                script_path=p.script_path,
                pid_path=p.pid_path,
                secrets_path=p.secrets_path,
                ports=list(p.ports),
                script_hash=p.script_hash,
                started_at=p.started_at,
                container=ContainerHandle.model_validate(p.container) if p.container else None,
            ),
        )
        for p in state.processes
    ]
    rec = Record(
        backend="ssh",
        deployment=state.deployment,
        status=state.status,
        served_model_name=state.served_model_name,
        endpoint=state.endpoint or None,
        created_at=state.created_at,
        updated_at=state.updated_at,
        processes=procs,
        handle=SshHandle(
            topology=state.topology,
            known_hosts=state.known_hosts,
            ssh_config=state.ssh_config,
            scripts_hash=state.scripts_hash,
            file_hashes=dict(state.file_hashes),
            scripts=dict(state.scripts),
            secret_names=list(state.secret_names),
        ),
        source=source,
    )
    rec._native = state
    return rec


def to_state(rec: Record) -> DeploymentState:
    """The SSH runtime's working view of ``rec``, through its own checks (ValueError naming
    the first bad field: a pid below 2, a secrets file outside the deployment's dir)."""
    h = rec.handle
    assert isinstance(h, SshHandle)
    procs = []
    for p in rec.processes:
        ph = p.handle
        assert isinstance(ph, SshProcessHandle)
        procs.append({
            "name": p.name, "role": p.role, "host": p.host, "local": ph.local,
            "ssh": ph.ssh.model_dump(mode="json"), "work_dir": p.work_dir,
            "script_path": ph.script_path, "log_path": p.log_path, "pid_path": ph.pid_path,
            "secrets_path": ph.secrets_path, "health_url": p.health_url, "ports": ph.ports,
            "script_hash": ph.script_hash, "pid": p.pid, "start_time": p.start_time,
            "started_at": ph.started_at,
            "container": ph.container.model_dump() if ph.container else None,
            "dp_ranks": p.dp_ranks,
        })  # fmt: skip
    data = {
        "deployment": rec.deployment, "topology": h.topology, "scripts_hash": h.scripts_hash,
        "endpoint": rec.endpoint or "", "served_model_name": rec.served_model_name,
        "status": rec.status, "created_at": rec.created_at, "updated_at": rec.updated_at,
        "known_hosts": h.known_hosts, "ssh_config": h.ssh_config,
        "file_hashes": h.file_hashes, "scripts": h.scripts, "processes": procs,
        "secret_names": h.secret_names,
    }  # fmt: skip
    return DeploymentState.parse(json.dumps(data), rec.deployment)
