"""Running commands on a host and writing files there: the one part of a host that differs
between the control host itself (:mod:`.local`) and a remote one (:mod:`.ssh`).

An implementation provides two primitives: ``_exec`` (run one ``sh -c`` command to
completion, optional stdin bytes, optional timeout) and ``_open_stream`` (run one command and
read its stdout as it comes). Everything else a host does (:mod:`.processes`, :mod:`.logs`)
is sh sent through them, so both implementations run the very same scripts.
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .errors import CommandError, CommandTimeout, HostError, UnsafePathError
from .shell import script, sh_quote_path

log = logging.getLogger("pdlaunch.hosts")

Content = bytes | str | os.PathLike
"""What :class:`Upload` carries: ``bytes``/``str`` are the file content; a path-like object
(``pathlib.Path``) names a local file whose content is uploaded. A plain ``str`` is always
content, never a path."""


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass(frozen=True)
class Upload:
    """One file for :meth:`Transport.put_files`: its content (see :data:`Content`), where it
    goes on the host (``~/`` expands) and its mode."""

    source: Content
    path: str
    mode: int = 0o644


class Stream(Protocol):
    """Incremental stdout of one running command (see ``Transport._open_stream``)."""

    pid: int | None  # the remote/local pid of the command, once known (set by the reader)

    def read(self, timeout: float) -> bytes | None:
        """Next chunk; ``b""`` when nothing arrived within ``timeout``; ``None`` at EOF."""

    def close(self) -> None:
        """Stop the command (kill it) and release the channel/pipe; idempotent."""


class Transport(ABC):
    """Runs commands on one machine and writes files there. Safe to use from several
    threads."""

    name: str  # the address as written in the topology

    def __init__(self, name: str):
        self.name = name
        self._streams: set[Stream] = set()
        self._streams_lock = threading.Lock()

    # primitives --------------------------------------------------------------------------------
    @abstractmethod
    def _exec(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        """Run ``command`` with ``/bin/sh -c`` on the host; stdin is ``stdin`` (or empty).

        Raises CommandTimeout (after killing the command) or HostError on transport failure.
        """

    @abstractmethod
    def _open_stream(self, command: str) -> Stream:
        """Start ``command`` (``sh -c``) and return a reader for its stdout."""

    def close(self) -> None:
        """Stop open streams (log followers) and release connections. The object may be used
        again later (an SSH host then reconnects)."""
        with self._streams_lock:
            streams, self._streams = list(self._streams), set()
        for s in streams:
            s.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    # commands ----------------------------------------------------------------------------------
    def run(self, command: str, timeout: float | None = None, check: bool = False) -> CommandResult:
        """Run a shell command (POSIX ``sh -c``; stdin empty) and capture its output.

        ``timeout``: kill it (its whole process group) after that many seconds and raise
        CommandTimeout. ``check``: raise CommandError when rc != 0.
        """
        log.debug("%s: run %s", self.name, command[:200])
        res = self._exec(command, timeout=timeout)
        if check and res.rc != 0:
            tail = (res.stderr.strip() or res.stdout.strip())[-800:]
            raise CommandError(
                f"{self.name}: command failed (rc={res.rc}): {short(command)}"
                + (f"\n{tail}" if tail else ""),
                host=self.name,
                result=res,
            )
        return res

    def open_stream(self, command: str) -> Stream:
        """Start ``command`` (``sh -c``) and read its stdout as it comes (``Stream.read``);
        ``Stream.close`` (or closing the host) stops reading and kills it where it can: a
        caller that needs the process gone for sure has it print its pid and kills that."""
        stream = self._open_stream(command)
        self._keep_stream(stream)
        return stream

    def _keep_stream(self, stream: Stream) -> None:
        with self._streams_lock:
            self._streams.add(stream)

    def _drop_stream(self, stream: Stream) -> None:
        with self._streams_lock:
            self._streams.discard(stream)

    # files -------------------------------------------------------------------------------------
    def put_files(
        self,
        files: Sequence[Upload],
        *,
        private_dirs: Sequence[str] = (),
        keep_previous: Sequence[str] = (),
        timeout: float = 300.0,
    ) -> None:
        """Write several files in ONE command (one round trip, whatever the count), each
        atomically (temp file + rename, parent dirs created) with its own mode: created
        ``0600`` and only then ``chmod``-ed, so a secret uploaded with ``mode=0o600`` is never
        readable by others, whatever the umask. First, in the same command, ``private_dirs``
        are made and checked as :meth:`private_dirs` does (UnsafePathError, nothing written),
        then each of ``keep_previous`` that exists is renamed to ``PATH.prev``. ``timeout``
        bounds the whole command (a host that accepted the login and then hangs must not hang
        us)."""
        data = [content_bytes(f.source) for f in files]
        lines = [script("private-dirs.sh"), script("put.sh")]
        if private_dirs:
            lines.append(f"_private_dirs {' '.join(map(sh_quote_path, private_dirs))} || exit 3")
        lines += [
            f"_keep {sh_quote_path(p)} || {{ echo {shlex.quote(p)} >&2; exit 4; }}"
            for p in keep_previous
        ]
        lines += [
            f"_put {sh_quote_path(f.path)} {f.mode:o} {len(d)} || {{ echo 'failed {i}'; exit 5; }}"
            for i, (f, d) in enumerate(zip(files, data, strict=True))
        ]
        what = files[0].path if len(files) == 1 else f"{len(files)} files"
        try:
            res = self._exec("\n".join(lines), stdin=b"".join(data), timeout=timeout)
        except CommandTimeout:
            raise CommandTimeout(
                f"{self.name}: writing {what} did not finish within {timeout:g}s "
                "(the host accepted the login but does not complete commands)",
                host=self.name,
            ) from None
        if res.rc == 0:
            return
        why = res.stderr.strip()
        if res.rc == 3:
            raise UnsafePathError(
                f"{self.name}: unsafe work directory: {why or f'rc={res.rc}'}", host=self.name
            )
        if res.rc == 4:
            raise HostError(f"{self.name}: cannot rename {why} to .prev", host=self.name)
        failed = res.stdout.split()
        if res.rc == 5 and len(failed) == 2 and failed[1].isdigit():
            what = files[int(failed[1])].path
        raise HostError(f"{self.name}: cannot write {what}: {why or 'failed'}", host=self.name)

    def private_dirs(self, dirs: Sequence[str], timeout: float = 60.0) -> None:
        """Create each directory (mode 0700) unless it exists, then refuse (UnsafePathError
        naming the path and its owner) one that is a link, not ours, writable by others, or
        under a parent someone else could rename it in."""
        if not dirs:
            return
        command = (
            script("private-dirs.sh")
            + f"\n_private_dirs {' '.join(map(sh_quote_path, dirs))} || exit 3"
        )
        res = self._exec(command, timeout=timeout)
        if res.rc != 0:
            why = res.stderr.strip() or res.stdout.strip() or f"rc={res.rc}"
            raise UnsafePathError(f"{self.name}: unsafe work directory: {why}", host=self.name)


def short(cmd: str, n: int = 120) -> str:
    """A command on one line, cut to ``n`` characters, for an error message."""
    cmd = " ".join(cmd.split())
    return cmd if len(cmd) <= n else cmd[: n - 3] + "..."


def content_bytes(source: Content) -> bytes:
    if isinstance(source, bytes):
        return source
    if isinstance(source, str):
        return source.encode("utf-8")
    if isinstance(source, os.PathLike):
        with open(source, "rb") as f:
            return f.read()
    raise TypeError(
        f"an Upload holds bytes, str content or a path-like, not {type(source).__name__}"
    )
