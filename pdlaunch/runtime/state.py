"""The control host's per-deployment directory, the lock that keeps two `up`/`down` runs of
one deployment apart, and the SSH runtime's working view of what it started
(:class:`DeploymentState`).

Layout: ``$PDLAUNCH_STATE_DIR/<deployment>/`` (default ``~/.local/state/pdlaunch/<deployment>/``)
holds the record (``record.json``, read and written only by :mod:`pdlaunch.runtime.record_store`)
and ``lock`` (``flock``-ed for the whole of an `up` or `down`). The state never holds a secret
value: only names.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import posixpath
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from pdlaunch.plan.containers import ENGINE_RUNTIMES, container_name
from pdlaunch.plan.render import RenderedFile
from pdlaunch.spec.topology import HOSTNAME, NAME

STATE_DIR_ENV = "PDLAUNCH_STATE_DIR"
LOCK_FILE = "lock"
_T = TypeVar("_T")


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
    # Its container (topology `container:`, docker/podman): runtime, name, cid_path,
    # deployment, process (pdlaunch.hosts.containers.ContainerRef); None: a host process.
    container: dict[str, str] | None = None
    # The DP ranks its API server fronts (plan.Process.dp_ranks): the canary proves each.
    dp_ranks: list[int] = field(default_factory=list)


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
    # The control host's variables whose values are secrets (names only, never a value): the
    # debug bundle redacts their values even when the topology file has moved.
    secret_names: list[str] = field(default_factory=list)

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
        return cls.parse(json.dumps(data))

    @classmethod
    def parse(cls, text: str, deployment: str | None = None) -> DeploymentState:
        """The record in ``text`` (JSON), every field of the type it must have (the schema
        is these dataclasses, checked by pydantic, no coercion), of ``deployment`` (the
        directory it was found in); ValueError naming the first bad field otherwise."""
        state = parse_json_as(cls, text)
        if deployment is not None and state.deployment != deployment:
            raise ValueError(
                f"deployment is {state.deployment!r}, in the directory of {deployment!r}"
            )
        check_name("deployment", state.deployment, DEPLOYMENT_NAME)
        seen: set[str] = set()
        for i, p in enumerate(state.processes):
            check_name(f"processes[{i}].name", p.name)
            if p.name in seen:
                raise ValueError(f"processes[{i}].name {p.name!r} is recorded twice")
            seen.add(p.name)
            if not HOSTNAME.fullmatch(p.host):
                raise ValueError(
                    f"processes[{i}].host is {p.host[:80]!r}: not a host name or address"
                )
            for key, low in (("pid", 2), ("start_time", 0)):
                v = getattr(p, key)
                if v is not None and v < low:
                    raise ValueError(f"processes[{i}].{key} is {v!r}: not a valid {key}")
            # Every path `down`, `status` and `logs` act on is the plan's own in the process's
            # work dir: a pid file or log named elsewhere would make another process "ours".
            for key, parts in own_paths(p.name).items():
                check_own_path(f"processes[{i}].{key}", getattr(p, key), p.work_dir,
                               state.deployment, *parts)  # fmt: skip
            if p.container is not None:
                check_container(f"processes[{i}].container", p.container, p.name, p.work_dir,
                                state.deployment)  # fmt: skip
        return state


def own_paths(name: str) -> dict[str, tuple[str, ...]]:
    """Where the plan puts process ``name``'s files in its work dir (plan.build._paths)."""
    return {
        "script_path": (f"{name}.sh",),
        "log_path": ("logs", f"{name}.log"),
        "pid_path": ("run", f"{name}.pid"),
        "secrets_path": ("run", f"{name}.secrets.env"),
    }


# A process name (an instance's name, the topology's NAME, with ``-node<i>`` added for a
# multi-node one) and a deployment name (NAME): one path component each, never "..", never
# absolute.
PROCESS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
DEPLOYMENT_NAME = NAME


