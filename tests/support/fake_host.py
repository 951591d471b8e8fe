"""A scripted world of hosts for unit tests of launch's decisions (issue 11).

``FakeHost`` overrides the high-level :class:`~pdlaunch.hosts.Host` methods launch calls
(``run``, ``put_files``, ``start_tracked``, ``find_tracked``, ``stop``, ``is_alive``,
``read_log``) and acts on a :class:`FakeWorld`: processes
with a pid, a start time, an alive flag, the host they run on, the pid file naming them and the
log file they hold open. The shell scripts behind those methods are covered by the sshd and
local suites; here only what launch *decides* is under test, so every call is recorded in
order (``world.calls``) and any of them can be made to fail or hang.

    world = FakeWorld()
    world.fail("10.0.0.2", "start_tracked", name="decode-0")
    up(plan, opts, opener=world.opener)
"""

from __future__ import annotations

import posixpath
import shlex
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pdlaunch.hosts import (
    CommandResult,
    CommandTimeout,
    Host,
    HostConnectionError,
    HostError,
    Started,
    Upload,
)
from pdlaunch.observe import health
from pdlaunch.plan.build import Plan


@dataclass
class FakeProcess:
    pid: int
    start_time: int
    host: str
    name: str  # the pid file's stem: what launch calls the process
    pid_file: str
    log_file: str  # the file it holds open as stdout (follows a rename, like an fd)
    alive: bool = True
    healthy: bool = False


@dataclass
class _Rule:
    host: str | None
    method: str
    name: str | None
    error: BaseException
    times: int | None  # None: every time


@dataclass
class FakeWorld:
    """Every host's files and processes, the calls made on them, and scripted failures.

    ``auto_healthy``: a started process answers its health URL at once (otherwise only after
    :meth:`make_healthy`). ``dies_at_start``: names whose process exits right after it starts
    (an engine that crashes during load)."""

    auto_healthy: bool = True
    dies_at_start: set[str] = field(default_factory=set)
    processes: list[FakeProcess] = field(default_factory=list)
    files: dict[tuple[str, str], tuple[bytes, int]] = field(default_factory=dict)
    logs: dict[tuple[str, str], str] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    health_urls: dict[str, str] = field(default_factory=dict)  # name -> URL
    next_pid: int = 1000  # the clock of pids: every process gets a new one
    next_start_time: int = 500_000
    _rules: list[_Rule] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    # -- set-up ---------------------------------------------------------------------------------
    def learn(self, plan: Plan) -> FakeWorld:
        """Which health URL belongs to which process (what the probe answers from)."""
        for p in plan.processes:
            if p.health_url:
                self.health_urls[p.name] = p.health_url
        return self

    def fail(
        self,
        host: str | None,
        method: str,
        *,
        error: BaseException | None = None,
        name: str | None = None,
        times: int | None = None,
    ) -> None:
        """Make ``method`` on ``host`` (None: any host) raise ``error``; ``name``: only for
        that process (start/stop/is_alive by the process); ``times``:
        only the next N matching calls. ``method="open"`` fails the connection (the opener
        raises; default error: connection refused)."""
        if error is None:
            where = host or "host"
            error = (
                HostConnectionError(f"ssh {where}: connection refused", host=host)
                if method == "open"
                else HostError(f"{where}: {method} failed (scripted)", host=host)
            )
        with self._lock:
            self._rules.append(_Rule(host, method, name, error, times))

    def hang(
        self, host: str | None, method: str, *, name: str | None = None, times: int | None = None
    ) -> None:
        """``method`` runs past its timeout, as a host that accepted the login and then stopped
        answering (the message is SshHost's)."""
        where = host or "host"
        self.fail(
            host,
            method,
            name=name,
            error=CommandTimeout(f"{where}: command timed out after 60s: {method}", host=host),
            times=times,
        )

    def clear_failures(self) -> None:
        with self._lock:
            self._rules.clear()

    def spawn(
        self, host: str, pid_file: str, log_file: str, *, healthy: bool = True
    ) -> FakeProcess:
        """A process started outside this test's `up` (an earlier run, another control host):
        writes its pid file, as start_tracked's script does."""
        with self._lock:
            proc = FakeProcess(
                pid=self.next_pid,
                start_time=self.next_start_time,
                host=host,
                name=_stem(pid_file),
                pid_file=pid_file,
                log_file=log_file,
                healthy=healthy,
            )
            self.next_pid += 1
            self.next_start_time += 7
            self.processes.append(proc)
            self.files[(host, pid_file)] = (f"{proc.pid}\n".encode(), 0o644)
            return proc

    def make_healthy(self, name: str) -> None:
        with self._lock:
            for proc in self.processes:
                if proc.name == name and proc.alive:
                    proc.healthy = True

    def kill(self, name: str) -> None:
        """Every live process of that name dies (its pid file stays, as after a crash)."""
        with self._lock:
            for proc in self.processes:
                if proc.name == name:
                    proc.alive = False

    # -- what tests read back -------------------------------------------------------------------
    def alive(self) -> list[FakeProcess]:
        with self._lock:
            return [p for p in self.processes if p.alive]

    def alive_names(self) -> list[str]:
        return sorted(p.name for p in self.alive())

    def by_pid(self, pid: int) -> FakeProcess | None:
        with self._lock:
            return next((p for p in self.processes if p.pid == pid), None)

    def calls_to(self, method: str) -> list[tuple[str, str]]:
        """(host, summary) of every call to ``method``, in order."""
        with self._lock:
            return [(h, s) for h, m, s in self.calls if m == method]

    def started(self) -> list[str]:
        """Names of the processes start_tracked was asked to start, in order."""
        return [s for _, s in self.calls_to("start_tracked")]

    def stopped(self) -> list[str]:
        """Names (``name#pid``) of the processes stop was asked to stop, in order."""
        return [s for _, s in self.calls_to("stop")]

    def paths(self, suffix: str = "") -> list[tuple[str, str]]:
        with self._lock:
            return sorted(k for k in self.files if k[1].endswith(suffix))

    # -- the health probe launch asks -------------------------------------------------------------
    def probe(self, url: str, timeout: float = 2.0) -> health.Probe:
        """Healthy iff a live process of the name behind ``url`` is marked healthy; no process
        there answers like a closed port."""
        with self._lock:
            names = {n for n, u in self.health_urls.items() if u == url}
            procs = [p for p in self.processes if p.name in names and p.alive]
            if any(p.healthy for p in procs):
                return health.Probe(True, 200)
            if procs:
                return health.Probe(False, 503)
            return health.Probe(False, None, "[Errno 111] Connection refused")

    # -- hosts ------------------------------------------------------------------------------------
    def opener(self, host: str, local: bool, ssh: dict[str, Any]) -> Host:
        """What ``opener=`` takes: the pool's way to connect to a host."""
        self._call(host, "open", "local" if local else "ssh")
        return FakeHost(self, host)

    def _call(self, host: str, method: str, summary: str, name: str | None = None) -> None:
        """Record a call, then raise what a matching rule says."""
        with self._lock:
            self.calls.append((host, method, summary))
            for rule in self._rules:
                if rule.method != method or rule.host not in (None, host):
                    continue
                if rule.name is not None and rule.name != name:
                    continue
                if rule.times is not None:
                    if rule.times <= 0:
                        continue
                    rule.times -= 1
                raise rule.error

    def _find(self, host: str, pid: int) -> FakeProcess | None:
        return next((p for p in self.processes if p.host == host and p.pid == pid), None)


