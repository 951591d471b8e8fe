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


class UnsafePathError(HostError):
    """A directory pdlaunch would write into could be changed by someone else."""


# -- shell helpers -------------------------------------------------------------------------------
def sh_quote_path(path: str) -> str:
    """Quote ``path`` for sh, expanding a leading ``~`` / ``~/`` to the target's ``$HOME``."""
    path = os.fspath(path)
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


# Exec the script in $s only if it is a file (not a link) owned by the running user and
# writable by nobody else; exit 96 otherwise. Constant sh text: the SSH start command and the
# Slurm node runner (pdlaunch.backends.slurm) both end with it.
EXEC_OWNED = (
    'if [ -L "$s" ] || [ ! -f "$s" ] || [ "$(stat -c %u -- "$s")" != "$(id -u)" ]; then '
    'echo "pdlaunch: refusing to run $s: not a file owned by $(id -un)" >&2; exit 96; fi; '
    'case $(stat -c %a -- "$s") in *[2367]?|*[2367]) '
    'echo "pdlaunch: refusing to run $s: writable by others" >&2; exit 96;; esac; '
    'exec "$s"'
)


def exec_owned_script(script: str) -> str:
    """Exec the script only if it is still ours and nobody else could have changed it since
    the upload (the work dir is checked too, but a script is what runs with our rights)."""
    return f"s={sh_quote_path(script)}; {EXEC_OWNED}"


def _check_pid(pid: int) -> int:
    pid = int(pid)
    if pid <= 1:
        # kill -- -1 / -0 would hit every process we may signal: never allow it.
        raise ValueError(f"refusing to act on pid {pid}")
    return pid


# Shell functions shared by the process-management scripts. ``/proc/PID/stat``: after the last
# ')' come field 3 (state), 4 (ppid), 5 (pgrp), ..., 22 (starttime) -> $1, $2, $3, ..., ${20}.
_SH_FUNCS = r"""
_stat() { { read -r _l < "/proc/$1/stat"; } 2>/dev/null || return 1; set -- ${_l##*)}; echo "$*"; }
_alive() {  # $1=pid: running (not zombie/dead)
    _s=$(_stat "$1") || return 1; set -- $_s
    case $1 in Z|X|x) return 1;; esac; return 0; }
_group() {  # print live members of process group $PGID
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v pg="$PGID" '{
        s = $0; sub(/.*\) /, "", s); split(s, f, " ")
        if (f[3] == pg && f[1] !~ /^[ZXx]/) print $1 }'; }
_holders() {  # $1=log: "pid pgrp" of each live process with the log (or its .prev) as stdout/err
    _hl=$1
    for _hd in /proc/[0-9]*; do
        [ "$_hd/fd/1" -ef "$_hl" ] || [ "$_hd/fd/2" -ef "$_hl" ] \
            || [ "$_hd/fd/1" -ef "$_hl.prev" ] || [ "$_hd/fd/2" -ef "$_hl.prev" ] || continue
        _hs=$(_stat "${_hd#/proc/}") || continue
        set -- $_hs
        case $1 in Z|X|x) continue;; esac
        echo "${_hd#/proc/} $3"
    done; }
"""

_START_SCRIPT = r"""
pidf={pid_file}; logf={log_file}
case $pidf in /*) ;; *) pidf=$PWD/$pidf;; esac
case $logf in /*) ;; *) logf=$PWD/$logf;; esac
for d in "${{pidf%/*}}/" "${{logf%/*}}/"; do [ -d "$d" ] || mkdir -p -- "$d" || exit 97; done
rm -f -- "$pidf" "$pidf.tmp"
{cd}
command -v setsid >/dev/null 2>&1 || {{ echo "setsid not found (util-linux)" >&2; exit 97; }}
setsid -f sh -c 'set -C; echo $$ > "$1.tmp" && mv -f -- "$1.tmp" "$1" && exec sh -c "$2"' \
    pdlaunch-detached "$pidf" {command} </dev/null >>"$logf" 2>&1 || exit 97
i=0
while [ ! -s "$pidf" ]; do
    i=$((i+1)); [ $i -gt 1000 ] && {{ echo "pid file $pidf was not written" >&2; exit 97; }}
    sleep 0.01
done
read -r pid < "$pidf" || exit 97
# its start time in the same round trip: recorded with the pid, it tells a reused pid apart
s=$(_stat "$pid") && set -- $s || set -- X
case $1 in Z|X|x) echo "$pid";; *) echo "$pid ${{20}}";; esac
"""

_STOP_SCRIPT = r"""
PID={pid}; PGID={pid}; START={start}; GRACE_CS={grace_cs}; LOGF={log}
_now() {{  # centiseconds since boot
    read -r _u _ < /proc/uptime; _s=${{_u%.*}}; _c=${{_u#*.}}; echo $((_s * 100 + 1$_c - 100)); }}
mode=group; proven=
if s=$(_stat $PID); then
    set -- $s
    if [ -n "$START" ] && [ "${{20}}" != "$START" ]; then echo reused; exit 0; fi
    [ "$3" = "$PID" ] || mode=pid
    case $1 in Z|X|x) [ -n "$START" ] && proven=start;; *) proven=alive;; esac
fi
if [ -z "$proven" ] && [ -n "$LOGF" ]; then
    # The leader is gone (or a zombie we cannot date): its group (an engine's children) is
    # ours only while a member still holds our log; a group id is not reused while the group
    # has members.
    [ -n "$(_holders "$LOGF" | awk -v pg="$PGID" '$2 == pg')" ] || {{ echo none; exit 0; }}
fi
alive() {{ if [ $mode = group ]; then [ -n "$(_group)" ]; else _alive $PID; fi; }}
sig() {{ if [ $mode = group ]; then kill -s $1 -- -$PGID; else kill -s $1 $PID; fi; }} 2>/dev/null
alive || {{ echo none; exit 0; }}
sig TERM
end=$(( $(_now) + GRACE_CS ))
while alive; do
    [ "$(_now)" -ge $end ] && break
    sleep 0.1
done
alive || {{ echo term; exit 0; }}
sig KILL
end=$(( $(_now) + 1000 ))
while alive; do
    if [ "$(_now)" -ge $end ]; then
        echo "still alive after SIGKILL: $(_group | tr '\n' ' ')" >&2; exit 3
    fi
    sleep 0.05
done
echo kill
"""


