"""One connection per host for a whole command, opened in parallel and shared by threads.

Launch, check and the CLI reach hosts only through a :class:`HostPool` built from one
:class:`~pdlaunch.hosts.options.ConnectOptions`, so every command of a run (and every later
command on a recorded deployment) reaches a host the same way.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .errors import HostError
from .host import Host
from .local import LocalHost
from .opening import open_host
from .options import ConnectOptions
from .parallel import parallel
from .ssh import SshSettings

HostKey = tuple[str, bool, tuple]
Opener = Callable[[str, bool, dict[str, Any]], Host]


def ssh_settings(ssh: dict[str, Any] | Any) -> SshSettings:
    """SshSettings from a topology's ``ssh`` block (model or its dict, as recorded)."""
    d = ssh if isinstance(ssh, dict) else ssh.model_dump()
    return SshSettings(
        user=d.get("user"),
        port=d.get("port"),
        key_file=d.get("key"),
        connect_timeout=float(d.get("connect_timeout") or 10.0),
        jump=d.get("jump"),
    )


def host_key(host: str, local: bool, ssh: dict[str, Any]) -> HostKey:
    """Identity of a connection: the same address with other SSH settings is another one."""
    return (host, local, () if local else tuple(sorted(ssh.items())))


class HostPool:
    """Connected hosts keyed by :func:`host_key`; a host that failed to connect raises the same
    HostError again without a second attempt (one slow host must not cost its timeout twice)."""

    def __init__(
        self,
        options: ConnectOptions | None = None,
        *,
        opener: Opener | None = None,
    ):
        """``opener(host, local, ssh)``: how a host is opened (default: LocalHost or SSH);
        tests pass one that returns test doubles."""
        self.options = options or ConnectOptions()
        self._opener = opener
        self._hosts: dict[HostKey, Host] = {}
        self._failed: dict[HostKey, HostError] = {}
        self._key_locks: dict[HostKey, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, host: str, local: bool, ssh: dict[str, Any]) -> Host:
        key = host_key(host, local, ssh)
        with self._lock:
            h = self._hosts.get(key)
            if h is not None:
                return h
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                h = self._hosts.get(key)
                failed = self._failed.get(key)
            if h is not None:
                return h
            if failed is not None:
                raise failed
            try:
                if self._opener is not None:
                    h = self._opener(host, local, ssh)
                else:
                    h = LocalHost(host) if local else self._open_ssh(host, ssh)
            except HostError as exc:
                with self._lock:
                    self._failed[key] = exc
                raise
            with self._lock:
                self._hosts[key] = h
            return h

    def _open_ssh(self, host: str, ssh: dict[str, Any]) -> Host:
        o = self.options
        return open_host(
            host,
            ssh=ssh_settings(ssh),
            force_ssh=True,
            accept_new_host_keys=o.accept_new_host_keys,
            known_hosts=o.known_hosts,
            ssh_config_file=o.ssh_config,
        )

    def connect_all(self, targets: Iterable[tuple[str, bool, dict[str, Any]]]) -> dict[str, str]:
        """Connect to every target in parallel; returns {host: error message} for failures."""
        unique = {host_key(*t): t for t in targets}
        errors: dict[str, str] = {}

        def one(t: tuple[str, bool, dict[str, Any]]) -> None:
            try:
                self.get(*t)
            except HostError as exc:
                errors[t[0]] = str(exc)

        parallel(one, unique.values())
        return errors

    def close(self) -> None:
        with self._lock:
            hosts, self._hosts = list(self._hosts.values()), {}
        for h in hosts:
            with contextlib.suppress(Exception):
                h.close()

    def __enter__(self) -> HostPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
