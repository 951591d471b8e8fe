"""The host interface: the only code in pdlaunch that runs commands.

Everything a host can do is built on two primitives each implementation provides:
``_exec`` (run one ``sh`` command to completion, optional stdin bytes, optional timeout) and
``_open_stream`` (run one command and read its stdout incrementally). Process management
(detached start, group stop, liveness, logs) is written once, as small POSIX ``sh`` scripts
that read ``/proc`` — so the local and the SSH implementation run the very same scripts and
targets need nothing beyond ``sh``, coreutils and util-linux's ``setsid`` (Linux only).
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from pdlaunch.hosts.shell import (  # noqa: F401  (re-exported: callers import them from here)
    _FIND_FUNC,
    _PRIVATE_DIR_FUNC,
    _PUT_FUNC,
    _SH_FUNCS,
    _START_SCRIPT,
    _STOP_SCRIPT,
    EXEC_OWNED,
    _check_pid,
    exec_owned_script,
    sh_quote_path,
)

log = logging.getLogger("pdlaunch.hosts")

Content = bytes | str | os.PathLike
"""What :meth:`Host.put` uploads: ``bytes``/``str`` are the file content; a path-like object
(``pathlib.Path``) names a local file whose content is uploaded. A plain ``str`` is always
content, never a path."""


# -- results and errors --------------------------------------------------------------------------
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
    """One file for :meth:`Host.put_files`: its content (see :data:`Content`), where it goes
    on the host (``~/`` expands) and its mode."""

    source: Content
    path: str
    mode: int = 0o644


@dataclass(frozen=True)
class Started:
    """What :meth:`Host.start_tracked` started: the pid and its start time (``/proc/PID/stat``
    field 22), ``None`` when the process had already ended by the time it was read."""

    pid: int
    start_time: int | None


class HostError(Exception):
    """A user-facing failure on a host; ``str(err)`` is the whole message (no traceback needed).

    ``host`` is the host's name (address as written in the topology) when known.
    """

    def __init__(self, message: str, *, host: str | None = None):
        super().__init__(message)
        self.message = message
        self.host = host

    def __str__(self) -> str:
        return self.message


class HostConnectionError(HostError):
    """Could not reach or log in to the host (refused, timeout, DNS, jump host, ...)."""


class HostAuthError(HostConnectionError):
    """The server rejected every key / credential offered."""


class HostKeyError(HostConnectionError):
    """The server's host key is unknown (and not accepted) or has CHANGED."""

    def __init__(self, message: str, *, host: str | None = None, changed: bool = False):
        super().__init__(message, host=host)
        self.changed = changed


class CommandError(HostError):
    """``run(..., check=True)`` returned non-zero; ``result`` has the details."""

    def __init__(self, message: str, *, host: str | None = None, result: CommandResult):
        super().__init__(message, host=host)
        self.result = result


class CommandTimeout(HostError):
    """A command ran past its timeout (and was killed)."""


class ProcessSurvived(HostError):
    """A process group was still alive after SIGKILL and the wait that followed it (a process
    in uninterruptible sleep, or a host too loaded to finish the exit in time)."""


class UnsafePathError(HostError):
    """A directory pdlaunch would write into could be changed by someone else."""


class Stream(Protocol):
    """Incremental stdout of one running command (see ``Host._open_stream``)."""

    pid: int | None  # the remote/local pid of the command, once known (set by the reader)

    def read(self, timeout: float) -> bytes | None:
        """Next chunk; ``b""`` when nothing arrived within ``timeout``; ``None`` at EOF."""

    def close(self) -> None:
        """Stop the command (kill it) and release the channel/pipe; idempotent."""


