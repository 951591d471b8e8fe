"""Where records live and how they are read and written: the one place every command finds a
deployment, whichever runtime started it.

Layout: ``$PDLAUNCH_STATE_DIR/<deployment>/`` (default ``~/.local/state/pdlaunch/``) holds
``record.json`` (format 2, :mod:`pdlaunch.runtime.record`), written atomically after every
change, and ``lock`` (:class:`pdlaunch.runtime.state.DeploymentLock`).

Migration. A deployment started before format 2 has ``state.json`` (SSH) or ``slurm.json``
(Slurm) instead, format 1: read as a record all the same, and the next write puts
``record.json`` in its place, removing the old file only once the new one is on disk. A crash
between the two leaves both: ``record.json`` is the newer, so it is the one read (and the
next write or removal takes the old one away). Two format-1 files (one per backend) are
ambiguous until ``--backend`` picks one.

A record in a newer format than this pdlaunch reads is refused (:class:`RecordFormatError`),
never overwritten, moved aside or taken for damaged.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from pydantic import ValidationError

from pdlaunch.fsutil import ReadRefused, atomic_write, loads_json_bounded, read_bounded
from pdlaunch.runtime.state import (
    DeploymentState,
    StateError,
    deployment_dir,
    state_root,
    validation_message,
)

from . import registry
from .record import (
    BACKENDS,
    FORMAT,
    RECORD_FILE,
    OtherBackendError,
    Record,
    RecordError,
    RecordFormatError,
    SlurmHandle,
    from_state,
    to_state,
)

#: format 1: each backend's own file (read and migrated, never written)
LEGACY_FILES = {"ssh": "state.json", "slurm": "slurm.json"}
_NAMES = {"ssh": "processes started over SSH", "slurm": "a Slurm job"}
# A record holds each process's rendered script: a few KiB per process, so a few MiB for a
# thousand. Anything past these bounds was not written by pdlaunch.
MAX_RECORD_BYTES = 64 << 20
MAX_RECORD_DEPTH = 32


def _read_text(path: Path) -> str:
    """The record file's text, read with bounds (a regular file, not a FIFO or a device, at
    most MAX_RECORD_BYTES, UTF-8): ReadRefused (a ValueError) saying why otherwise."""
    data = read_bounded(path, MAX_RECORD_BYTES, what="record")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ReadRefused(f"record {str(path)!r} is not UTF-8 text") from None


def _load_json(text: str) -> object:
    """``text`` parsed with bounds (nesting, NaN, Infinity): ValueError (ReadRefused), never
    a RecursionError, for a record pdlaunch did not write."""
    return loads_json_bounded(text, max_depth=MAX_RECORD_DEPTH, what="the JSON")


def _read_json(path: Path) -> object:
    return _load_json(_read_text(path))


def record_path(deployment: str) -> Path:
    return deployment_dir(deployment) / RECORD_FILE


def list_deployments() -> list[str]:
    """Every deployment with a record here, whichever backend started it, in any format."""
    root = state_root()
    if not root.is_dir():
        return []
    names = (RECORD_FILE, *LEGACY_FILES.values())
    return sorted(p.name for p in root.iterdir() if any((p / n).is_file() for n in names))


# -- reading one file -----------------------------------------------------------------------------
def by_hand(deployment: str, backend: str | None, path: Path) -> str:
    """What to do when a record cannot be trusted or read (nothing was stopped)."""
    if backend in registry.RECORD_VIEWS:
        return registry.record_view(backend).by_hand(deployment, path)
    return ""


def _guess_backend(data: object, path: Path) -> str | None:
    if isinstance(data, dict) and data.get("backend") in BACKENDS:
        return str(data["backend"])
    return next((b for b, n in LEGACY_FILES.items() if n == path.name), None)


def backend_named(path: Path) -> str | None:
    """The backend a record file says it is (its ``backend``, else a format-1 file's name),
    read without checking anything else: for messages about a record that cannot be read."""
    try:
        data = _read_json(path)
    except (OSError, ValueError):
        data = None
    return _guess_backend(data, path)


def read_file(path: Path, deployment: str | None = None) -> Record:
    """The record in ``path`` (format 2, or a format-1 ``state.json``/``slurm.json``,
    migrated), checked by its runtime's own rules; a Slurm job's processes unplaced.
    RecordFormatError for a format this pdlaunch does not read; RecordError naming the file
    and what is wrong (and, for a Slurm job, what to do by hand) otherwise."""
    deployment = deployment or path.parent.name
    legacy = next((b for b, n in LEGACY_FILES.items() if n == path.name), None)
    try:
        text = _read_text(path)
    except (OSError, ValueError) as exc:
        raise _damaged(f"cannot read {_what(legacy)} {path}: {exc}", deployment, legacy,
                       path) from None  # fmt: skip
    try:
        data = _load_json(text)
    except ValueError as exc:
        raise _damaged(f"cannot read {_what(legacy)} {path}: it is damaged: {exc}", deployment,
                       legacy, path) from None  # fmt: skip
    fmt = data.get("format") if isinstance(data, dict) else None
    backend = _guess_backend(data, path)
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > FORMAT:
        raise RecordFormatError(
            f"the record {path} is format {fmt}, written by a newer pdlaunch; this one "
            f"reads formats 1 to {FORMAT}. Nothing was read, stopped or changed: run the "
            f"pdlaunch that started {deployment!r} (or a newer one) for its `status`/`down`"
        )
    try:
        if fmt == FORMAT:
            rec = Record.model_validate_json(text, strict=True)
            if rec.deployment != deployment:
                raise ValueError(
                    f"deployment is {rec.deployment!r}, in the directory of {deployment!r}"
                )
            native = (
                to_state(rec)
                if rec.backend == "ssh"
                else registry.record_view(rec.backend).to_native(rec)
            )
        elif path.name == RECORD_FILE:
            raise ValueError(f"format is {fmt!r}, not {FORMAT}")
        elif fmt is not None and fmt != 1:
            raise ValueError(f"format is {fmt!r}, not 1")
        elif backend is not None and backend in registry.RECORD_VIEWS:
            native = registry.record_view(backend).parse_legacy(text, deployment)
        else:
            native = DeploymentState.parse(text, deployment)
        if isinstance(native, DeploymentState):
            return from_state(native, str(path))
        assert backend is not None
        return registry.record_view(backend).from_native(native, source=str(path))
    except ValidationError as exc:
        why = validation_message(exc, _untagged)
        raise _damaged(f"{_what(backend)} {path} is damaged: {why}", deployment, backend,
                       path) from None  # fmt: skip
    except ValueError as exc:
        raise _damaged(f"{_what(backend)} {path} is damaged: {exc}", deployment, backend,
                       path) from None  # fmt: skip


def _untagged(loc: Sequence[int | str]) -> list[int | str]:
    """``processes[0].handle.port``, not ``processes[0].handle.slurm.port``: pydantic puts
    the handle's kind in the location of an error inside it."""
    out = list(loc)
    for i in range(len(out) - 1, 0, -1):
        if out[i - 1] == "handle" and out[i] in BACKENDS:
            del out[i]
    return out


def _what(backend: str | None) -> str:
    return "the Slurm record" if backend == "slurm" else "the record"


def _damaged(why: str, deployment: str, backend: str | None, path: Path) -> RecordError:
    more = by_hand(deployment, backend, path)
    return RecordError(f"{why}. {more}" if more else why)


# -- finding a deployment's record ----------------------------------------------------------------
def _files(deployment: str) -> tuple[Path | None, dict[str, Path]]:
    d = deployment_dir(deployment)
    new = d / RECORD_FILE
    legacy = {b: d / n for b, n in LEGACY_FILES.items() if (d / n).is_file()}
    return (new if new.is_file() else None), legacy


def locate(deployment: str, backend: str | None = None) -> Path | None:
    """The file that holds ``deployment``'s record (``backend``: that backend's, among two
    format-1 files), None when there is none. RecordError when two format-1 files are left
    and no backend is named."""
    new, legacy = _files(deployment)
    if new is not None:
        return new  # the newest: a format-1 file beside it is what a crash left
    if backend is not None:
        return legacy.get(backend) or next(iter(legacy.values()), None)
    if len(legacy) > 1:
        raise RecordError(
            f"{deployment} has both an SSH record and a Slurm record in "
            f"{deployment_dir(deployment)}: pass --backend ssh or --backend slurm"
        )
    return next(iter(legacy.values()), None)


def read(deployment: str, backend: str | None = None) -> Record | None:
    """``deployment``'s record, unplaced (None: nothing recorded). ``backend``: the one the
    caller runs; a record of another backend is refused (RecordError saying so), as acting
    on it (a second `up`, a `down`) would run a second copy or hide the first."""
    path = locate(deployment, backend)
    if path is None:
        return None
    rec = read_file(path, deployment)
    if backend is not None and rec.backend != backend:
        what = _NAMES[rec.backend]
        if isinstance(rec.handle, SlurmHandle):
            what = f"Slurm job {rec.handle.job_id}"
        raise OtherBackendError(deployment, f"{what} ({path})", backend)
    return rec


def backend_of(deployment: str, backend: str | None = None) -> str | None:
    """The backend ``backend`` names, else the one whose record the deployment has; None
    when it has none. RecordFormatError for a record too new to read; RecordError when two
    format-1 files are left and none is named."""
    path = locate(deployment, backend)
    if path is None:
        return backend
    if path.name != RECORD_FILE:
        return backend or next(b for b, n in LEGACY_FILES.items() if n == path.name)
    check_format(path)
    if backend is not None:
        return backend
    try:
        data = _read_json(path)
    except (OSError, ValueError):
        return None  # damaged: the command reading it says so
    found = data.get("backend") if isinstance(data, dict) else None
    return found if found in BACKENDS else None


def check_format(path: Path) -> None:
    """RecordFormatError when ``path`` holds a record of a format this pdlaunch does not
    read (anything else, damage included, is for the reader to say)."""
    try:
        data = _read_json(path)
    except (OSError, ValueError):
        return
    fmt = data.get("format") if isinstance(data, dict) else None
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > FORMAT:
        read_file(path)  # raises RecordFormatError with its message


def find(deployment: str, backend: str | None = None, *, place: bool = True) -> Record | None:
    """The record of ``deployment`` (None: nothing recorded), ``backend`` naming the one to
    read among two format-1 files. ``place``: ask Slurm where a job's processes run (else a
    Slurm record's processes are unplaced). RecordError for a record that cannot be read or
    trusted (the message says what to do by hand)."""
    path = locate(deployment, backend)
    if path is None:
        return None
    rec = read_file(path, deployment)
    if backend is not None and rec.backend != backend:
        return None
    if place and rec.backend in registry.RECORD_VIEWS:
        rec = registry.record_view(rec.backend).place(rec)  # e.g. where Slurm runs the job now
    return rec


def find_all(*, place: bool = False) -> Iterator[Record | RecordError]:
    """Every recorded deployment (a record that cannot be read: its RecordError)."""
    for name in list_deployments():
        new, legacy = _files(name)
        for backend in [None] if new is not None else list(legacy):
            try:
                rec = find(name, backend, place=place)
            except StateError as exc:
                yield exc if isinstance(exc, RecordError) else RecordError(str(exc))
                continue
            if rec is not None:
                yield rec


# -- the SSH runtime's working view (Slurm's: pdlaunch.backends.slurm.record) -----------------
def load_state(deployment: str) -> DeploymentState | None:
    """The SSH runtime's record of ``deployment`` (None: nothing recorded)."""
    rec = read(deployment, "ssh")
    return None if rec is None else rec.native


def save_state(state: DeploymentState) -> Path:
    state.updated_at = time.time()
    return write(from_state(state))


# -- writing, removing ----------------------------------------------------------------------------
def write(rec: Record) -> Path:
    """Put ``rec`` in ``record.json`` (atomically: a reader sees the old record or the new),
    then remove the format-1 file it replaces. Refused (RecordError) over a record of another
    backend or of a newer format: that would hide what it records."""
    d = deployment_dir(rec.deployment)
    path = d / RECORD_FILE
    new, legacy = _files(rec.deployment)
    if new is not None:
        check_format(new)
        try:
            data = _read_json(new)
        except (OSError, ValueError):
            data = None  # damaged: replaced (the runtime decided, knowing it)
        other = data.get("backend") if isinstance(data, dict) else None
        if other in BACKENDS and other != rec.backend:
            raise RecordError(
                f"{path} records {_NAMES[other]}, not {_NAMES[rec.backend]}; not "
                f"overwritten: `pdlaunch down {rec.deployment}` first"
            )
    for b, old in legacy.items():
        if b != rec.backend:
            raise RecordError(f"{old} records {_NAMES[b]}; the record of {_NAMES[rec.backend]}"
                              f" is not written beside it: `pdlaunch down {rec.deployment} "
                              f"--backend {b}` first")  # fmt: skip
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, rec.stored_json(), mode=0o600)
    except OSError as exc:
        raise StateError(f"cannot write the record in {d}: {exc}") from None
    # Only now is the format-1 file redundant (a crash before this leaves both: record.json
    # is read, and this removal happens at the next write).
    _remove_legacy(rec.deployment, rec.backend)
    return path


