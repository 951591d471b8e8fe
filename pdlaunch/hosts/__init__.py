"""Hosts layer: the only code in pdlaunch that runs commands (locally or over SSH).

    host = open_host("gpu-node-1", ssh=SshSettings(user="ubuntu", key_file="~/.ssh/id_ed25519"))
    host.put_files([Upload(a, "~/pdlaunch/a.sh", 0o755), Upload(b, "~/pdlaunch/b.env", 0o600)],
                   private_dirs=["~/pdlaunch"])  # many files, one round trip
    s = host.start_tracked("~/pdlaunch/run-prefill.sh", pid_file="~/pdlaunch/prefill.pid",
                           log_file="~/pdlaunch/prefill.log")
    s.pid, s.start_time                       # store both: the time guards against pid reuse
    host.is_alive(s.pid, s.start_time); host.read_log("~/pdlaunch/prefill.log", 50)
    host.stop(s.pid, grace=10, start_time=s.start_time)   # TERM the group, wait, KILL
    host.close()

All failures a user can cause (unreachable host, auth, host keys, failed command with
``check=True``) raise :class:`HostError` subclasses whose ``str()`` is a complete message.

Modules: ``transport`` (run a command, write files), ``local`` / ``ssh`` (its two
implementations; ``host_keys``: SSH's known_hosts and host-key policy), ``processes`` (start
detached, find, is-alive, stop and prove gone), ``logs`` (read, follow), ``host`` (the three
together: :class:`Host`), ``errors``, ``shell`` (quoting, and the sh scripts in ``sh/``),
``pool`` (one connection per host for a command), ``containers`` (a process's docker/podman
container).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdlaunch.spec.addresses import LOCAL_ADDRESSES

    from .errors import (
        CommandError,
        CommandTimeout,
        HostAuthError,
        HostConnectionError,
        HostError,
        HostKeyError,
        ProcessSurvived,
        UnsafePathError,
    )
    from .host import Host
    from .local import LocalHost
    from .logs import LogFollower
    from .opening import is_local_address, open_host
    from .options import ConnectOptions
    from .pool import HostPool, ssh_settings
    from .processes import Started
    from .shell import sh_quote_path
    from .ssh import SshHost, SshSettings, fingerprint
    from .transport import CommandResult, Content, Upload

# `parallel` is also the name of its module: bound here, as the import system would otherwise
# leave the submodule under that name once anything imports `pdlaunch.hosts.parallel`.
from .parallel import parallel

# Each public name and the module that defines it: imported when first asked for, so a command
# that never opens an SSH connection never imports paramiko (the CLI answers faster).
_WHERE = {
    "LOCAL_ADDRESSES": "pdlaunch.spec.addresses",
    "CommandError": ".errors",
    "CommandTimeout": ".errors",
    "HostAuthError": ".errors",
    "HostConnectionError": ".errors",
    "HostError": ".errors",
    "HostKeyError": ".errors",
    "ProcessSurvived": ".errors",
    "UnsafePathError": ".errors",
    "Host": ".host",
    "LocalHost": ".local",
    "LogFollower": ".logs",
    "is_local_address": ".opening",
    "open_host": ".opening",
    "ConnectOptions": ".options",
    "HostPool": ".pool",
    "ssh_settings": ".pool",
    "Started": ".processes",
    "sh_quote_path": ".shell",
    "SshHost": ".ssh",
    "SshSettings": ".ssh",
    "fingerprint": ".ssh",
    "CommandResult": ".transport",
    "Content": ".transport",
    "Upload": ".transport",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)


__all__ = [
    "LOCAL_ADDRESSES",
    "CommandError",
    "CommandResult",
    "CommandTimeout",
    "ConnectOptions",
    "Content",
    "Host",
    "HostAuthError",
    "HostConnectionError",
    "HostError",
    "HostKeyError",
    "HostPool",
    "LocalHost",
    "LogFollower",
    "ProcessSurvived",
    "SshHost",
    "SshSettings",
    "Started",
    "UnsafePathError",
    "Upload",
    "fingerprint",
    "is_local_address",
    "open_host",
    "parallel",
    "sh_quote_path",
    "ssh_settings",
]

