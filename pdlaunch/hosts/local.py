"""LocalHost: the control host itself (127.0.0.1 / localhost / ::1), via subprocess."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time

from .errors import CommandTimeout, HostError
from .host import Host
from .processes import check_pid
from .transport import CommandResult

SHELL = "/bin/sh"

# What a login gives a process (sshd passes about these): a process started here must not
# inherit pdlaunch's own environment (a secret exported for other engines, tokens, ...), so
# that a local host behaves like a remote one. PATH stays: it is how the user found `vllm`.
LOGIN_ENV = ("HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")


def login_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in LOGIN_ENV if k in os.environ}
    env.setdefault("HOME", _home())
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    return env


def _home() -> str:
    return os.path.expanduser("~")


def _cwd() -> str:
    home = _home()
    return home if os.path.isdir(home) else "/"


class LocalHost(Host):
    """Runs everything with subprocess on this machine.

    Like a login over SSH, commands run in the home directory and relative paths are relative to
    it, so a topology behaves the same whether a host is local or remote.
    """

    def __init__(self, name: str = "localhost"):
        super().__init__(name)

    def _exec_start(self, script: str, timeout: float) -> CommandResult:
        return self._exec(script, timeout=timeout, env=login_env())

    def _exec(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        try:
            proc = subprocess.Popen(
                [SHELL, "-c", command],
                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=_cwd(),
                env=env,
                start_new_session=True,  # so a timeout can kill the whole tree
            )
        except OSError as e:
            raise HostError(f"{self.name}: cannot run {SHELL}: {e}", host=self.name) from e
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=5)
            raise CommandTimeout(
                f"{self.name}: command timed out after {timeout:g}s: {command[:120]}",
                host=self.name,
            ) from None
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        return CommandResult(
            rc=proc.returncode,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
        )

    def _open_stream(self, command: str) -> _LocalStream:
        proc = subprocess.Popen(
            [SHELL, "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=_cwd(),
            start_new_session=True,
        )
        return _LocalStream(proc)

    # native fast path -------------------------------------------------------------------------
    def _proc_stat(self, pid: int) -> list[str] | None:
        pid = check_pid(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            return None
        fields = data[data.rfind(b")") + 1 :].decode().split()
        return fields if len(fields) >= 20 else None


class _LocalStream:
    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.pid: int | None = None
        self._fd = proc.stdout.fileno()
        self._reader: int | None = None
        self._eof = False

    def read(self, timeout: float) -> bytes | None:
        self._reader = threading.get_ident()
        if self._eof:
            return None
        try:
            ready, _, _ = select.select([self._fd], [], [], timeout)
            if not ready:
                return b""
            data = os.read(self._fd, 65536)
        except (OSError, ValueError):
            data = b""
        if not data:
            self._eof = True
            with contextlib.suppress(OSError):
                self.proc.stdout.close()
            return None
        return data

    def close(self) -> None:
        """Kill the command; the pipe is closed here only from the reading thread (another
        thread must not close an fd the reader may be selecting on)."""
        proc = self.proc
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 2
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._reader in (None, threading.get_ident()):
            self._eof = True
            with contextlib.suppress(OSError):
                proc.stdout.close()
