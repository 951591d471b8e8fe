"""SshHost: a remote host over SSH (fabric/paramiko).

Connection setup goes through ``fabric.Connection`` so ``~/.ssh/config`` (Host aliases,
HostName, User, Port, IdentityFile, ProxyCommand), ssh-agent and default keys work as with
``ssh``. ProxyJump chains (from ``SshSettings.jump`` or ssh_config) are built here so that every
hop gets the same host-key policy, keys and timeouts. Commands then run on raw paramiko
channels (one per command, concurrently over the one connection).

Host keys (:mod:`.host_keys`): unlike fabric's default (auto-add), unknown keys are REFUSED unless
``accept_new_host_keys`` is set, in which case they are accepted and appended to the known_hosts
file in use. A key that differs from a recorded one is always refused.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko
from fabric import Config, Connection
from fabric.util import get_local_user

from .errors import (
    CommandTimeout,
    HostAuthError,
    HostConnectionError,
    HostError,
    HostKeyError,
)
from .host import Host
from .host_keys import (
    SYSTEM_KNOWN_HOSTS,
    USER_KNOWN_HOSTS,
    HostKeyPolicy,
    UnknownHostKey,
    display_name,
    fingerprint,
    known_host_keys,
    split_paths,
)
from .shell import with_args
from .transport import CommandResult

log = logging.getLogger("pdlaunch.hosts")
# paramiko logs handshake failures at ERROR from its transport thread; we report them as
# HostError. Without any handler configured, Python would print them on stderr (lastResort).
logging.getLogger("paramiko").addHandler(logging.NullHandler())

MAX_PARALLEL_COMMANDS = 8  # sshd's MaxSessions defaults to 10 channels per connection


@dataclass(frozen=True)
class SshSettings:
    """How to reach a host over SSH. ``None`` means "from ~/.ssh/config, else the default".

    ``port``: None -> ssh_config ``Port`` -> 22. ``user``: None -> ssh_config ``User`` -> local
    user. ``key_file``: used in addition to ssh_config ``IdentityFile``, ssh-agent and default
    keys, unless ``identities_only``, which turns agent and default keys off (like
    ``IdentitiesOnly yes``). ``jump``: ProxyJump spec ``[user@]host[:port][,...]`` (overrides
    ssh_config's ProxyJump). ``connect_timeout`` covers TCP connect, banner, auth and channel
    opens.
    """

    user: str | None = None
    port: int | None = None
    key_file: str | None = None
    connect_timeout: float = 10.0
    jump: str | None = None
    identities_only: bool = False


def _nodelay_transport(sock, **kwargs) -> paramiko.Transport:
    """paramiko's Transport on a socket with Nagle off. SSH sends many small packets that
    wait for each other (channel open, exec, window adjust, EOF): with Nagle on, each waits
    for the peer's delayed ACK, up to 40 ms per command (measured ~48 ms vs ~5 ms per command
    on a veth bridge). Set before the handshake, so key exchange and auth gain too. Through a
    jump host ``sock`` is a channel of the hop's transport (whose own socket was set here);
    through a ProxyCommand it is a pipe: neither has a TCP option to set."""
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return paramiko.Transport(sock, **kwargs)


class SshHost(Host):
    """A remote host. Connects lazily (or with :meth:`connect`), reconnects if the connection
    dropped, and is safe to share between threads (one connection, one channel per command)."""

    def __init__(
        self,
        address: str,
        settings: SshSettings | None = None,
        *,
        accept_new_host_keys: bool = False,
        known_hosts: str | os.PathLike | None = None,
        ssh_config_file: str | os.PathLike | None = None,
    ):
        super().__init__(address)
        self.settings = settings or SshSettings()
        self.accept_new_host_keys = accept_new_host_keys
        self.known_hosts = Path(os.path.expanduser(known_hosts)) if known_hosts else None
        self.ssh_config_file = ssh_config_file
        self.label = address  # user@host:port once resolved
        self._lock = threading.RLock()
        self._conn: Connection | None = None
        self._hops: list[Connection] = []
        self._slots = threading.BoundedSemaphore(MAX_PARALLEL_COMMANDS)

    # -- connection ----------------------------------------------------------------------------
    def connect(self) -> None:
        """Open the connection now (raises HostConnectionError & co.); no-op if connected."""
        self._transport()

    @property
    def is_connected(self) -> bool:
        conn = self._conn
        return conn is not None and conn.is_connected

    def close(self) -> None:
        super().close()
        with self._lock:
            self._disconnect()

    def _disconnect(self) -> None:
        for conn in [self._conn, *reversed(self._hops)]:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.client.close()
        self._conn = None
        self._hops = []

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            conn = self._conn
            if conn is None or not conn.is_connected:
                self._disconnect()
                self._connect()
                conn = self._conn
            return conn.transport

    def _fabric_config(self) -> Config:
        kwargs = {}
        if self.ssh_config_file is not None:
            path = os.path.expanduser(os.fspath(self.ssh_config_file))
            if not os.path.exists(path):
                raise HostConnectionError(f"ssh config file not found: {path}", host=self.name)
            kwargs["runtime_ssh_path"] = path
        try:
            return Config(**kwargs)
        except Exception as e:  # malformed ssh_config etc.
            raise HostConnectionError(f"cannot load ssh config: {e}", host=self.name) from e

    def _connect_kwargs(self) -> dict:
        s = self.settings
        t = float(s.connect_timeout)
        kw: dict = {
            "timeout": t,
            "banner_timeout": t,
            "auth_timeout": t,
            "channel_timeout": t,
            "transport_factory": _nodelay_transport,
        }
        if s.key_file:
            key = os.path.expanduser(s.key_file)
            if not os.path.isfile(key):
                raise HostAuthError(f"ssh {self.name}: key file not found: {key}", host=self.name)
            kw["key_filename"] = [key]
        if s.identities_only:
            kw["allow_agent"] = False
            kw["look_for_keys"] = False
        return kw

    def _make_conn(
        self,
        cfg: Config,
        target: str,
        *,
        user: str | None = None,
        port: int | None = None,
        jump: str | None = None,
        depth: int = 0,
    ) -> Connection:
        """A fabric Connection to ``target`` with our policy; gateways for its ProxyJump chain
        are created first and appended to ``self._hops`` in the order they must be opened."""
        if depth > 8:
            raise HostConnectionError(f"ssh {self.name}: ProxyJump chain too long (loop?)")
        from fabric.connection import derive_shorthand

        def endpoint(spec: str, port: int | None = None) -> tuple[str, int]:
            short = derive_shorthand(spec)
            found = cfg.base_ssh_config.lookup(short["host"])
            port = port or short["port"] or found.get("port") or 22
            return found.get("hostname", short["host"]), int(port)

        short = derive_shorthand(target)
        ssh_cfg = cfg.base_ssh_config.lookup(short["host"])  # one lookup: O(stanzas) each
        me = (
            ssh_cfg.get("hostname", short["host"]),
            int(port or short["port"] or ssh_cfg.get("port") or 22),
        )
        spec = jump if jump is not None else ssh_cfg.get("proxyjump")
        gateway: Connection | bool | None = None  # None: let fabric apply ProxyCommand, if any
        if spec and spec.strip().lower() == "none":
            gateway = False
        elif spec:
            prev: Connection | None = None
            for hop in (h.strip() for h in spec.split(",") if h.strip()):
                if prev is None and endpoint(hop) == me:
                    continue  # "Host * / ProxyJump bastion" applied to bastion itself
                if prev is None:
                    prev = self._make_conn(cfg, hop, depth=depth + 1)
                else:
                    prev = self._new_connection(cfg, hop, gateway=prev)
                self._hops.append(prev)
            gateway = prev if prev is not None else False
        return self._new_connection(cfg, target, user=user, port=port, gateway=gateway)

    def _new_connection(self, cfg, target, *, user=None, port=None, gateway=None) -> Connection:
        conn = Connection(
            target,
            user=user,
            port=port,
            config=cfg,
            gateway=gateway,
            connect_kwargs=self._connect_kwargs(),
        )
        conn.connect_timeout = None  # ours is in connect_kwargs (fabric would int() it)
        self._setup_host_keys(conn)
        return conn

    def _setup_host_keys(self, conn: Connection) -> None:
        client = conn.client
        sc = conn.ssh_config
        user_files = split_paths(sc.get("userknownhostsfile")) or [
            os.path.expanduser(p) for p in USER_KNOWN_HOSTS
        ]
        files = [*(split_paths(sc.get("globalknownhostsfile")) or SYSTEM_KNOWN_HOSTS), *user_files]
        if self.known_hosts is not None:
            files.append(str(self.known_hosts))
        # Shared, read-only: paramiko looks keys up there; keys accepted now go to the
        # client's own set (and the file, which a later connection then parses anew).
        client._system_host_keys = known_host_keys(files)
        record_to = self.known_hosts or Path(user_files[0])
        client.set_missing_host_key_policy(HostKeyPolicy(self.accept_new_host_keys, record_to))

    def _connect(self) -> None:
        cfg = self._fabric_config()
        s = self.settings
        self._hops = []
        conn = self._make_conn(cfg, self.name, user=s.user, port=s.port, jump=s.jump)
        self.label = _label(conn)
        for hop in self._hops:
            self._open(hop, role=f" (jump host for {self.label})")
        self._open(conn, role="")
        conn.transport.set_keepalive(30)
        self._conn = conn

    def _open(self, conn: Connection, role: str) -> None:
        if conn.is_connected:
            return
        try:
            conn.open()
        except Exception as e:
            # A handshake failure in paramiko's transport thread (e.g. no banner) often surfaces
            # as a vague "No existing session" here: report the transport's own error instead.
            transport = conn.client.get_transport()
            cause = getattr(transport, "saved_exception", None) if transport else None
            with contextlib.suppress(Exception):
                conn.client.close()
            if cause is not None and type(e) is paramiko.SSHException:
                e = cause
            mapped = self._map_error(e, conn, role)
            if mapped is None:
                raise
            raise mapped from e

    def _map_error(self, e: Exception, conn: Connection, role: str) -> HostError | None:
        where = f"ssh {_label(conn)}{role}"
        t = self.settings.connect_timeout
        if isinstance(e, UnknownHostKey):
            return HostKeyError(
                f"unknown host key for {display_name(e.hostname)}{role} "
                f"({e.key.get_name()} {fingerprint(e.key)}); refusing to connect "
                "(use --accept-new-host-keys to trust and record it)",
                host=self.name,
            )
        if isinstance(e, paramiko.BadHostKeyException):
            name = conn.host if int(conn.port) == 22 else f"[{conn.host}]:{conn.port}"
            return HostKeyError(
                f"host key for {conn.host}:{conn.port}{role} has CHANGED: known_hosts has "
                f"{e.expected_key.get_name()} {fingerprint(e.expected_key)}, the server offers "
                f"{e.key.get_name()} {fingerprint(e.key)}. This may be a man-in-the-middle "
                "attack, or the host was reinstalled; refusing to connect. If the change is "
                f"expected, remove the old entry (ssh-keygen -R '{name}') and connect again",
                host=self.name,
                changed=True,
            )
        if isinstance(e, paramiko.AuthenticationException) or (
            isinstance(e, paramiko.SSHException) and "No authentication methods" in str(e)
        ):
            keys = conn.connect_kwargs.get("key_filename") or []
            how = []
            if keys:
                how.append("key " + ", ".join(keys))
            if conn.connect_kwargs.get("allow_agent", True):
                how.append("ssh-agent")
            if conn.connect_kwargs.get("look_for_keys", True):
                how.append("default keys (~/.ssh/id_*)")
            return HostAuthError(
                f"{where}: authentication failed for user {conn.user} with "
                f"{' / '.join(how) or 'no keys at all'}",
                host=self.name,
            )
        if isinstance(e, paramiko.ChannelException):
            return HostConnectionError(
                f"{where}: jump host could not open a connection to {conn.host}:{conn.port}: "
                f"{e.text}",
                host=self.name,
            )
        if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
            codes = {err.errno for err in e.errors.values()}
            what = "connection refused" if codes == {errno.ECONNREFUSED} else "host unreachable"
            return HostConnectionError(f"{where}: {what}", host=self.name)
        if isinstance(e, socket.gaierror):
            return HostConnectionError(
                f"{where}: cannot resolve host name {conn.host!r}", host=self.name
            )
        if isinstance(e, TimeoutError):
            return HostConnectionError(
                f"{where}: connection timed out after {t:g}s", host=self.name
            )
        if isinstance(e, paramiko.SSHException) and "No existing session" in str(e):
            # paramiko's start_client() gives up silently on its timeout; auth then fails so.
            return HostConnectionError(
                f"{where}: SSH handshake did not complete within {t:g}s "
                "(is an SSH server listening on that port?)",
                host=self.name,
            )
        if isinstance(e, paramiko.SSHException):
            msg = str(e)
            if "banner" in msg.lower():
                msg += " (is an SSH server listening on that port?)"
            return HostConnectionError(f"{where}: {msg}", host=self.name)
        if isinstance(e, EOFError):
            return HostConnectionError(
                f"{where}: connection closed by the server during the handshake", host=self.name
            )
        if isinstance(e, OSError):
            return HostConnectionError(f"{where}: {e.strerror or e}", host=self.name)
        return None

    # -- commands ------------------------------------------------------------------------------
    def _channel(self) -> paramiko.Channel:
        t = self.settings.connect_timeout
        try:
            return self._transport().open_session(timeout=t)
        except paramiko.ChannelException as e:
            raise HostError(
                f"ssh {self.label}: cannot open a channel: {e.text}", host=self.name
            ) from e
        except (paramiko.SSHException, EOFError, OSError):
            # The connection died since we last used it: reconnect once.
            with self._lock:
                self._disconnect()
            try:
                return self._transport().open_session(timeout=t)
            except (paramiko.SSHException, EOFError, OSError) as e:
                raise HostConnectionError(
                    f"ssh {self.label}: cannot open a channel: {e}", host=self.name
                ) from e

    def _exec(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        if timeout is None:
            remote = "exec /bin/sh -c " + shlex.quote(command)
            deadline = None
        else:
            # `timeout` kills the command's whole process group on the host; our own deadline
            # (a bit later) covers a hung host or network.
            remote = f"exec timeout -k 5 {timeout:.3f} /bin/sh -c " + shlex.quote(command)
            deadline = time.monotonic() + timeout + 10
        started = time.monotonic()
        with self._slots:
            chan = self._channel()
            try:
                out, err, rc = self._communicate(chan, remote, stdin, deadline)
            except (paramiko.SSHException, EOFError, OSError) as e:
                raise HostConnectionError(
                    f"ssh {self.label}: connection lost while running a command: {e}",
                    host=self.name,
                ) from e
            finally:
                chan.close()
        if rc is None or (
            timeout is not None and rc == 124 and time.monotonic() - started >= timeout * 0.95
        ):
            raise CommandTimeout(
                f"{self.name}: command timed out after {timeout:g}s: {command[:120]}",
                host=self.name,
            )
        return CommandResult(
            rc=rc,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
        )

    @staticmethod
    def _communicate(chan, remote, stdin, deadline) -> tuple[bytes, bytes, int | None]:
        """Run; returns (stdout, stderr, rc), rc None when ``deadline`` passed."""
        chan.exec_command(remote)
        if stdin:
            with contextlib.suppress(OSError, EOFError):
                chan.sendall(stdin)
        with contextlib.suppress(OSError, EOFError):
            chan.shutdown_write()
        out, err = bytearray(), bytearray()
        fd = chan.fileno()

        def drain() -> None:
            while chan.recv_ready():
                out.extend(chan.recv(65536))
            while chan.recv_stderr_ready():
                err.extend(chan.recv_stderr(65536))

        while True:
            drain()
            if chan.eof_received or chan.closed:
                break
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait <= 0:
                return bytes(out), bytes(err), None
            select.select([fd], [], [], wait)
        # All output is in; the exit status follows.
        while not chan.exit_status_ready():
            if chan.closed and not chan.exit_status_ready():
                break
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait <= 0:
                return bytes(out), bytes(err), None
            chan.status_event.wait(wait)
        drain()
        if not chan.exit_status_ready():
            raise EOFError("channel closed without an exit status")
        return bytes(out), bytes(err), chan.recv_exit_status()

    def _open_stream(self, command: str) -> _SshStream:
        chan = self._channel()
        try:
            chan.exec_command("exec /bin/sh -c " + shlex.quote(command))
            chan.shutdown_write()
        except (paramiko.SSHException, EOFError, OSError) as e:
            chan.close()
            raise HostConnectionError(f"ssh {self.label}: {e}", host=self.name) from e
        return _SshStream(self, chan)


class _SshStream:
    def __init__(self, host: SshHost, chan: paramiko.Channel):
        self.host = host
        self.chan = chan
        self.pid: int | None = None
        self._closed = False

    def read(self, timeout: float) -> bytes | None:
        if self._closed:
            return None
        try:
            self.chan.settimeout(timeout)
            data = self.chan.recv(65536)
        except TimeoutError:
            return b""
        except (paramiko.SSHException, EOFError, OSError):
            return None
        return data or None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.chan.close()
        # Closing the channel does not stop a quiet `tail -F` on the host (no SIGPIPE until
        # it writes): kill it, if it is still the tail we started (sh/stop-tail.sh).
        if self.pid and self.host.is_connected:
            with contextlib.suppress(HostError):
                self.host._exec(with_args("stop-tail.sh", str(int(self.pid))), timeout=30)


def _label(conn: Connection) -> str:
    return f"{conn.user or get_local_user()}@{conn.host}:{conn.port}"
