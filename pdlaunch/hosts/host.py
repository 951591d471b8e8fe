"""The host interface: the only code in pdlaunch that runs commands.

A :class:`Host` is its transport (:mod:`.transport`: run a command, write files; implemented
by :class:`~.local.LocalHost` and :class:`~.ssh.SshHost`), process control on top of it
(:mod:`.processes`: start detached, find, is-alive, stop and prove gone) and log reading
(:mod:`.logs`: read, follow). The sh they send is in ``sh/`` (:mod:`.shell`).
"""

from __future__ import annotations

from .logs import LogReading
from .processes import ProcessControl


class Host(ProcessControl, LogReading):
    """A machine pdlaunch runs commands on. Safe to use from several threads."""

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