def _remove_legacy(deployment: str, backend: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (deployment_dir(deployment) / LEGACY_FILES[backend]).unlink()


def remove(deployment: str, backend: str) -> None:
    """Forget ``deployment`` (every process it recorded is proven gone, by the caller): its
    record, in whichever format. The lock file stays (removing a lock others may hold
    races)."""
    new = record_path(deployment)
    with contextlib.suppress(FileNotFoundError):
        new.unlink()
    _remove_legacy(deployment, backend)


def move_aside(deployment: str, backend: str) -> str:
    """Keep an unreadable record for inspection (its processes are proven gone); a note for
    the message."""
    src = locate(deployment, backend)
    if src is None:
        return ""
    aside = src.with_name(f"{src.name}.unreadable-{int(time.time())}")
    try:
        os.replace(src, aside)
        return f"; the unreadable record was moved to {aside}"
    except OSError as exc:
        return f"; the unreadable record {src} could not be moved aside: {exc}"


# -- logs on the control host ---------------------------------------------------------------------
def log_path(rec: Record, name: str) -> str:
    """The log of process ``name`` (``driver``: a Slurm job's batch script's own)."""
    paths = {p.name: p.log_path for p in rec.processes}
    if isinstance(rec.handle, SlurmHandle):
        paths["driver"] = rec.handle.driver_log
    if name not in paths:
        raise RecordError(f"no process {name!r} in {rec.deployment}; known: {', '.join(paths)}")
    return paths[name]


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


__all__ = [
    "LEGACY_FILES",
    "RECORD_FILE",
    "OtherBackendError",
    "Record",
    "RecordError",
    "RecordFormatError",
    "backend_of",
    "find",
    "find_all",
    "list_deployments",
    "load_state",
    "locate",
    "read",
    "read_file",
    "record_path",
    "remove",
    "save_state",
    "write",
]