def check_name(what: str, name: str, pattern: re.Pattern[str] = PROCESS_NAME) -> None:
    """ValueError unless ``name`` is a name pdlaunch could have given: it becomes part of
    paths that are deleted and of container names that are removed."""
    if not pattern.fullmatch(name):
        raise ValueError(
            f"{what} is {name[:80]!r}: not a name (letters, digits, '.', '_', '-'; no '/', "
            "not starting with '.')"
        )


_CONTAINER_KEYS = ("runtime", "name", "cid_path", "deployment", "process")


def check_container(
    what: str, ref: dict[str, str], name: str, work_dir: str, deployment: str
) -> None:
    """A recorded container (pdlaunch.hosts.containers.ContainerRef) must be the one the plan
    gives process ``name``: a known runtime (it is executed on the host), its own container
    name and labels, its own cid file (`down` removes the container whose id it holds, and
    the file). ValueError naming the field otherwise."""
    if sorted(ref) != sorted(_CONTAINER_KEYS) or not all(isinstance(v, str) for v in ref.values()):
        raise ValueError(f"{what}: not a container record (keys {', '.join(_CONTAINER_KEYS)})")
    if ref["runtime"] not in ENGINE_RUNTIMES:
        raise ValueError(
            f"{what}.runtime is {ref['runtime'][:80]!r}, not one of {', '.join(ENGINE_RUNTIMES)}"
        )
    for key, want in (
        ("deployment", deployment),
        ("process", name),
        ("name", container_name(deployment, name)),
    ):
        if ref[key] != want:
            raise ValueError(f"{what}.{key} is {ref[key][:80]!r}, not {want!r}")
    check_own_path(f"{what}.cid_path", ref["cid_path"], work_dir, deployment, "run",
                   f"{name}.cid")  # fmt: skip


def _where(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_json_as(kind: type[_T], text: str) -> _T:
    """``text`` (JSON) as ``kind`` (a dataclass), strictly: an int where an int is declared,
    not a string or a bool. ValueError naming the first bad field and its value."""
    try:
        return TypeAdapter(kind).validate_json(text, strict=True)
    except ValidationError as exc:
        raise ValueError(validation_message(exc)) from None


def validation_message(
    exc: ValidationError, tags: Callable[[Sequence[int | str]], Sequence[int | str]] = tuple
) -> str:
    """The first error pydantic found, for users: the field (``processes[0].pid``), what is
    wrong and the value found there. ``tags``: the location without the names pydantic adds
    to it (a tagged union's tag)."""
    e = exc.errors(include_url=False)[0]
    where = _where(tags(e["loc"]))
    found = repr(e.get("input"))
    found = found if len(found) <= 60 else found[:57] + "..."
    msg = e["msg"][:1].lower() + e["msg"][1:]
    if e["type"] == "missing":
        return f"{where}: missing"
    return f"{where + ': ' if where else ''}{msg}, found {found}"


def check_own_path(what: str, path: str, work_dir: str, deployment: str, *parts: str) -> None:
    """A path a record names for pdlaunch to write, read, signal by or delete must be the one
    the plan gives it in the deployment's own work dir (``<base>/<deployment>/<parts>``): a
    record edited to name another file must not make `down` delete it or stop the process
    holding it. Each part must be one plain name (a process name that is absolute or holds
    ``..`` would lead the joined path out of the work dir), and the work dir must end in the
    deployment's name, itself a plain name (checked by the caller): whatever else the work
    dir says, it names a directory of that deployment. ValueError saying so otherwise."""
    wd = work_dir.rstrip("/") or work_dir
    if posixpath.basename(wd) != deployment or deployment in ("", ".", ".."):
        raise ValueError(
            f"{what}: the work dir {work_dir[:200]!r} is not a directory of deployment "
            f"{deployment!r}; pdlaunch deletes files only in the deployment's own directories"
        )
    bad = [p for p in parts if p in ("", ".", "..") or "/" in p or "\0" in p]
    expected = posixpath.join(wd, *parts)
    if bad or path != expected:
        raise ValueError(
            f"{what} is {path[:200]!r}, not {expected[:200]!r}: pdlaunch deletes files only in "
            "the deployment's own directories, so it does not delete that one"
        )


class StateError(Exception):
    """State on the control host cannot be read, written or locked; message is user-facing."""


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
