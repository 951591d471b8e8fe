"""Opening a host by the address the topology writes: a LocalHost for this machine, else an
SshHost (connected right away). The pool (:mod:`.pool`) opens its hosts here."""

from __future__ import annotations

import os
from dataclasses import replace

from pdlaunch.spec.addresses import is_local_control_host

from .host import Host
from .local import LocalHost
from .ssh import SshHost, SshSettings

# One notion of "needs no SSH" for the hosts layer and the plan (pdlaunch/spec/addresses.py).
is_local_address = is_local_control_host


def open_host(
    address: str,
    *,
    ssh: SshSettings | None = None,
    force_ssh: bool = False,
    accept_new_host_keys: bool = False,
    known_hosts: str | os.PathLike | None = None,
    connect_timeout: float | None = None,
    ssh_config_file: str | os.PathLike | None = None,
    connect: bool = True,
) -> Host:
    """A Host for ``address`` (as written in the topology).

    127.0.0.1 / localhost / ::1 give a LocalHost unless ``force_ssh``. Otherwise an SshHost,
    connected right away when ``connect`` (so unreachable hosts, auth and host-key problems
    raise HostConnectionError/HostAuthError/HostKeyError here). ``known_hosts``: an extra
    known_hosts file, loaded in addition to the system and user ones and, with
    ``accept_new_host_keys``, the one new keys are recorded in (default: ~/.ssh/known_hosts or
    ssh_config's UserKnownHostsFile). ``connect_timeout`` overrides ``ssh.connect_timeout``.
    ``ssh_config_file`` replaces ~/.ssh/config and /etc/ssh/ssh_config (like ``ssh -F``).
    """
    if not force_ssh and is_local_address(address):
        return LocalHost(address)
    settings = ssh or SshSettings()
    if connect_timeout is not None:
        settings = replace(settings, connect_timeout=connect_timeout)
    host = SshHost(
        address,
        settings,
        accept_new_host_keys=accept_new_host_keys,
        known_hosts=known_hosts,
        ssh_config_file=ssh_config_file,
    )
    if connect:
        host.connect()
    return host
