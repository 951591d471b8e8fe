"""How to reach SSH hosts, decided once per command and passed down whole (launch, check, CLI)."""

from __future__ import annotations

import os
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
        later command must reach the hosts the way `up` did."""
        return replace(
            self,
            known_hosts=self.known_hosts or known_hosts,
            ssh_config=self.ssh_config or ssh_config,
        )
