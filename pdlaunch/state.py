"""What `up` started, recorded on the control host, so `status`, `logs` and `down` work from
another shell later; and the per-deployment lock that keeps two `up` runs apart.

Layout: ``$PDLAUNCH_STATE_DIR/<deployment>/`` (default ``~/.local/state/pdlaunch/<deployment>/``)
holds ``state.json`` (written atomically after every change) and ``lock`` (``flock``-ed for the
whole of an `up` or `down`). The state never holds a secret value: only names.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdlaunch.fsutil import atomic_write
from pdlaunch.render import RenderedFile

STATE_DIR_ENV = "PDLAUNCH_STATE_DIR"
STATE_FILE = "state.json"
LOCK_FILE = "lock"
FORMAT = 1


def state_root() -> Path:
    override = os.environ.get(STATE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "pdlaunch"


def deployment_dir(deployment: str) -> Path:
    return state_root() / deployment


def scripts_hash(files: list[RenderedFile]) -> str:
    """sha256 over every rendered file (name and content), order-independent."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.name):
        h.update(f.name.encode() + b"\0" + f.content.encode() + b"\0")
    return h.hexdigest()


def file_hashes(files: list[RenderedFile]) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.content.encode()).hexdigest() for f in files}


@dataclass
class ProcessState:
    name: str
    role: str
    host: str
    local: bool
    ssh: dict[str, Any]
    work_dir: str
    script_path: str
    log_path: str
    pid_path: str
    secrets_path: str
    health_url: str | None
    ports: list[int]
    script_hash: str
    pid: int | None = None
    start_time: int | None = None  # /proc/PID/stat starttime, guards against pid reuse
    started_at: float | None = None  # wall clock on the control host


@dataclass
class DeploymentState:
    deployment: str
    topology: str
    scripts_hash: str
    endpoint: str
    served_model_name: str
    status: str = "starting"  # starting | up | failed | stopping
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    known_hosts: str | None = None
    ssh_config: str | None = None
    file_hashes: dict[str, str] = field(default_factory=dict)
    # The rendered scripts as uploaded (they never hold a secret value), for "what changed".
    scripts: dict[str, str] = field(default_factory=dict)
    processes: list[ProcessState] = field(default_factory=list)
    format: int = FORMAT

    def process(self, name: str) -> ProcessState | None:
        return next((p for p in self.processes if p.name == name), None)

    def started(self) -> list[ProcessState]:
        return [p for p in self.processes if p.pid is not None]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> DeploymentState:
        """Raises ValueError naming the first bad field: a record that points at the wrong
        process is worse than none (it would make `down` signal a stranger, or pid 1)."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, found {type(data).__name__}")
        data = dict(data)
        raw = data.pop("processes", [])
        if not isinstance(raw, list):
            raise ValueError("processes: expected a list")
        procs = []
        pfields = ProcessState.__dataclass_fields__
        for i, p in enumerate(raw):
            if not isinstance(p, dict):
                raise ValueError(f"processes[{i}]: expected an object")
            for key in ("pid", "start_time"):
                v = p.get(key)
                low = 2 if key == "pid" else 0
                if v is not None and (type(v) is not int or v < low):
                    raise ValueError(f"processes[{i}].{key} is {v!r}: not a valid {key}")
            try:
                procs.append(ProcessState(**{k: v for k, v in p.items() if k in pfields}))
            except TypeError as exc:
                raise ValueError(f"processes[{i}]: {exc}") from None
        known = set(cls.__dataclass_fields__)
        try:
            return cls(**{k: v for k, v in data.items() if k in known}, processes=procs)
        except TypeError as exc:
            raise ValueError(str(exc)) from None


class StateError(Exception):
    """State on the control host cannot be read, written or locked; message is user-facing."""


def load_state(deployment: str) -> DeploymentState | None:
    path = deployment_dir(deployment) / STATE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StateError(f"cannot read the record {path}: {exc}") from None
    try:
        return DeploymentState.from_json(data)
    except ValueError as exc:
        raise StateError(f"the record {path} is damaged: {exc}") from None


def save_state(state: DeploymentState) -> Path:
    d = deployment_dir(state.deployment)
    state.updated_at = time.time()
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        text = json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n"
        atomic_write(d / STATE_FILE, text, mode=0o600)
    except OSError as exc:
        raise StateError(f"cannot write state in {d}: {exc}") from None
    return d / STATE_FILE


def remove_state(deployment: str) -> None:
    """Forget a deployment (the lock file stays: removing a lock others may hold races)."""
    with contextlib.suppress(FileNotFoundError):
        (deployment_dir(deployment) / STATE_FILE).unlink()


# The Slurm backend's record (pdlaunch.backends.slurm_run takes the name from here, so this
# module, below every backend, imports none of them).
SLURM_RECORD_FILE = "slurm.json"


def list_deployments() -> list[str]:
    """Every deployment with a record here, whichever backend started it."""
    root = state_root()
    if not root.is_dir():
        return []
    records = (STATE_FILE, SLURM_RECORD_FILE)
    return sorted(p.name for p in root.iterdir() if any((p / name).is_file() for name in records))


class DeploymentLock:
    """Exclusive, non-blocking lock on one deployment (``flock``; released when the process
    exits, however it exits). ``acquire`` raises StateError naming the holder."""

    def __init__(self, deployment: str, purpose: str = "up"):
        self.deployment = deployment
        self.purpose = purpose
        self.path = deployment_dir(deployment) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> DeploymentLock:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise StateError(f"cannot create lock {self.path}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = ""
            with contextlib.suppress(OSError):
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            who = f" ({holder})" if holder else ""
            raise StateError(
                f"deployment {self.deployment!r} is locked by another pdlaunch run{who}; "
                f"wait for it to finish (lock: {self.path})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, {self.purpose}".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None

    def __enter__(self) -> DeploymentLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