# A pid file alone is not proof: the pid may have been reused. A process start_detached started
# has its log open as stdout (an `up` that rotated the log renamed it to .prev).
_FIND_FUNC = r"""
_find() {  # $1=key $2=pid file $3=log file $4=pid ("" to read the pid file)
    _k=$1; _lf=$3; _p=$4
    if [ -z "$_p" ]; then
        [ -f "$2" ] || return 0
        read -r _p < "$2" 2>/dev/null || return 0
    fi
    case $_p in ''|*[!0-9]*) return 0;; esac
    [ "$_p" -gt 1 ] || return 0
    { [ "/proc/$_p/fd/1" -ef "$_lf" ] || [ "/proc/$_p/fd/1" -ef "$_lf.prev" ]; } || return 0
    _s=$(_stat "$_p") || return 0
    set -- $_s
    case $1 in Z|X|x) return 0;; esac
    echo "$_k $_p ${20}"
}
"""

# Checks the directories pdlaunch writes into: ours, not a link, not writable by anyone else;
# and every ancestor owned by root or us, and sticky where others may write (OpenSSH's
# StrictModes rule), so nobody else can swap a directory, a script or a secret file under our
# feet. One `stat` for all of them and their ancestors (each once): a fork per path made
# this most of `up`'s CPU on a host.
_PRIVATE_DIR_FUNC = r"""
_private_dirs() {  # $@=dirs; creates missing ones (0700)
    _me=$(id -u); _n=$#; _seen='
'; _for=
    for _d in "$@"; do
        case $_d in /*) ;; *) _d=$PWD/$_d;; esac
        while [ "$_d" != / ] && [ "${_d%/}" != "$_d" ]; do _d=${_d%/}; done
        if [ -L "$_d" ]; then echo "$_d is a symbolic link" >&2; return 1; fi
        if [ ! -d "$_d" ]; then
            (umask 077 && mkdir -p -- "$_d") || return 1
        fi
        set -- "$@" "$_d"
        _seen="$_seen$_d
"  # a dir's own check is stricter than its check as another one's parent
    done
    shift "$_n"  # now: the dirs, absolute
    _n=$#
    for _d in "$@"; do
        _a=$_d
        while [ "$_a" != / ]; do
            _a=${_a%/*}; [ -n "$_a" ] || _a=/
            case $_seen in *"
$_a
"*) break;; esac  # and so are its parents
            _seen="$_seen$_a
"; _for="$_for$_d
"
            set -- "$@" "$_a"
        done
    done
    _i=0
    _out=$(stat -L -c '%u %a %U' -- "$@") || return 1
    for _p in "$@"; do
        _i=$((_i + 1))
        _l=${_out%%
*}; _out=${_out#*
}
        set -- $_l
        if [ "$_i" -le "$_n" ]; then
            if [ "$1" != "$_me" ]; then
                echo "$_p is owned by $3 (uid $1), not by $(id -un) (uid $_me)" >&2; return 1
            fi
            case $2 in *[2367]?|*[2367])
                echo "$_p is writable by others (mode $2)" >&2; return 1;; esac
            continue
        fi
        _d=${_for%%
*}; _for=${_for#*
}
        if [ "$1" != 0 ] && [ "$1" != "$_me" ]; then
            echo "$_p (a parent of $_d) is owned by $3 (uid $1): it could swap $_d" >&2
            return 1
        fi
        case $2 in
            [1357]???) ;;  # sticky: others cannot rename what is ours
            *[2367]?|*[2367])
                echo "$_p (a parent of $_d) is writable by others (mode $2), not sticky" >&2
                return 1;;
        esac
    done
    return 0
}
"""

# Writes the next SIZE bytes of stdin to PATH atomically (temp file in the same dir, 0600 until
# chmod, then rename). `head -c` reads no byte past SIZE (coreutils, busybox), so the files of
# one upload follow each other on one stdin; a short read (the upload was cut) is refused.
_PUT_FUNC = r"""
_put() {  # $1=path $2=mode (octal) $3=size
    _p=$1
    case $_p in */*) _d=${_p%/*}; [ -n "$_d" ] || _d=/;; *) _d=.;; esac
    [ -d "$_d" ] || mkdir -p -- "$_d" || return 1
    if [ -d "$_p" ]; then echo "$_p is a directory" >&2; return 1; fi
    _t=$(umask 077 && mktemp "$_d/.pdlaunch-put.XXXXXX") || return 1
    if head -c "$3" > "$_t" && [ "$(wc -c < "$_t")" -eq "$3" ] && chmod "$2" "$_t" \
        && mv -f -- "$_t" "$_p"; then return 0; fi
    rm -f -- "$_t"; return 1
}
_keep() {  # $1=path: renamed to PATH.prev if it exists (a log starts afresh; the old one stays)
    # A link there (dangling too) is removed: the start appends to this path, never through one.
    if [ -L "$1" ]; then rm -f -- "$1" || return 1
    elif [ -f "$1" ]; then mv -f -- "$1" "$1.prev" || return 1; fi; return 0
}
"""


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
