"""How to reach SSH hosts, decided once per command and passed down whole (launch, check, CLI)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, replace


def _expand(path: str | os.PathLike | None) -> str | None:
    return os.path.expanduser(os.fspath(path)) if path else None


@dataclass(frozen=True)
class ConnectOptions:
    """``accept_new_host_keys``: record unknown host keys instead of refusing them;
    ``known_hosts``: an extra known_hosts file (new keys are recorded there);
    ``ssh_config``: replaces ~/.ssh/config (like ``ssh -F``)."""

    accept_new_host_keys: bool = False
    known_hosts: str | None = None
    ssh_config: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "known_hosts", _expand(self.known_hosts))
        object.__setattr__(self, "ssh_config", _expand(self.ssh_config))

    def or_recorded(self, known_hosts: str | None, ssh_config: str | None) -> ConnectOptions:
        """These options, with the files a deployment was started with filling the gaps: a
        later command must reach the hosts the way `up` did. A file the record names is data,
        not an instruction: one someone else can change (an ssh_config's ProxyCommand runs a
        program) is refused, as OpenSSH refuses a config with bad owner or permissions; one
        that is gone is left out (the defaults then apply, and a host they cannot reach keeps
        its record)."""
        return replace(
            self,
            known_hosts=self.known_hosts or _recorded_file(known_hosts, "known_hosts"),
            ssh_config=self.ssh_config or _recorded_file(ssh_config, "ssh_config"),
        )


def _recorded_file(path: str | None, what: str) -> str | None:
    if not path:
        return None
    # Here, not at the top: `validate` imports these options and nothing else of hosts.
    from pdlaunch.hosts.errors import UnsafePathError

    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafePathError(f"the record's {what} {path!r} cannot be read: {exc}") from None
    mine = info.st_uid in (os.getuid(), 0)
    if not stat.S_ISREG(info.st_mode) or not mine or info.st_mode & 0o022:
        raise UnsafePathError(
            f"the record names {what} {path!r}, which is not a regular file that only you (or "
            f"root) can change; give --{what.replace('_', '-')} to use it, or fix its owner "
            "and mode"
        )
    return path
