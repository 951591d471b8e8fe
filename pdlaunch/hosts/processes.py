"""Processes pdlaunch starts on a host: start one detached (it outlives the connection), find
the ones still running, tell whether one is alive, and stop a process group and prove it gone.

All of it reads ``/proc`` through the scripts in ``sh/`` (``start.sh``, ``stop.sh``,
``find.sh``, on ``proc.sh``), sent through the host's transport: Linux targets only, needing
nothing beyond ``sh``, coreutils and util-linux's ``setsid``. A pid is always kept with its
start time (``/proc/PID/stat`` field 22): together they tell our process from a reused pid.
"""

from __future__ import annotations

import logging
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import HostError, ProcessSurvived
from .shell import script, sh_quote_path, with_args
from .transport import CommandResult, Transport, short

log = logging.getLogger("pdlaunch.hosts")


def check_pid(pid: int) -> int:
    pid = int(pid)
    if pid <= 1:
        # kill -- -1 / -0 would hit every process we may signal: never allow it.
        raise ValueError(f"refusing to act on pid {pid}")
    return pid


@dataclass(frozen=True)
class Started:
    """What :meth:`ProcessControl.start_tracked` started: the pid and its start time
    (``/proc/PID/stat`` field 22), ``None`` when the process had already ended by the time it
    was read."""

    pid: int
    start_time: int | None


class ProcessControl(Transport):
    """Detached processes on a host, on top of its transport."""

    def start_tracked(
        self,
        command: str | Sequence[str],
        *,
        pid_file: str,
        log_file: str,
        cwd: str | None = None,
        timeout: float = 60.0,
    ) -> Started:
        """Start a long-running process that outlives this call (and the SSH connection).

        ``command``: a shell script/command line (run by ``sh -c``) or an argv list. The process
        leads a new session and process group (``setsid``; its pid is the pgid), stdin is
        ``/dev/null``, stdout+stderr are appended to ``log_file``, and its pid is written to
        ``pid_file`` (atomically, before the command starts). Relative paths are relative to the
        login directory (home); ``~/`` is expanded. Returns the pid and its start time, read by
        the same command (one round trip).
        """
        cmd = command if isinstance(command, str) else shlex.join(command)
        words = [sh_quote_path(pid_file), sh_quote_path(log_file), shlex.quote(cmd)]
        if cwd is not None:
            words.append(sh_quote_path(cwd))
        res = self._exec_start(with_args("start.sh", *words, libs=("proc.sh",)), timeout=timeout)
        out = res.stdout.split()
        if res.rc != 0 or not 1 <= len(out) <= 2 or not all(x.isdigit() for x in out):
            raise HostError(
                f"{self.name}: cannot start {short(cmd)}: "
                f"{res.stderr.strip() or res.stdout.strip() or f'rc={res.rc}'}",
                host=self.name,
            )
        pid = int(out[0])
        log.debug("%s: started pid %d: %s", self.name, pid, cmd[:200])
        return Started(pid, int(out[1]) if len(out) == 2 else None)

    def _exec_start(self, command: str, timeout: float) -> CommandResult:
        """Run the start script. The environment the started process inherits is the login's
        (over SSH, sshd's); LocalHost overrides this to give it a login-like one too."""
        return self._exec(command, timeout=timeout)

    def find_tracked(
        self,
        entries: Sequence[tuple[str, str, int | None]],
        logs: Sequence[str],
        timeout: float = 60.0,
    ) -> tuple[dict[int, tuple[int, int]], dict[int, list[tuple[int, int]]]]:
        """Which of the processes :meth:`start_tracked` started still run, and every live
        process holding one of ``logs`` open, in one command.

        ``entries``: ``(pid_file, log_file, pid)``, with ``pid`` None to read the pid file. A
        process counts only while it has ``log_file`` (or its ``.prev``) open as stdout, so a
        reused pid is never taken for ours. ``logs``: a started process's children inherit its
        log, so they are found by it (stdout or stderr, or its ``.prev``) even when their leader
        died. Returns ``({index in entries: (pid, start_time)},
        {index in logs: [(pid, pgid), ...]})``."""
        if not entries and not logs:
            return {}, {}
        calls = [
            f"_find {i} {sh_quote_path(pidf)} {sh_quote_path(logf)} "
            + ("''" if pid is None else str(check_pid(pid)))
            for i, (pidf, logf, pid) in enumerate(entries)
        ]
        calls += [
            f"_holders {sh_quote_path(logf)} | sed 's/^/h{i} /'" for i, logf in enumerate(logs)
        ]
        command = "\n".join([script("proc.sh"), script("find.sh"), *calls, "true"])
        res = self._exec(command, timeout=timeout)
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
        unrelated process, detected by ``start_time`` from :meth:`start_tracked`, or, with
        ``log_file``, a live group none of whose members holds that log), ``True``
        when something was stopped. If ``pid`` is alive but not a group leader, only that
        process is signalled. A group whose leader is dead is stopped too (an engine's
        workers outlive a killed API server): with ``log_file``, only while one of its
        members still has that log open (proof the group is the one we started); without,
        by its id alone. Raises ProcessSurvived if the group survives SIGKILL.
        """
        pid = check_pid(pid)
        command = with_args(
            "stop.sh",
            str(pid),
            "''" if start_time is None else str(int(start_time)),
            str(max(0, math.ceil(grace * 100))),
            "''" if log_file is None else sh_quote_path(log_file),
            libs=("proc.sh",),
        )
        res = self._exec(command, timeout=grace + 60)
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

    def is_alive(self, pid: int, start_time: int | None = None) -> bool:
        """True if ``pid`` is running (zombies count as dead) and, when ``start_time`` is
        given, is still the same process (not a reused pid)."""
        st = self._proc_stat(pid)
        if st is None or st[0] in ("Z", "X", "x"):
            return False
        return start_time is None or int(st[19]) == int(start_time)

    def _proc_stat(self, pid: int) -> list[str] | None:
        """Fields 3.. of /proc/PID/stat (index 0 = state), or None if no such process."""
        pid = check_pid(pid)
        res = self._exec(script("proc.sh") + f"\n_stat {pid} || true", timeout=60)
        fields = res.stdout.split()
        return fields if len(fields) >= 20 else None