# -- the interface -------------------------------------------------------------------------------
class Host(ABC):
    """A machine pdlaunch runs commands on. Safe to use from several threads."""

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
        """Stop log followers and release connections. The object may be used again later
        (an SSH host then reconnects)."""
        with self._streams_lock:
            streams, self._streams = list(self._streams), set()
        for s in streams:
            s.close()

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
                f"{self.name}: command failed (rc={res.rc}): {_short(command)}"
                + (f"\n{tail}" if tail else ""),
                host=self.name,
                result=res,
            )
        return res

    def put(
        self, source: Content, remote_path: str, mode: int = 0o644, *, timeout: float = 300.0
    ) -> None:
        """Write a file on the host atomically (temp file + rename), creating parent dirs.

        ``source``: ``bytes``/``str`` content, or a path-like naming a local file. The file is
        created ``0600`` and only then ``chmod``-ed to ``mode``, so a secret uploaded with
        ``mode=0o600`` is never readable by others, whatever the umask. ``timeout`` bounds the
        whole upload (a host that accepted the login and then hangs must not hang us).
        """
        self.put_files([Upload(source, remote_path, mode)], timeout=timeout)

    def put_files(
        self,
        files: Sequence[Upload],
        *,
        private_dirs: Sequence[str] = (),
        keep_previous: Sequence[str] = (),
        timeout: float = 300.0,
    ) -> None:
        """:meth:`put` for several files in ONE command (one round trip, whatever the count),
        each written atomically with its own mode. First, in the same command,
        ``private_dirs`` are made and checked as :meth:`private_dirs` does (UnsafePathError,
        nothing written), then each of ``keep_previous`` that exists is renamed to
        ``PATH.prev``. ``timeout`` bounds the whole command."""
        data = [_content_bytes(f.source) for f in files]
        lines = [_PRIVATE_DIR_FUNC, _PUT_FUNC]
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

    # detached processes ------------------------------------------------------------------------
    def start_detached(
        self,
        command: str | Sequence[str],
        *,
        pid_file: str,
        log_file: str,
        cwd: str | None = None,
        timeout: float = 60.0,
    ) -> int:
        """Start a long-running process that outlives this call (and the SSH connection).

        ``command``: a shell script/command line (run by ``sh -c``) or an argv list. The process
        leads a new session and process group (``setsid``; its pid is the pgid), stdin is
        ``/dev/null``, stdout+stderr are appended to ``log_file``, and its pid is written to
        ``pid_file`` (atomically, before the command starts). Relative paths are relative to the
        login directory (home); ``~/`` is expanded. Returns the pid.
        """
        return self.start_tracked(
            command, pid_file=pid_file, log_file=log_file, cwd=cwd, timeout=timeout
        ).pid

    def start_tracked(
        self,
        command: str | Sequence[str],
        *,
        pid_file: str,
        log_file: str,
        cwd: str | None = None,
        timeout: float = 60.0,
    ) -> Started:
        """:meth:`start_detached`, returning the start time too, read by the same command (no
        second round trip for :meth:`process_start_time`)."""
        cmd = command if isinstance(command, str) else shlex.join(command)
        cd = ""
        if cwd is not None:
            cd = f"cd -- {sh_quote_path(cwd)} || exit 97"
        script = _SH_FUNCS + _START_SCRIPT.format(
            pid_file=sh_quote_path(pid_file),
            log_file=sh_quote_path(log_file),
            cd=cd,
            command=shlex.quote(cmd),
        )
        res = self._exec_start(script, timeout=timeout)
        out = res.stdout.split()
        if res.rc != 0 or not 1 <= len(out) <= 2 or not all(x.isdigit() for x in out):
            raise HostError(
                f"{self.name}: cannot start {_short(cmd)}: "
                f"{res.stderr.strip() or res.stdout.strip() or f'rc={res.rc}'}",
                host=self.name,
            )
        pid = int(out[0])
        log.debug("%s: started pid %d: %s", self.name, pid, cmd[:200])
        return Started(pid, int(out[1]) if len(out) == 2 else None)

    def _exec_start(self, script: str, timeout: float) -> CommandResult:
        """Run the start script. The environment the started process inherits is the login's
        (over SSH, sshd's); LocalHost overrides this to give it a login-like one too."""
        return self._exec(script, timeout=timeout)

    def private_dirs(self, dirs: Sequence[str], timeout: float = 60.0) -> None:
        """Create each directory (mode 0700) unless it exists, then refuse (HostError naming
        the path and its owner) one that is a link, not ours, writable by others, or under a
        parent someone else could rename it in."""
        if not dirs:
            return
        script = _PRIVATE_DIR_FUNC + f"_private_dirs {' '.join(map(sh_quote_path, dirs))} || exit 3"
        res = self._exec(script, timeout=timeout)
        if res.rc != 0:
            why = res.stderr.strip() or res.stdout.strip() or f"rc={res.rc}"
            raise UnsafePathError(f"{self.name}: unsafe work directory: {why}", host=self.name)

    def find_started(
        self, entries: Sequence[tuple[str, str, int | None]], timeout: float = 60.0
    ) -> dict[int, tuple[int, int]]:
        """Which of the processes :meth:`start_detached` started still run, in one command.

        ``entries``: ``(pid_file, log_file, pid)``, with ``pid`` None to read the pid file. A
        process counts only while it has ``log_file`` (or its ``.prev``) open as stdout, so a
        reused pid is never taken for ours. Returns ``{index: (pid, start_time)}``.
        """
        return self.find_tracked(entries, (), timeout=timeout)[0]

    def find_tracked(
        self,
        entries: Sequence[tuple[str, str, int | None]],
        logs: Sequence[str],
        timeout: float = 60.0,
    ) -> tuple[dict[int, tuple[int, int]], dict[int, list[tuple[int, int]]]]:
        """:meth:`find_started`, and in the same command every live process holding each of
        ``logs`` (or its ``.prev``) open as stdout or stderr: a started process's children
        inherit its log, so they are found even when their leader died. Returns
        ``(find_started's answer, {index in logs: [(pid, pgid), ...]})``."""
        if not entries and not logs:
            return {}, {}
        calls = [
            f"_find {i} {sh_quote_path(pidf)} {sh_quote_path(logf)} "
            + ("''" if pid is None else str(_check_pid(pid)))
            for i, (pidf, logf, pid) in enumerate(entries)
        ]
        calls += [
            f"_holders {sh_quote_path(logf)} | sed 's/^/h{i} /'" for i, logf in enumerate(logs)
        ]
        script = _SH_FUNCS + _FIND_FUNC + "\n".join(calls) + "\ntrue"
        res = self._exec(script, timeout=timeout)
        if res.rc != 0:
            raise HostError(
                f"{self.name}: cannot look for running processes: {res.stderr.strip()}",
                host=self.name,
            )
        found: dict[int, tuple[int, int]] = {}
        holders: dict[int, list[tuple[int, int]]] = {}
        for line in res.stdout.splitlines():
            parts = line.split()
            if len(parts) != 3 or not all(x.isdigit() for x in parts[1:]):
                continue
            if parts[0].isdigit():
                found[int(parts[0])] = (int(parts[1]), int(parts[2]))
            elif parts[0][:1] == "h" and parts[0][1:].isdigit():
                holders.setdefault(int(parts[0][1:]), []).append((int(parts[1]), int(parts[2])))
        return found, holders

    def stop(
        self,
        pid: int,
        *,
        grace: float = 10.0,
        start_time: int | None = None,
        log_file: str | None = None,
    ) -> bool:
        """Stop the process group led by ``pid``: SIGTERM, wait up to ``grace`` s, SIGKILL.

        Idempotent: returns ``False`` when nothing was running (or ``pid`` now belongs to an
        unrelated process, detected by ``start_time`` from :meth:`process_start_time`),
        ``True`` when something was stopped. If ``pid`` is alive but not a group leader, only
        that process is signalled. A group whose leader is dead is stopped too (an engine's
        workers outlive a killed API server): with ``log_file``, only while one of its
        members still has that log open (proof the group is the one we started); without,
        by its id alone. Raises HostError if the group survives SIGKILL.
        """
        pid = _check_pid(pid)
        script = _SH_FUNCS + _STOP_SCRIPT.format(
            pid=pid,
            start="" if start_time is None else int(start_time),
            grace_cs=max(0, math.ceil(grace * 100)),
            log="''" if log_file is None else sh_quote_path(log_file),
        )
        res = self._exec(script, timeout=grace + 60)
        out = res.stdout.strip()
        if res.rc == 3 and "still alive after SIGKILL" in res.stderr:
            raise ProcessSurvived(
                f"{self.name}: cannot stop pid {pid}: {res.stderr.strip()}", host=self.name
            )
        if res.rc != 0 or out not in ("none", "reused", "term", "kill"):
            raise HostError(
                f"{self.name}: cannot stop pid {pid}: {res.stderr.strip() or out or res.rc}",
                host=self.name,
            )
        log.debug("%s: stop %d -> %s", self.name, pid, out)
        return out in ("term", "kill")

    def process_start_time(self, pid: int) -> int | None:
        """Start time of a live process (``/proc/PID/stat`` field 22, clock ticks since boot);
        ``None`` if it is not running. Record it with the pid to guard against pid reuse."""
        st = self._proc_stat(pid)
        if st is None or st[0] in ("Z", "X", "x"):
            return None
        return int(st[19])

    def is_alive(self, pid: int, start_time: int | None = None) -> bool:
        """True if ``pid`` is running (zombies count as dead) and, when ``start_time`` is
        given, is still the same process (not a reused pid)."""
        st = self._proc_stat(pid)
        if st is None or st[0] in ("Z", "X", "x"):
            return False
        return start_time is None or int(st[19]) == int(start_time)

    def group_pids(self, pgid: int) -> list[int]:
        """Live (non-zombie) members of process group ``pgid``."""
        pgid = _check_pid(pgid)
        res = self._exec(_SH_FUNCS + f"PGID={pgid}; _group", timeout=60)
        return sorted(int(x) for x in res.stdout.split() if x.isdigit())

    def _proc_stat(self, pid: int) -> list[str] | None:
        """Fields 3.. of /proc/PID/stat (index 0 = state), or None if no such process."""
        pid = _check_pid(pid)
        res = self._exec(_SH_FUNCS + f"_stat {pid} || true", timeout=60)
        fields = res.stdout.split()
        return fields if len(fields) >= 20 else None

    def open_stream(self, command: str) -> Stream:
        """Start ``command`` (``sh -c``) and read its stdout as it comes (``Stream.read``);
        ``Stream.close`` (or closing the host) stops reading and kills it where it can: a
        caller that needs the process gone for sure has it print its pid and kills that."""
        stream = self._open_stream(command)
        with self._streams_lock:
            self._streams.add(stream)
        return stream

    # logs ---------------------------------------------------------------------------------------
    def read_log(self, path: str, lines: int = 50) -> str:
        """The last ``lines`` lines of a file (``""`` if it does not exist)."""
        q = sh_quote_path(path)
        # pdlaunch never makes a log a link: one there is not followed (it could point at any
        # file of the login user, and doctor's bundle is meant to be shared).
        res = self._exec(
            f"if [ -L {q} ]; then echo 'is a symbolic link; not read' >&2; exit 3; fi; "
            f"[ -e {q} ] || exit 0; tail -n {int(lines)} -- {q}",
            timeout=60,
        )
        if res.rc != 0:
            raise HostError(
                f"{self.name}: cannot read {path}: {res.stderr.strip()}", host=self.name
            )
        return res.stdout

    def follow_log(
        self,
        path: str,
        *,
        lines: int = 10,
        stop: threading.Event | None = None,
        poll_interval: float = 0.2,
    ) -> LogFollower:
        """Follow a file like ``tail -F``: yields its last ``lines`` lines, then each new line
        (waits for the file to appear, follows rotation). Lines have no trailing newline.

        ``tail`` starts right away (not at the first ``next()``). Stops, killing ``tail`` on the
        host, when the returned iterator is closed (``.close()``, or leaving ``with``), when
        ``stop`` is set (checked every ``poll_interval`` s, so another thread can stop a consumer
        blocked waiting for lines), or when the host is closed::

            with host.follow_log("~/pdlaunch/prefill.log") as lines:
                for line in lines:
                    print(line)
        """
        cmd = f"echo $$; exec tail -n {int(lines)} -F -- {sh_quote_path(path)} 2>/dev/null"
        stream = self._open_stream(cmd)
        with self._streams_lock:
            self._streams.add(stream)
        # Wait for the first line (the pid of tail), so that tail is running on return.
        buf, deadline = b"", time.monotonic() + 60
        while b"\n" not in buf and time.monotonic() < deadline:
            chunk = stream.read(0.5)
            if chunk is None:
                break
            buf += chunk
        head, sep, rest = buf.partition(b"\n")
        if not sep or not head.strip().isdigit():
            with self._streams_lock:
                self._streams.discard(stream)
            stream.close()
            raise HostError(f"{self.name}: cannot follow {path}", host=self.name)
        stream.pid = int(head)
        return LogFollower(self, stream, stop=stop, poll_interval=poll_interval, buffered=rest)