def _stem(path: str) -> str:
    """``/w/run/decode-0.pid`` -> ``decode-0``; ``/w/run/decode-0.secrets.env`` ->
    ``decode-0``; ``/w/decode-0.sh`` -> ``decode-0``."""
    return posixpath.basename(path).split(".", 1)[0]


class FakeHost(Host):
    """One host of a :class:`FakeWorld`; runs no shell at all."""

    def __init__(self, world: FakeWorld, name: str):
        super().__init__(name)
        self.world = world

    # The primitives are never reached: every method launch uses is overridden, and a new one
    # that slips through must fail loudly rather than pass silently.
    def _exec(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        raise AssertionError(f"FakeHost runs no scripts: {command[:80]!r}")

    def _open_stream(self, command: str) -> Any:
        raise AssertionError(f"FakeHost runs no scripts: {command[:80]!r}")

    def run(self, command: str, timeout: float | None = None, check: bool = False) -> CommandResult:
        """Understands the one-liners launch sends: ``rm -f -- PATHS`` and ``mv -f -- A B``
        (a process holding A keeps writing to it under B)."""
        w = self.world
        w._call(self.name, "run", " ".join(command.split())[:120])
        with w._lock:
            for words in _commands(command):
                if words[:3] == ["rm", "-f", "--"]:
                    for path in words[3:]:
                        w.files.pop((self.name, path), None)
                elif words[:3] == ["mv", "-f", "--"] and len(words) == 5:
                    src, dst = words[3], words[4]
                    for proc in w.processes:
                        if proc.host == self.name and proc.log_file == src:
                            proc.log_file = dst
                    if (self.name, src) in w.logs:
                        w.logs[(self.name, dst)] = w.logs.pop((self.name, src))
        return CommandResult(0, "", "")

    def put_files(
        self,
        files: Sequence[Upload],
        *,
        private_dirs: Sequence[str] = (),
        keep_previous: Sequence[str] = (),
        timeout: float = 300.0,
    ) -> None:
        """One call, like the one command of the real one; a log kept as .prev is followed by
        the process holding it (as an open fd would be)."""
        w = self.world
        w._call(self.name, "put_files", " ".join(f.path for f in files))
        with w._lock:
            for path in keep_previous:
                for proc in w.processes:
                    if proc.host == self.name and proc.log_file == path:
                        proc.log_file = path + ".prev"
                if (self.name, path) in w.logs:
                    w.logs[(self.name, path + ".prev")] = w.logs.pop((self.name, path))
            for f in files:
                data = f.source if isinstance(f.source, bytes) else str(f.source).encode()
                w.files[(self.name, f.path)] = (data, f.mode)

    def start_tracked(
        self,
        command: str | Sequence[str],
        *,
        pid_file: str,
        log_file: str,
        cwd: str | None = None,
        timeout: float = 60.0,
    ) -> Started:
        w = self.world
        name = _stem(pid_file)
        w._call(self.name, "start_tracked", name, name=name)
        proc = w.spawn(self.name, pid_file, log_file, healthy=w.auto_healthy)
        if name in w.dies_at_start:
            proc.alive = False
        return Started(proc.pid, proc.start_time if proc.alive else None)

    def _started(
        self, entries: Sequence[tuple[str, str, int | None]]
    ) -> dict[int, tuple[int, int]]:
        """As the real find_tracked: a pid (recorded, or read from the pid file) counts only
        while it runs with the log file (or its ``.prev``) open."""
        w = self.world
        w._call(self.name, "find_tracked", f"{len(entries)} entries")
        found: dict[int, tuple[int, int]] = {}
        with w._lock:
            for i, (pid_file, log_file, pid) in enumerate(entries):
                if pid is None:
                    text = w.files.get((self.name, pid_file), (b"", 0))[0].decode().strip()
                    if not text.isdigit():
                        continue
                    pid = int(text)
                proc = w._find(self.name, pid)
                if proc and proc.alive and proc.log_file in (log_file, log_file + ".prev"):
                    found[i] = (proc.pid, proc.start_time)
        return found

    def find_tracked(
        self,
        entries: Sequence[tuple[str, str, int | None]],
        logs: Sequence[str],
        timeout: float = 60.0,
    ) -> tuple[dict[int, tuple[int, int]], dict[int, list[tuple[int, int]]]]:
        """As the real one: the started processes that still run, and per log the live
        processes holding it (each fake process leads its own group)."""
        found = self._started(entries)
        holders: dict[int, list[tuple[int, int]]] = {}
        with self.world._lock:
            for i, log_file in enumerate(logs):
                for proc in self.world.processes:
                    if (
                        proc.host == self.name
                        and proc.alive
                        and proc.log_file in (log_file, log_file + ".prev")
                    ):
                        holders.setdefault(i, []).append((proc.pid, proc.pid))
        return found, holders

    def stop(
        self,
        pid: int,
        *,
        grace: float = 10.0,
        start_time: int | None = None,
        log_file: str | None = None,
    ) -> bool:
        w = self.world
        with w._lock:
            proc = w._find(self.name, pid)
        name = proc.name if proc else "?"
        w._call(self.name, "stop", f"{name}#{pid}", name=name)
        with w._lock:
            if proc is None or not proc.alive:
                return False
            if start_time is not None and proc.start_time != start_time:
                return False  # a reused pid: not ours
            proc.alive = False
            return True

    def is_alive(self, pid: int, start_time: int | None = None) -> bool:
        w = self.world
        with w._lock:
            proc = w._find(self.name, pid)
        name = proc.name if proc else "?"
        w._call(self.name, "is_alive", f"{name}#{pid}", name=name)
        if proc is None or not proc.alive:
            return False
        return start_time is None or proc.start_time == start_time

    def read_log(self, path: str, lines: int = 50) -> str:
        self.world._call(self.name, "read_log", path, name=_stem(path))
        with self.world._lock:
            text = self.world.logs.get((self.name, path), "")
        return "".join(text.splitlines(keepends=True)[-lines:])


def _commands(command: str) -> list[list[str]]:
    """The simple commands of a shell line, split at ``;``, ``&&``, ``||`` (enough for the
    one-liners launch builds; anything else is just recorded)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for tok in lexer:
        if tok in (";", "&&", "||", "&", "|"):
            out.append([])
        elif tok in ("then", "else", "do") and not out[-1]:
            continue
        else:
            out[-1].append(tok)
    return [c for c in out if c]