class LogFollower(Iterator[str]):
    """Iterator over the lines of a followed log (see :meth:`Host.follow_log`)."""

    def __init__(
        self,
        host: Host,
        stream: Stream,
        *,
        stop: threading.Event | None,
        poll_interval: float,
        buffered: bytes = b"",
    ):
        self._host = host
        self._stream = stream
        self._stop = stop
        self._poll = poll_interval
        self._buf = bytearray(buffered)
        self._scanned = 0  # bytes of _buf already known to hold no newline
        self._closed = False

    def __next__(self) -> str:
        # A bytearray and a scan offset: a 50 MB line arrives in thousands of chunks, and
        # re-scanning or re-copying the whole buffer per chunk made that quadratic.
        stream = self._stream
        buf = self._buf
        while not self._closed:
            nl = buf.find(b"\n", self._scanned)
            if nl >= 0:
                line = bytes(buf[:nl])
                del buf[: nl + 1]
                self._scanned = 0
                return line.decode("utf-8", errors="replace")
            self._scanned = len(buf)
            if self._stop is not None and self._stop.is_set():
                break
            chunk = stream.read(self._poll)
            if chunk is None:  # tail ended (file gone for good, host closed, ...)
                rest = bytes(buf)
                buf.clear()
                self._scanned = 0
                self.close()
                if rest:
                    return rest.decode("utf-8", errors="replace")
                break
            buf += chunk
        self.close()
        raise StopIteration

    def close(self) -> None:
        """Stop following (kills ``tail``); idempotent, callable from any thread."""
        if self._closed:
            return
        self._closed = True
        with self._host._streams_lock:
            self._host._streams.discard(self._stream)
        self._stream.close()

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _short(cmd: str, n: int = 120) -> str:
    cmd = " ".join(cmd.split())
    return cmd if len(cmd) <= n else cmd[: n - 3] + "..."


def _content_bytes(source: Content) -> bytes:
    if isinstance(source, bytes):
        return source
    if isinstance(source, str):
        return source.encode("utf-8")
    if isinstance(source, os.PathLike):
        with open(source, "rb") as f:
            return f.read()
    raise TypeError(f"put() takes bytes, str content or a path-like, not {type(source).__name__}")
